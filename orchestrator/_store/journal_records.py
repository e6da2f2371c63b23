"""The journal's records read back: one record a line, grouped by operation (D24).

Reading is lenient (D3): a torn last line, or a damaged line in the middle, is skipped and
reported as a :class:`~orchestrator._core.load_result.Problem`, never raised. A journal that has
run for months is read from its end to its last clean close (:func:`unsettled_part`), where an
operation may still be open. Writing is :mod:`orchestrator._store.journal`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.load_result import Problem

OPERATION_MACHINE = "operation"
_KEYS = ("time", "machine", "operationId", "kind", "from", "event", "to", "effects", "data")


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRecord:
    """One machine step as the journal keeps it.

    Attributes:
        time: When it was recorded (ISO, milliseconds, ``Z``).
        machine: ``turn``, ``operation`` or ``navigation``.
        operation_id: The operation's id (operation records only).
        kind: ``compaction``, ``branch_summary`` or ``prune`` (operation records only).
        source: State before the step.
        event: The event fired.
        dest: State after the step.
        effects: Effect names the step asked for.
        data: Small extra facts (``entryId`` planned for the commit, reason, error text, model).
    """

    time: str
    machine: str
    operation_id: str | None = None
    kind: str | None = None
    source: str
    event: str
    dest: str
    effects: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The record's JSON object, keys in the documented order."""
        values = (
            self.time,
            self.machine,
            self.operation_id,
            self.kind,
            self.source,
            self.event,
            self.dest,
            list(self.effects),
            dict(self.data),
        )
        return dict(zip(_KEYS, values, strict=True))

    @classmethod
    def from_json(cls, value: object) -> JournalRecord | None:
        """Build a record from a parsed line, or return ``None`` when it is not one.

        An operation step without an ``operationId`` (empty or null) is not one: no writer
        records it (an operation step needs its id), settling could not record the step that
        closes such an operation, and read as a record it would be listed with the turn's steps.
        """
        if not isinstance(value, dict) or not all(key in value for key in _KEYS):
            return None
        strings = (value["time"], value["machine"], value["from"], value["event"], value["to"])
        optional = (value["operationId"], value["kind"])
        effects, data = value["effects"], value["data"]
        if not (
            all(isinstance(s, str) for s in strings)
            and all(o is None or isinstance(o, str) for o in optional)
            and value["operationId"] != ""
            and (value["operationId"] is not None or value["machine"] != OPERATION_MACHINE)
            and isinstance(effects, list)
            and all(isinstance(e, str) for e in effects)
            and isinstance(data, dict)
        ):
            return None
        return cls(
            time=value["time"],
            machine=value["machine"],
            operation_id=value["operationId"],
            kind=value["kind"],
            source=value["from"],
            event=value["event"],
            dest=value["to"],
            effects=tuple(effects),
            data=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRead:
    """What reading a journal found.

    Attributes:
        records: The usable records, in file order.
        problems: Skipped lines (``torn_line``, ``not_json``, ``not_record``), in line order.
    """

    records: tuple[JournalRecord, ...]
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class JournaledOperation:
    """One operation as the journal tells it.

    Attributes:
        operation_id: Its id.
        kind: ``compaction``, ``branch_summary`` or ``prune``.
        state: The state of its last record.
        data: The ``data`` of all its records merged in order (later keys win), so the
            ``entryId`` recorded on reaching ``committing`` is here.
        records: Its records, in order.
    """

    operation_id: str
    kind: str | None
    state: str
    data: Mapping[str, Any]
    records: tuple[JournalRecord, ...]

    @property
    def entry_id(self) -> str | None:
        """The entry id planned for the commit, when one was recorded."""
        value = self.data.get("entryId")
        return value if isinstance(value, str) else None


CLOSE_MARK = b'"event":"close","to":"closed"'
"""The bytes a close record holds (the encoder writes its keys in one order; inside a string
value the quotes would be escaped), looked for before the line is parsed."""


def unsettled_part(raw: bytes) -> bytes:
    """The journal after its last clean close: where an operation may still be open.

    A runtime journals the turn table's ``close`` row when the session closes with every
    operation it began finished (:meth:`Journal.may_mark_close`), and every opening settles
    what it found open before anything else: so no operation before the last close record
    can be open, and opening reads only what follows it. A session that has run for months
    opens in the time its last run's records take to read, not its whole history's (100,000
    records took 1.3 s). The mark is looked for as bytes from the end (the encoder writes the
    keys in one order, and inside a string value its quotes would be escaped), and the line
    it is in is parsed to be sure; a journal without one is read whole. A journal file is
    read from its end until the mark (:func:`after_last_close`), not whole.
    """
    start = after_last_close(raw, True)
    assert start is not None  # the whole journal always has an answer
    return raw[start:]


def after_last_close(data: bytes, whole: bool) -> int | None:
    """Where the part after the last close record starts in ``data``, a journal's last bytes.

    Args:
        data: The end of the journal.
        whole: ``data`` is the whole journal.

    Returns:
        The offset (0 when the whole journal has no close record); ``None`` when the bytes
        before ``data`` are needed to tell (a mark whose line may begin before them).
    """
    end = len(data)
    while True:
        found = data.rfind(CLOSE_MARK, 0, end)
        if found == -1:
            return 0 if whole else None
        newline = data.rfind(b"\n", 0, found)
        if newline == -1 and not whole:
            return None  # the mark's line may begin before these bytes
        start = newline + 1
        stop = data.find(b"\n", found)
        if stop != -1 and is_close_record(data[start:stop]):
            return stop + 1
        end = start  # torn (the last line, without its newline) or not a record: look before


def is_close_record(line: bytes) -> bool:
    """Whether ``line`` (one line of a journal, no newline) is the turn table's close record."""
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    mark = JournalRecord.from_json(value)
    return mark is not None and (mark.machine, mark.event, mark.dest) == ("turn", "close", "closed")


def parse_journal(raw: bytes) -> JournalRead:
    """Parse journal bytes: one record per line; damaged lines become problems.

    Returns:
        The records and problems.
    """
    records: list[JournalRecord] = []
    problems: list[Problem] = []
    lines = raw.split(b"\n")
    torn_at = len(lines) if raw.endswith(b"\n") else len(lines) - 1
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            code = "torn_line" if number - 1 == torn_at else "not_json"
            problems.append(Problem(line=number, code=code, message=_MESSAGES[code]))
            continue
        entry = JournalRecord.from_json(value)
        if entry is None:
            message = _MESSAGES["not_record"]
            problems.append(Problem(line=number, code="not_record", message=message))
        else:
            records.append(entry)
    return JournalRead(records=tuple(records), problems=tuple(problems))


_MESSAGES = {
    "torn_line": "the last line is torn (a crash mid-write); ignored",
    "not_json": "not valid JSON; skipped",
    "not_record": "not a journal record; skipped",
}


def operations(records: Iterable[JournalRecord]) -> list[JournaledOperation]:
    """Group operation records by id, in order of first record, with each one's last state.

    Returns:
        One :class:`JournaledOperation` per operation id, open or closed.
    """
    grouped: dict[str, list[JournalRecord]] = {}
    for entry in records:
        if entry.machine == OPERATION_MACHINE and entry.operation_id is not None:
            grouped.setdefault(entry.operation_id, []).append(entry)
    found = []
    for op_id, group in grouped.items():
        data: dict[str, Any] = {}
        for entry in group:
            data.update(entry.data)
        kind = next((e.kind for e in group if e.kind is not None), None)
        found.append(
            JournaledOperation(
                operation_id=op_id,
                kind=kind,
                state=group[-1].dest,
                data=data,
                records=tuple(group),
            )
        )
    return found
