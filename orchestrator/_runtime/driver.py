"""The interpreter every machine driver shares: step, perform, report (D31).

Theory of operation. A machine's table decides; a driver performs. The loop is

    step(table, state, event, facts) -> Step(dest, effects)    # pure, the only decision
    for each effect: report = await effects[name]()             # performs one thing, reports
    event, facts = translate(effect, report)                    # the machine's own vocabulary

and :func:`run_table` is that loop, written once for every host that runs it: the anyio drivers
of one process (the operation run, the navigator) and the Temporal workflow's table flows. A host
is a :class:`TableHost`: it steps (journaling the step its own way), performs an effect (the slow
ones in flight, so that an interrupt can be stepped meanwhile), says which interrupt came, and
translates a report. An interrupt the table lists in the current state is stepped before the
row's remaining effects; its row's own stop effect settles the work in flight (D22).

:class:`Interpreter` is the anyio host's machine: the current state, the explicit effect table
(checked against the TOML when the interpreter is built, so a row naming an effect nobody
performs fails at once) and the observers that journal and trace every step. How its effects wait
on the event loop (a child task or the loop's own, start slots, what keeps a thousand sessions'
memory and lag low) is the scheduler layer's (:mod:`~orchestrator._runtime.scheduler`).

Nothing here reads a clock or makes an id; a host that is not anyio (a durable workflow) runs
the same :func:`~orchestrator._lifecycle.machine.step` and the same loop, with the effects as
activities.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from anyio.abc import TaskGroup

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.guards import EFFECTS, Facts
from orchestrator._lifecycle.machine import MachineDef, Step, step
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.scheduler import Scheduler, per_table
from orchestrator._runtime.scheduler import cancel_scope as cancel_scope  # outcomes.py


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What an effect reports: an outcome in the machine's vocabulary, never a state.

    Attributes:
        outcome: A :class:`~orchestrator._lifecycle.names.ReportOutcome`: ``ok``,
            ``transient``, ``overflow``, ``truncated``, ``empty``, ``fatal``, ``cancelled``,
            ``conflict``, ``failed``, or a hook's ``done`` / ``supplied`` ...
        retry_after: A provider's retry-after hint in seconds (``transient`` only).
        error: The failure as one line.
        data: Small facts for the journal (ids, model names).
    """

    outcome: ReportOutcome
    retry_after: float | None = None
    error: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


Effect = Callable[[], Awaitable[Report | None]]
StepObserver = Callable[[Step, Mapping[str, Any]], None]

NO_DATA: Mapping[str, Any] = MappingProxyType({})
"""The data of a step that carries none."""


class TableHost(Protocol):
    """What :func:`run_table` asks of a host: its own way to step, perform and translate."""

    async def step(self, event: str, facts: Facts, data: Mapping[str, Any]) -> tuple[str, ...]:
        """Take one step (and journal it); the row's effects."""
        ...

    def perform(self, name: str) -> Awaitable[Report | None]:
        """Perform one effect; its report, or ``None`` (nothing to report, or interrupted)."""
        ...

    def interrupted(self) -> tuple[str, Facts] | None:
        """The oldest pending interrupt (removed), with its facts, if the table lists it now."""
        ...

    def translate(self, effect: str, report: Report) -> tuple[str, Facts, Mapping[str, Any]]:
        """The event ``effect``'s report fires, the facts its guards read, and its data."""
        ...


async def run_table(
    host: TableHost, event: str | None, facts: Facts, data: Mapping[str, Any] = NO_DATA
) -> None:
    """Step ``event`` and what the effects report until the table rests (the module's loop)."""
    while event is not None:
        effects = await host.step(event, facts, data)
        event = None
        for name in effects:
            report = await host.perform(name)
            interrupt = host.interrupted()
            if interrupt is not None:
                (event, facts), data = interrupt, NO_DATA
                break
            if report is not None:
                event, facts, data = host.translate(name, report)


def check_effects(defn: MachineDef, effects: Mapping[str, object]) -> None:
    """Refuse an effect table that does not match the machine's table and vocabulary.

    Raises:
        DefinitionError: A row names an effect the table does not implement, or the table
            implements a name outside the machine's vocabulary.
    """
    names = frozenset(effects)
    # A driver is built per operation: the same table and names are checked once.
    per_table(defn, names, lambda: _check_effects(defn, names))


def _check_effects(defn: MachineDef, names: frozenset[str]) -> bool:
    used = {name for row in defn.rows for name in row.effects}
    missing = sorted(used - names)
    if missing:
        raise DefinitionError(f"{defn.source}: no driver effect for {', '.join(missing)}")
    vocabulary = EFFECTS.get(defn.name, {})
    unknown = sorted(names - set(vocabulary))
    if unknown:
        raise DefinitionError(
            f"{defn.name} driver implements effects outside its vocabulary: {', '.join(unknown)}"
        )
    return True


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error in ``group``, unwrapped.

    A driver loop's own error (an effect that raised, a refused step) comes back grouped by the
    task group the loop ran in.
    """
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup) and first.exceptions:
        first = first.exceptions[0]
    return first


class Interpreter:
    """One machine's state, stepped only through the pure :func:`step`.

    Args:
        defn: The table.
        effects: The effect table: every effect name the rows use, to a coroutine function.
        observers: Called with every step and its journal data, after the state changed.
        state: The state to start in (default: the table's initial state).

    Raises:
        DefinitionError: The effect table does not match the machine (see :func:`check_effects`).
    """

    def __init__(
        self,
        defn: MachineDef,
        effects: Mapping[str, Effect],
        *,
        observers: Sequence[StepObserver] = (),
        state: str | None = None,
    ) -> None:
        check_effects(defn, effects)
        self.defn = defn
        self.state = defn.initial if state is None else state
        self.scheduler = Scheduler(defn)
        self._effects = effects
        self._observers = tuple(observers)

    @property
    def done(self) -> bool:
        """Whether the machine rests in a final state."""
        return self.state in self.defn.final

    def let_go(self) -> None:
        """Drop the effect table and the observers (the run has ended; it performs nothing more).

        They usually point back at the driver that owns this interpreter: dropping them breaks
        that reference cycle, so the driver is freed by reference counting.
        """
        self._effects = {}
        self._observers = ()
        self.scheduler.let_go()

    def listed(self, event: str) -> bool:
        """Whether the table lists ``event`` for the current state (guards not evaluated)."""
        return bool(self.defn.rows_for(self.state, event))

    def step(self, event: str, facts: Facts, data: Mapping[str, Any] | None = None) -> Step:
        """Take one step and tell the observers.

        Raises:
            TransitionError: The table refuses the event in this state; the state is unchanged.
        """
        taken = step(self.defn, self.state, event, facts, keep_facts=True)
        self.state = taken.dest
        for observer in self._observers:
            observer(taken, data or {})
        return taken

    def perform(self, name: str) -> Awaitable[Report | None]:
        """Perform one effect of the table: its report, awaited (no coroutine of its own)."""
        return self._effects[name]()

    def perform_now(self, name: str) -> Report | None:
        """Perform an effect that completes without waiting, from a synchronous call (``close``).

        Raises:
            RuntimeError: The effect waited for something (a driver bug: such an effect cannot
                run from a synchronous call).
        """
        work = self._effects[name]()
        assert isinstance(work, Coroutine)
        coroutine: Coroutine[Any, Any, Report | None] = work
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        coroutine.close()
        raise RuntimeError(f"{self.defn.name} effect {name} waited inside a synchronous call")

    # -- interrupts and work in flight (the scheduler's) ------------------------------------------

    def interrupt(self, event: str) -> None:
        """Record an interrupt request and wake the loop; the table decides what it means.

        Raises:
            ValueError: The machine declares its interrupts and ``event`` is not one of them.
        """
        self.scheduler.request(event, self.state)

    def take_interrupt(self) -> str | None:
        """The oldest pending interrupt, if any (removed)."""
        return self.scheduler.take()

    def interrupted(self, facts: Facts) -> tuple[str, Facts] | None:
        """The oldest pending interrupt (removed), with ``facts``, if the table lists it now.

        One the table does not list here is dropped, and the effect's report goes on
        (:meth:`TableHost.interrupted`).
        """
        event = self.scheduler.take()
        return (event, facts) if event is not None and self.listed(event) else None

    def take_listed_interrupt(self) -> str | None:
        """The oldest pending interrupt the table lists in the current state, if any.

        Interrupts before it that the table does not list here are dropped: a request with no
        row in this state means nothing now (an abort that arrives once the turn has ended).
        """
        return self.scheduler.take_listed(self.state)

    def drop_interrupts(self) -> None:
        """Forget pending interrupts (the run that they were meant for has ended)."""
        self.scheduler.drop()

    def in_flight(
        self, group: TaskGroup | None, work: Effect, *, again: bool = False
    ) -> Awaitable[Report | None]:
        """Run an awaiting effect until it reports or an interrupt the state lists arrives.

        See :meth:`~orchestrator._runtime.scheduler.Scheduler.run` (``again``: take a start
        slot again after the wait, when one was held).

        Returns:
            The effect's report, or ``None`` when an interrupt arrived first.
        """
        return self.scheduler.run(work, self.state, group, again=again)

    async def wait_in_flight(self) -> None:
        """Wait, shielded, until the effect in flight (if any) has reported on its own."""
        await self.scheduler.settle()

    async def stop_in_flight(self) -> None:
        """Cancel the effect in flight, if any, and wait until it has settled."""
        await self.scheduler.stop()
