"""The interpreter every machine driver shares: step, perform, report (D31).

Theory of operation. A machine's table decides; a driver performs. The loop is

    step(table, state, event, facts) -> Step(dest, effects)    # pure, the only decision
    for each effect: report = await effects[name]()             # performs one thing, reports
    event, facts = translate(effect, report)                    # the machine's own vocabulary

and :class:`Interpreter` holds the parts of that loop that do not depend on the machine: the
current state, the explicit effect table (checked against the TOML when the interpreter is built,
so a row naming an effect nobody performs fails at once), the observers that journal and trace
every step, and interrupts.

Interrupts. A cancel request (``abort``, ``cancel``, ``manual_compact``) can arrive while an effect
is awaiting a model, a wait or an agent. The request only records the event and wakes the loop;
the loop steps the event through the table like any other, and the row's own stop effect
(``stop_work``, ``stop_agent``, ``cancel_compaction``, ``cancel_retry_wait``) cancels the effect
in flight and waits until it has settled. So an awaiting effect runs in a child task with its
own cancel scope, and the loop waits for whichever comes first: its report or an interrupt.

Where the table leaves no choice, no child task is needed: in a state where every row an
interrupt can take starts with stopping the work in flight (:data:`STOPPING`), the work would be
cancelled as soon as the interrupt is stepped, so the loop awaits it in its own task, under a
cancel scope the interrupt cancels at once; the loop then steps the interrupt, and the row's stop
effect finds the work settled already. That is every awaiting state of an operation and of a
turn but two (a turn's prune and its continuation, where an interrupt does not stop the work).
A child task, its event and the loop passes to start it and hear from it cost a compaction about
a tenth of its CPU on the event loop, with a thousand of them at once (issue 9).

Nothing here reads a clock or makes an id; a host that is not anyio (a durable workflow) can run
the same :func:`~orchestrator._lifecycle.machine.step` with the effects as activities.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import anyio
from anyio.abc import TaskGroup

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.guards import EFFECTS, INTERRUPTS, STOPPING, Facts
from orchestrator._lifecycle.machine import MachineDef, Step, step


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What an effect reports: an outcome in the machine's vocabulary, never a state.

    Attributes:
        outcome: ``ok``, ``transient``, ``overflow``, ``truncated``, ``empty``, ``fatal``,
            ``cancelled``, ``conflict``, ``failed``, or a hook's ``done`` / ``supplied`` ...
        retry_after: A provider's retry-after hint in seconds (``transient`` only).
        error: The failure as one line.
        data: Small facts for the journal (ids, model names).
    """

    outcome: str
    retry_after: float | None = None
    error: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


Effect = Callable[[], Awaitable[Report | None]]
StepObserver = Callable[[Step, Mapping[str, Any]], None]

P = ParamSpec("P")
R = TypeVar("R")


def weakly(method: Callable[P, R]) -> Callable[P, R]:
    """The bound ``method``, without keeping its object alive.

    A driver that lives as long as its session (the turn driver, the navigator) gives its
    interpreter its own bound methods, and the interpreter is its attribute: a reference cycle,
    which reference counting never frees. Such a cycle holds the driver's session, every entry
    of it, until a full collection; and the loader puts what it parses in the oldest generation
    without counting it (``_core.loading.gc_paused``), so CPython may never see a reason to run
    one (60 sessions of 10k entries opened, compacted and closed in turn kept 1.4 GB). What the
    driver hands its own interpreter goes through this instead.

    Raises:
        ReferenceError: The object was freed (its interpreter outlived it).
    """
    bound: Any = method
    owner, function = weakref.ref(bound.__self__), bound.__func__  # one weakref per object
    name = function.__qualname__

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        target = owner()
        if target is None:
            raise ReferenceError(f"{name}: its object was freed")
        result: R = function(target, *args, **kwargs)
        return result

    return call


def check_effects(defn: MachineDef, effects: Mapping[str, object]) -> None:
    """Refuse an effect table that does not match the machine's table and vocabulary.

    Raises:
        DefinitionError: A row names an effect the table does not implement, or the table
            implements a name outside the machine's vocabulary.
    """
    names = frozenset(effects)
    key = (id(defn), names)
    if _CHECKED.get(key) is defn:
        return  # a driver is built per operation: the same table and names checked already
    used = {name for row in defn.rows for name in row.effects}
    missing = sorted(used - names)
    if missing:
        raise DefinitionError(f"{defn.source}: no driver effect for {', '.join(missing)}")
    vocabulary = EFFECTS.get(defn.name, {})
    unknown = sorted(set(effects) - set(vocabulary))
    if unknown:
        raise DefinitionError(
            f"{defn.name} driver implements effects outside its vocabulary: {', '.join(unknown)}"
        )
    if len(_CHECKED) > 256:  # tables built by tests come and go: keep the memory bounded
        _CHECKED.clear()
    _CHECKED[key] = defn  # holding the table keeps its id from being reused by another


_CHECKED: dict[tuple[int, frozenset[str]], MachineDef] = {}


def direct_states(defn: MachineDef) -> frozenset[str]:
    """The states where work in flight may run in the loop's own task (see the module comment).

    Those where every row of every interrupt the host may request (:data:`INTERRUPTS`) performs
    a stop effect (:data:`STOPPING`): stepping the interrupt always cancels the work, so it may
    as well be cancelled when the interrupt arrives. A machine whose interrupts are not declared
    has no such state.
    """
    known = _DIRECT.get(id(defn))
    if known is not None and known[0] is defn:
        return known[1]
    interrupts = INTERRUPTS.get(defn.name)
    stopping = STOPPING.get(defn.name, frozenset())
    states: frozenset[str] = frozenset()
    if interrupts is not None:
        states = frozenset(
            state
            for state in defn.states
            if all(
                stopping.intersection(row.effects)
                for event in interrupts
                for row in defn.rows_for(state, event)
            )
        )
    if len(_DIRECT) > 256:  # tables built by tests come and go: keep the memory bounded
        _DIRECT.clear()
    _DIRECT[id(defn)] = (defn, states)  # holding the table keeps its id from being reused
    return states


_DIRECT: dict[int, tuple[MachineDef, frozenset[str]]] = {}


def cancel_scope(scope: anyio.CancelScope) -> None:
    """Cancel ``scope``. A deadline in the past cancels like ``scope.cancel()`` on every backend.

    I use it because anyio 4.16's trio backend calls trio<0.25's ``cancel()`` with an argument it
    does not take.
    """
    scope.deadline = -math.inf


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error in ``group``, unwrapped.

    A driver loop's own error (an effect that raised, a refused step) comes back grouped by the
    task group the loop ran in.
    """
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup) and first.exceptions:
        first = first.exceptions[0]
    return first


@dataclass(slots=True)
class _InFlight:
    scope: anyio.CancelScope
    done: anyio.Event
    report: Report | None = None


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
        self._effects = effects
        self._observers = tuple(observers)
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._in_flight: _InFlight | None = None
        self._direct = direct_states(defn)
        self._interrupts = INTERRUPTS.get(defn.name)
        self._in_task: anyio.CancelScope | None = None

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
        self._in_flight = None
        self._in_task = None

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

    async def perform(self, name: str) -> Report | None:
        """Perform one effect of the table and return its report."""
        return await self._effects[name]()

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

    # -- interrupts -------------------------------------------------------------------------------

    def interrupt(self, event: str) -> None:
        """Record an interrupt request and wake the loop; the table decides what it means.

        Raises:
            ValueError: The machine declares its interrupts and ``event`` is not one of them (a
                driver bug: work awaited in the loop's own task could not be interrupted by it).
        """
        if self._interrupts is not None and event not in self._interrupts:
            raise ValueError(f"{self.defn.name}: {event!r} is not an interrupt of this machine")
        self._pending.append(event)
        self._wake.set()
        if self._in_task is not None and self.listed(event):
            # The row will stop the work (direct_states): stop it now, so the loop can step.
            cancel_scope(self._in_task)

    def take_interrupt(self) -> str | None:
        """The oldest pending interrupt, if any (removed)."""
        return self._pending.pop(0) if self._pending else None

    def take_listed_interrupt(self) -> str | None:
        """The oldest pending interrupt the table lists in the current state, if any.

        Interrupts before it that the table does not list here are dropped: a request with no
        row in this state means nothing now (an abort that arrives once the turn has ended).
        """
        while self._pending:
            event = self._pending.pop(0)
            if self.listed(event):
                return event
        return None

    def _wanted(self) -> bool:
        return any(self.listed(event) for event in self._pending)

    def drop_interrupts(self) -> None:
        """Forget pending interrupts (the run that they were meant for has ended)."""
        self._pending.clear()

    async def in_flight(self, group: TaskGroup | None, work: Effect) -> Report | None:
        """Run an awaiting effect until it reports or an interrupt arrives.

        Only an interrupt the table lists in the current state ends the wait; one it does not
        list leaves the effect to report. In a state of :func:`direct_states` the effect runs in
        this task and a listed interrupt cancels it at once; elsewhere it runs in a child task of
        ``group``.

        Returns:
            The effect's report, or ``None`` when an interrupt arrived first (the effect was
            cancelled, or, in a child task, keeps running until a stop effect calls
            :meth:`stop_in_flight`).
        """
        if self.state in self._direct:
            return await self._in_this_task(work)
        if group is None:
            raise RuntimeError(
                f"{self.defn.name}: work in flight in {self.state} needs a task group"
            )
        flight = _InFlight(scope=anyio.CancelScope(), done=anyio.Event())

        async def run() -> None:
            try:
                with flight.scope:
                    flight.report = await work()
            finally:
                flight.done.set()
                self._wake.set()

        self._in_flight = flight
        group.start_soon(run)
        while not flight.done.is_set() and not self._wanted():
            self._wake = anyio.Event()
            if flight.done.is_set() or self._wanted():
                break
            await self._wake.wait()
        if flight.done.is_set():
            self._in_flight = None
            return flight.report
        return None

    async def _in_this_task(self, work: Effect) -> Report | None:
        scope = anyio.CancelScope()
        if self._wanted():
            # Asked for already: the work starts cancelled, as a child task would be at once.
            cancel_scope(scope)
        self._in_task = scope
        try:
            with scope:
                report = await work()
                return report
        finally:
            self._in_task = None
        return None  # cancelled by an interrupt: the loop steps it

    async def wait_in_flight(self) -> None:
        """Wait, shielded, until the effect in flight (if any) has reported on its own."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            with anyio.CancelScope(shield=True):
                await flight.done.wait()

    async def stop_in_flight(self) -> None:
        """Cancel the effect in flight, if any, and wait until it has settled."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        cancel_scope(flight.scope)
        with anyio.CancelScope(shield=True):
            await flight.done.wait()
