"""The generic machine engine: load a table, validate it, bind it to ``transitions``, step it."""

# Theory of operation
# -------------------
#
# A machine is a table. Each ``machines/<name>.toml`` file holds:
#
#     [machine]            name, initial, final = [...], optional doc
#     [states.<name>]      doc = "..."                    one entry per state, each explained
#     [[transitions]]      source = "a" | ["a", "b"], event, dest,
#                          guards = [...]   every named guard must hold
#                          unless = [...]   every named guard must fail
#                          effects = [...]  names the driver performs, in order
#                          doc = "..."
#
# For a (state, event) the rows are tried in file order and the first whose guards hold is taken.
# The engine changes the state and RETURNS the row's effect names; it performs nothing. The async
# driver performs the effects and feeds the outcome back as the next event. That is the h11 split:
# the machine knows what may happen next, the driver knows how to do it.
#
# Refusal. An event the table does not list for the current state, or whose rows all have a
# failing guard, raises TransitionError and leaves the state unchanged. One could also move the
# machine to `failed` on a refused event, but the property the tests check ("a legal next state,
# or an error with the state unchanged") says the opposite, and I side with it: a refusal is
# a caller bug, and jumping to `failed` would destroy the very state that explains the bug. It
# would also make `failed` reachable from every state, which hides real failure paths in the
# diagram. Real failures are rows like any other (an operation ends in `failed` by a listed
# event), so a refusal never stands in for one.
#
# Validation at load. I reject unknown keys anywhere; an initial state that does not
# exist; a row naming an undeclared state; a state unreachable from the initial one; a trap (a
# non-final state with no path to a final one); a final state with outgoing rows; a guard not in
# the machine's own guard registry (another machine's guard reads another record) or an effect not
# in the machine's effect vocabulary; a row that can never
# fire because an earlier unguarded row for the same (state, event) always wins; and event or
# state names that would collide with the attributes ``transitions`` adds to its model.
#
# Binding. The rows are loaded into a synchronous ``transitions.Machine`` with
# ``auto_transitions=False`` (no hidden ``to_<state>`` events) and ``send_event=True``, so each
# condition receives the facts record passed with the event (the machine's own record type). I
# dispatch with ``model.trigger(name)`` because a model attribute with an event's name would
# silently shadow the generated method. transitions tries rows in the order they were added, which
# is file order, and an ``after`` callback per row tells me which row fired. The pure :func:`step`
# makes the same choice without ``transitions``; a property test checks that the two always agree,
# and replay can use the pure one.
#
# States and events are plain strings here rather than enums: the table is the source of truth,
# and an enum built at runtime from it would give no static checking anyway.
#
# Layout. The table's records (``Row``, ``MachineDef``) live with the parser and the load-time
# checks in :mod:`orchestrator._lifecycle.load`, so that parsing a table and the records it builds
# are one module and nothing imports back; this module re-exports them.

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from transitions import Machine

from orchestrator._core.errors import DefinitionError, TransitionError
from orchestrator._core.resources import data_dir
from orchestrator._lifecycle.guards import Facts, Guard
from orchestrator._lifecycle.load import NAME as NAME
from orchestrator._lifecycle.load import MachineDef as MachineDef
from orchestrator._lifecycle.load import Row as Row


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The record of one machine step, handed to observers.

    Attributes:
        machine: The table's name.
        source: State before the step.
        event: The event fired.
        dest: State after the step.
        effects: Effect names the driver must now perform, in order.
        facts: The facts the guards read (recorded so a trace replays through the table).
    """

    machine: str
    source: str
    event: str
    dest: str
    effects: tuple[str, ...]
    facts: Facts | None = field(default=None, compare=False)


Observer = Callable[[Step], None]


def step(
    defn: MachineDef, state: str, event: str, facts: Facts, *, keep_facts: bool = False
) -> Step:
    """Take one step without ``transitions``: the pure form of :meth:`Runner.fire`.

    Args:
        defn: The machine.
        state: The current state.
        event: The event to fire.
        facts: What the guards read.
        keep_facts: Record ``facts`` on the step (for observers that trace or journal them).

    Returns:
        The step taken.

    Raises:
        TransitionError: The table has no row for this state and event whose guards hold.
        TypeError: ``facts`` is another machine's record.
    """
    row = defn.select(state, event, facts)
    if row is None:
        raise TransitionError(defn.name, state, event)
    return Step(
        machine=defn.name,
        source=state,
        event=event,
        dest=row.dest,
        effects=row.effects,
        facts=facts if keep_facts else None,
    )


@cache
def load_machine(name: str) -> MachineDef:
    """Load one of the shipped tables by name (``turn``, ``operation``, ``navigation``).

    Returns:
        The validated definition (cached: tables are immutable).

    Raises:
        DefinitionError: The name is not a table name, or the shipped table is missing or invalid.
    """
    if not NAME.match(name):
        raise DefinitionError(f"{name!r} is not a machine name")
    return MachineDef.load(data_dir("machines") / f"{name}.toml")


def shipped_machines() -> tuple[str, ...]:
    """Return the names of the shipped tables, sorted."""
    return tuple(sorted(p.stem for p in data_dir("machines").glob("*.toml")))


class _Model:
    """The object transitions hangs its state and generated methods on."""

    state: str
    trigger: Callable[..., bool]


class Runner:
    """One live machine: holds the state and steps it through ``transitions.Machine``.

    Args:
        defn: The validated table.
        state: The state to start in (to resume from a journal); defaults to the initial one.
        observers: Called with every :class:`Step`, in order, after the state has changed.

    Raises:
        DefinitionError: ``state`` is not a state of the table.
    """

    def __init__(
        self,
        defn: MachineDef,
        *,
        state: str | None = None,
        observers: Sequence[Observer] = (),
    ) -> None:
        start = defn.initial if state is None else state
        if start not in defn.states:
            raise DefinitionError(f"{defn.source}: no state {start!r} to start in")
        self._defn = defn
        self._observers = list(observers)
        self._taken: Row | None = None
        self._model = _Model()
        machine = Machine(
            model=self._model,
            states=list(defn.states),
            initial=start,
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
        )
        for row in defn.rows:
            machine.add_transition(
                row.event,
                list(row.sources),
                row.dest,
                conditions=[self._condition(defn.guards[g]) for g in row.guards],
                unless=[self._condition(defn.guards[g]) for g in row.unless],
                after=[self._recorder(row)],
            )

    @property
    def defn(self) -> MachineDef:
        """The table this runner steps."""
        return self._defn

    @property
    def state(self) -> str:
        """The current state."""
        return self._model.state

    @property
    def done(self) -> bool:
        """Whether the machine has reached a final state."""
        return self.state in self._defn.final

    def listed_events(self) -> tuple[str, ...]:
        """Return the events the table lists for the current state (guards not evaluated)."""
        return tuple(e for e in self._defn.events if self._defn.rows_for(self.state, e))

    def subscribe(self, observer: Observer) -> None:
        """Add an observer; it sees every later step."""
        self._observers.append(observer)

    def fire(self, event: str, facts: Facts | None = None) -> Step:
        """Fire ``event`` and return the step taken.

        Args:
            event: The event name.
            facts: What the guards read; defaults to the machine's record with every field at its
                default.

        Returns:
            The step, whose ``effects`` the driver must now perform in order.

        Raises:
            TransitionError: The table lists no row for this event in the current state, or every
                listed row has a failing guard. The state is unchanged.
            TypeError: ``facts`` is another machine's record.
        """
        if facts is None:
            facts = self._defn.guards.facts()
        self._defn.check_facts(facts)
        source = self.state
        if not self._defn.rows_for(source, event):
            raise TransitionError(self._defn.name, source, event)
        self._taken = None
        self._model.trigger(event, facts=facts)
        row, self._taken = self._taken, None
        if row is None:
            raise TransitionError(self._defn.name, source, event)
        done = Step(
            machine=self._defn.name,
            source=source,
            event=event,
            dest=row.dest,
            effects=row.effects,
            facts=facts,
        )
        for observer in tuple(self._observers):
            observer(done)
        return done

    @staticmethod
    def _condition(guard: Guard) -> Callable[[Any], bool]:
        def check(event_data: Any) -> bool:
            facts: Facts = event_data.kwargs["facts"]
            return guard(facts)

        return check

    def _recorder(self, row: Row) -> Callable[[Any], None]:
        def record(_event_data: Any) -> None:
            self._taken = row

        return record


# Loading and validation. Every problem raises DefinitionError("<file>: <reason>").
