"""A machine table: its records (:class:`Row`, :class:`MachineDef`), parsing and every check.

:mod:`orchestrator._lifecycle.machine` steps what this module loads. The checks:
unknown keys anywhere, an initial state that does not exist, a row naming an undeclared state, a
state unreachable from the initial one, a trap (a non-final state with no path to a final one), a
final state with outgoing rows, a guard not in the machine's own registry (another machine's
guard is named as such) or an effect outside the machine's vocabulary, a state or event the code's
enums do not know (:mod:`orchestrator._lifecycle.names`), a row shadowed by an earlier unguarded
row, and names that would collide with what ``transitions`` adds to its model. Each failure is a
``DefinitionError`` naming the file and the rule.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.guards import EFFECTS, GUARDS, Facts, GuardSet
from orchestrator._lifecycle.names import vocabulary_problem

NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
"""What a machine, state or event name looks like."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One transition row of a table.

    Attributes:
        index: Position in the file, from 0; earlier rows win.
        sources: States the row applies to.
        event: The event it answers.
        dest: The state it moves to.
        guards: Guard names that must all hold.
        unless: Guard names that must all fail.
        effects: Effect names the driver performs, in order.
        doc: Why the row exists.
    """

    index: int
    sources: tuple[str, ...]
    event: str
    dest: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    effects: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MachineDef:
    """A validated machine table.

    Attributes:
        name: The machine's name (``turn``, ``operation``, ``navigation``).
        source: Where the table came from, for messages.
        doc: What the machine is for.
        initial: The initial state.
        final: The final states.
        states: State name to its explanation, in file order.
        rows: The transition rows, in file order.
        guards: The guard registry the rows were checked against; its ``facts`` is the record
            type :meth:`holds` accepts.
    """

    name: str
    source: str
    doc: str
    initial: str
    final: frozenset[str]
    states: Mapping[str, str]
    rows: tuple[Row, ...]
    guards: GuardSet[Any]
    _answering: Mapping[tuple[str, str], tuple[Row, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # The rows answering each (state, event), in file order, found once: a step is a
        # dictionary lookup, not a scan of the table (a thousand sessions step it thousands of
        # times a second, issue 9).
        answering: dict[tuple[str, str], list[Row]] = {}
        for row in self.rows:
            for state in row.sources:
                answering.setdefault((state, row.event), []).append(row)
        object.__setattr__(
            self, "_answering", MappingProxyType({k: tuple(v) for k, v in answering.items()})
        )

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        guards: GuardSet[Any] | None = None,
        effects: Iterable[str] | None = None,
    ) -> MachineDef:
        """Read and validate one table file.

        Args:
            path: The TOML file.
            guards: The guard registry; defaults to the one registered in
                :data:`orchestrator._lifecycle.guards.GUARDS` under the table's machine name.
            effects: The allowed effect names; defaults to the vocabulary registered in
                :data:`orchestrator._lifecycle.guards.EFFECTS` under the table's machine name.

        Returns:
            The validated definition.

        Raises:
            DefinitionError: The file is unreadable or breaks a rule; the message names the file.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DefinitionError(f"{path}: cannot read: {exc}") from exc
        return cls.parse(text, source=str(path), guards=guards, effects=effects)

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        source: str = "<string>",
        guards: GuardSet[Any] | None = None,
        effects: Iterable[str] | None = None,
    ) -> MachineDef:
        """Validate a table given as TOML text. Same contract as :meth:`load`.

        Returns:
            The validated definition.

        Raises:
            DefinitionError: The text breaks a rule.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise DefinitionError(f"{source}: not valid TOML: {exc}") from exc
        return build(data, source=source, guards=guards, effects=effects)

    @property
    def events(self) -> tuple[str, ...]:
        """Every event the table names, in order of first appearance."""
        return tuple(dict.fromkeys(row.event for row in self.rows))

    def rows_for(self, state: str, event: str) -> tuple[Row, ...]:
        """Return the rows answering ``event`` in ``state``, in file order."""
        return self._answering.get((state, event), ())

    def holds(self, row: Row, facts: Facts) -> bool:
        """Return whether every guard of ``row`` holds and every ``unless`` guard fails."""
        guards = self.guards
        for name in row.guards:
            if not guards[name](facts):
                return False
        return not any(guards[name](facts) for name in row.unless)

    def check_facts(self, facts: Facts) -> None:
        """Refuse another machine's facts record: its guards would read fields it lacks.

        Raises:
            TypeError: ``facts`` is not this machine's record type.
        """
        if not isinstance(facts, self.guards.facts):
            raise TypeError(
                f"{self.name}: guards read {self.guards.facts.__name__}, not {type(facts).__name__}"
            )

    def select(self, state: str, event: str, facts: Facts) -> Row | None:
        """Return the row that ``event`` takes in ``state``, or None when it is refused.

        Raises:
            TypeError: ``facts`` is another machine's record.
        """
        self.check_facts(facts)
        for row in self._answering.get((state, event), ()):
            if self.holds(row, facts):
                return row
        return None


_TOP_KEYS = frozenset({"machine", "states", "transitions"})
_MACHINE_KEYS = frozenset({"name", "initial", "final", "doc"})
_STATE_KEYS = frozenset({"doc"})
_ROW_KEYS = frozenset({"source", "event", "dest", "guards", "unless", "effects", "doc"})
# transitions adds `trigger`, `state`, `is_<state>`, `may_<event>` and `<event>` to its model.
_RESERVED = frozenset({"trigger", "state", "may_trigger"})
_RESERVED_PREFIXES = ("is_", "may_", "to_")


def _fail(source: str, reason: str) -> NoReturn:
    raise DefinitionError(f"{source}: {reason}")


def _table(value: object, where: str, allowed: frozenset[str], source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(source, f"{where} must be a table")
    unknown = sorted(set(value) - allowed)
    if unknown:
        _fail(source, f"unknown key(s) in {where}: {', '.join(unknown)}")
    return value


def _text(table: Mapping[str, Any], key: str, where: str, source: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        _fail(source, f"{where} needs a non-empty string {key!r}")
    return value


def _strings(value: object, where: str, source: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(source, f"{where} must be a string or a list of strings")
    return tuple(value)


def _parse_states(raw: object, source: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not raw:
        _fail(source, "[states] must declare at least one state")
    states: dict[str, Any] = raw
    return {
        name: _text(_table(body, f"[states.{name}]", _STATE_KEYS, source), "doc", name, source)
        for name, body in states.items()
    }


def _parse_row(index: int, raw: object, source: str) -> Row:
    where = f"transition #{index + 1}"
    body = _table(raw, where, _ROW_KEYS, source)
    sources = _strings(body.get("source"), f"{where} source", source)
    if not sources:
        _fail(source, f"{where} has an empty source list")
    doc = body.get("doc", "")
    if not isinstance(doc, str):
        _fail(source, f"{where} doc must be a string")
    return Row(
        index=index,
        sources=sources,
        event=_text(body, "event", where, source),
        dest=_text(body, "dest", where, source),
        guards=_strings(body.get("guards", []), f"{where} guards", source),
        unless=_strings(body.get("unless", []), f"{where} unless", source),
        effects=_strings(body.get("effects", []), f"{where} effects", source),
        doc=doc,
    )


def build(
    data: Mapping[str, Any],
    *,
    source: str,
    guards: GuardSet[Any] | None,
    effects: Iterable[str] | None,
) -> MachineDef:
    """Build and validate a definition from parsed TOML.

    Raises:
        DefinitionError: a rule is broken; the message names the file.
    """
    top = _table(data, "the file", _TOP_KEYS, source)
    if "machine" not in top:
        _fail(source, "missing the [machine] table")
    head = _table(top["machine"], "[machine]", _MACHINE_KEYS, source)
    name = _text(head, "name", "[machine]", source)
    final = _strings(head.get("final"), "[machine] final", source)
    raw_rows = top.get("transitions", [])
    if not isinstance(raw_rows, list):
        _fail(source, "transitions must be an array of tables ([[transitions]])")
    if effects is None:
        if name not in EFFECTS:
            _fail(source, f"no effect vocabulary registered for machine {name!r}")
        effects = EFFECTS[name]
    if guards is None:
        if name not in GUARDS:
            _fail(source, f"no guard registry for machine {name!r}")
        guards = GUARDS[name]
    defn = MachineDef(
        name=name,
        source=source,
        doc=str(head.get("doc", "")),
        initial=_text(head, "initial", "[machine]", source),
        final=frozenset(final),
        states=MappingProxyType(_parse_states(top.get("states"), source)),
        rows=tuple(_parse_row(i, raw, source) for i, raw in enumerate(raw_rows)),
        guards=guards,
    )
    _check_names(defn, frozenset(effects))
    problem = vocabulary_problem(name, tuple(defn.states), defn.events)
    if problem is not None:
        _fail(source, problem)
    _check_graph(defn)
    _check_shadowing(defn)
    return defn


def _usable(name: str) -> bool:
    return (
        NAME.match(name) is not None
        and name not in _RESERVED
        and not name.startswith(_RESERVED_PREFIXES)
    )


def _check_names(defn: MachineDef, effects: frozenset[str]) -> None:
    src, states = defn.source, defn.states
    for name in (*states, *defn.events):
        if not _usable(name):
            _fail(src, f"{name!r} is not a usable name (lower_snake_case, not reserved)")
    if not defn.final:
        _fail(src, "[machine] final lists no state")
    for name in (defn.initial, *sorted(defn.final)):
        if name not in states:
            _fail(src, f"[machine] names state {name!r}, which [states] does not declare")
    for row in defn.rows:
        _check_row(defn, row, effects)


def _check_row(defn: MachineDef, row: Row, effects: frozenset[str]) -> None:
    where = f"transition #{row.index + 1} ({row.event})"
    unknown_states = [s for s in (*row.sources, row.dest) if s not in defn.states]
    unknown_guards = [g for g in (*row.guards, *row.unless) if g not in defn.guards]
    unknown_effects = [e for e in row.effects if e not in effects]
    if unknown_states:
        _fail(defn.source, f"{where} names undeclared state {unknown_states[0]!r}")
    if unknown_guards:
        _fail(defn.source, f"{where} {_guard_problem(defn, unknown_guards[0])}")
    if unknown_effects:
        _fail(defn.source, f"{where} names unregistered effect {unknown_effects[0]!r}")


def _guard_problem(defn: MachineDef, guard: str) -> str:
    # A guard of another machine reads fields this machine's facts do not have: say whose it is.
    owners = sorted(m for m, registry in GUARDS.items() if guard in registry and m != defn.name)
    if owners:
        return (
            f"names guard {guard!r} of the {' and '.join(owners)} machine; "
            f"{defn.name} guards read {defn.guards.facts.__name__}"
        )
    return f"names unregistered guard {guard!r}"


def _closure(start: Iterable[str], edges: Mapping[str, set[str]]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in edges.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _check_graph(defn: MachineDef) -> None:
    forward: dict[str, set[str]] = {}
    backward: dict[str, set[str]] = {}
    for row in defn.rows:
        for src in row.sources:
            if src in defn.final:
                _fail(defn.source, f"final state {src!r} has an outgoing transition ({row.event})")
            forward.setdefault(src, set()).add(row.dest)
            backward.setdefault(row.dest, set()).add(src)
    unreachable = [s for s in defn.states if s not in _closure([defn.initial], forward)]
    if unreachable:
        _fail(defn.source, f"unreachable from {defn.initial!r}: {', '.join(unreachable)}")
    finishing = _closure(defn.final, backward)
    traps = [s for s in defn.states if s not in finishing]
    if traps:
        _fail(defn.source, f"no path to a final state (trap) from: {', '.join(traps)}")


def _check_shadowing(defn: MachineDef) -> None:
    # An unguarded row always wins, so a later row for the same (state, event) is dead text.
    winner: dict[tuple[str, str], Row] = {}
    for row in defn.rows:
        for src in row.sources:
            first = winner.get((src, row.event))
            if first is not None:
                _fail(
                    defn.source,
                    f"transition #{row.index + 1} can never fire from {src!r}: "
                    f"transition #{first.index + 1} has no guard for {row.event!r}",
                )
            if not row.guards and not row.unless:
                winner[(src, row.event)] = row
