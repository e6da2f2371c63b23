"""The lifecycle journal: every machine step of a session, as JSON lines beside it (D24).

Theory of operation
-------------------

The runtime driver subscribes the journal to each of its machines (one turn machine and one
navigation machine per session, one operation machine per compaction, branch summary or prune)
and calls :meth:`Journal.record` with every :class:`~orchestrator._lifecycle.machine.Step`. One
record is one line::

    {"time": ISO, "machine": "turn"|"operation"|"navigation", "operationId": str|null,
     "kind": "compaction"|"branch_summary"|"prune"|null, "from": str, "event": str, "to": str,
     "effects": [...], "data": {...}}

The file is ``<session path>.journal``. It must not end in ``.jsonl``: pi lists every ``*.jsonl``
file in a session folder as a session. Each record is one ``os.write`` of a whole line on an
``O_APPEND`` descriptor, so a crash leaves at most one torn line at the end, and a record is in
the file (visible to a reader, kept if the process is killed) as soon as :meth:`Journal.record`
returns.

Durability (surviving a power cut) is a separate step, :meth:`Journal.sync`: one fsync makes every
record written before it durable, because they are all in the same file. By default
:meth:`Journal.record` fsyncs operation records before returning and never turn or navigation
records. The operation driver asks for less (issue 9): it writes every step at once but makes
the journal durable only where settling needs it, on entering ``committing`` (before the commit is
written, so a commit on disk always has its journaled entry id) and on reaching a final state,
and it runs that fsync in a worker thread so that the event loop never waits for the disk. Turn
and navigation records are not fsynced; they are history, and a power cut may lose the last few
(a later fsync of the same journal makes them durable too).

Reading is lenient (D3): a torn last line, or a damaged line in the middle, is skipped and
reported as a :class:`~orchestrator._core.load_result.Problem`, never raised. Before appending
after a torn line I write a newline first, so the torn bytes stay a line of their own and never
swallow the next record.

Records read back and grouped by operation are :mod:`orchestrator._store.journal_records`; the
file and memory sinks the lines go to are :mod:`orchestrator._store.journal_sinks`.

Settling (:func:`settle_unfinished_operations`) reads the open operations when the session is
opened again and closes each with the operation table's own ``reopened`` row, without calling any
model.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator._core.entries import iso_now
from orchestrator._core.errors import SessionError
from orchestrator._core.redact import redact
from orchestrator._lifecycle.machine import MachineDef, Step, load_machine
from orchestrator._store.files import (
    session_file,
)
from orchestrator._store.journal_records import (
    OPERATION_MACHINE,
    JournaledOperation,
    JournalRead,
    JournalRecord,
    operations,
    parse_journal,
    unsettled_part,
)
from orchestrator._store.journal_sinks import FileSink, MemorySink, Sink

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds."""

JOURNAL_SUFFIX = ".journal"


_log = logging.getLogger("orchestrator")

_ENCODER: list[Callable[[object], bytes]] = []


def _encode_line(value: Mapping[str, Any]) -> bytes:
    """One record's line: compact JSON, UTF-8, newline-terminated.

    msgspec's encoder, a tenth of the standard library's time per record (a busy server writes
    thousands a second, issue 9); imported at the first record, so reading a journal never
    loads it. The same bytes as ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``
    but for floats (``1e16``, not ``1e+16``) and NaN (``null``, not the invalid ``NaN``).

    Raises:
        UnicodeEncodeError: A string holds a lone surrogate.
        TypeError: A value JSON cannot hold.
    """
    return (_ENCODER[0] if _ENCODER else load_encoder())(value) + b"\n"


def load_encoder() -> Callable[[object], bytes]:
    """The records' encoder, imported now if it was not (a server does it at start)."""
    if not _ENCODER:
        import msgspec.json

        _ENCODER.append(msgspec.json.Encoder().encode)
    return _ENCODER[0]


def _wall_clock() -> int:
    return time.time_ns() // 1_000_000


def journal_path(session_path: str | os.PathLike[str]) -> Path:
    """Return the journal file of a session: the session file's path plus ``.journal``.

    A session opened through a symbolic link has the journal of the file it points to
    (:func:`~orchestrator._store.files.session_file`).
    """
    return Path(os.fspath(session_file(session_path)) + JOURNAL_SUFFIX)


class Journal:
    """A session's lifecycle journal. Build it with :meth:`open` or :meth:`in_memory`.

    Args:
        sink: Where the lines go.
        clock: Returns epoch milliseconds; stamps each record.
        operation_machine: The operation table whose final states close an operation; defaults
            to the shipped ``operation`` table.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        clock: Clock = _wall_clock,
        operation_machine: MachineDef | None = None,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._operation_machine = operation_machine
        # What this journal wrote since it was made: whether anything, and the operations it
        # left in a state that is not final (see may_mark_close).
        self._wrote = False
        self._open: set[str] = set()

    @classmethod
    def open(
        cls,
        session_path: str | os.PathLike[str],
        *,
        clock: Clock = _wall_clock,
        operation_machine: MachineDef | None = None,
        exclusive: bool = False,
    ) -> Journal:
        """Return the journal of the session file at ``session_path`` (created on first record).

        Args:
            session_path: The session file.
            clock: Stamps the records.
            operation_machine: See the class.
            exclusive: The caller owns the session (its writer lock, D27) while the journal is
                open, so no other program appends to it: whether the file ends with a torn
                line is checked at the first record after opening, not at every record.
        """
        sink = FileSink(journal_path(session_path), exclusive=exclusive)
        return cls(sink, clock=clock, operation_machine=operation_machine)

    @classmethod
    def in_memory(
        cls, *, clock: Clock = _wall_clock, operation_machine: MachineDef | None = None
    ) -> Journal:
        """Return a journal kept in memory, for an in-memory session."""
        return cls(MemorySink(), clock=clock, operation_machine=operation_machine)

    @property
    def location(self) -> str:
        """The journal's path, or ``<memory>``."""
        return self._sink.location

    @property
    def in_memory_only(self) -> bool:
        """Whether the records are kept in memory (nothing to wait for; no thread needed)."""
        return isinstance(self._sink, MemorySink)

    @property
    def operation_machine(self) -> MachineDef:
        """The operation table this journal reads final states from."""
        if self._operation_machine is None:
            self._operation_machine = load_machine(OPERATION_MACHINE)
        return self._operation_machine

    def exists(self) -> bool:
        """Whether anything has been journaled (for files: the file exists)."""
        return self._sink.exists()

    @property
    def is_open(self) -> bool:
        """Whether a record is one write: the file is open (always true in memory)."""
        return self._sink.is_open

    def open_file(self) -> None:
        """Open the journal file for appending now (created if missing), not at the next record.

        Creating a file can wait for the file system's own journal while other sessions
        fsync; the runtime calls this from a worker thread before a turn's first record, so
        the event loop does not wait there (issue 9).

        Raises:
            SessionError: The journal is a symbolic link, not a regular file, or cannot be
                created.
        """
        self._sink.open()

    def record(
        self,
        step: Step,
        *,
        operation_id: str | None = None,
        kind: str | None = None,
        data: Mapping[str, Any] | None = None,
        durable: bool | None = None,
    ) -> JournalRecord:
        """Append one step; operation records are fsynced before this returns, unless told.

        Args:
            step: The step a machine took.
            operation_id: The operation's id; required for ``operation`` steps.
            kind: The operation's kind (``compaction``, ``branch_summary``, ``prune``).
            data: Small JSON-serializable facts about the step.
            durable: Fsync before returning (with every record before it); ``None``: only
                operation records. ``False`` writes the line now and leaves durability to a
                later :meth:`sync`.

        Returns:
            The record written.

        Raises:
            ValueError: An operation step without an operation id (a driver bug).
            OSError: The journal file cannot be written.
        """
        value = self._append(step, operation_id, kind, data, durable)
        return JournalRecord(
            time=value["time"],
            machine=step.machine,
            operation_id=operation_id,
            kind=kind,
            source=step.source,
            event=step.event,
            dest=step.dest,
            effects=step.effects,
            data=dict(value["data"]),
        )

    def write_step(
        self,
        step: Step,
        *,
        operation_id: str | None = None,
        kind: str | None = None,
        data: Mapping[str, Any] | None = None,
        durable: bool | None = None,
    ) -> None:
        """:meth:`record`, the same line, without building the record to return.

        The drivers journal every step and never read the record back: a frozen record and its
        JSON copy per step were a few microseconds each, seven steps per compaction (issue 9).

        Raises:
            ValueError: An operation step without an operation id (a driver bug).
            OSError: The journal file cannot be written.
        """
        self._append(step, operation_id, kind, data, durable)

    def _append(
        self,
        step: Step,
        operation_id: str | None,
        kind: str | None,
        data: Mapping[str, Any] | None,
        durable: bool | None,
    ) -> dict[str, Any]:
        is_operation = step.machine == OPERATION_MACHINE
        if is_operation and not operation_id:
            raise ValueError("an operation step needs its operation id")
        details: dict[str, Any] = data if type(data) is dict else dict(data or {})
        error = details.get("error")
        if isinstance(error, str):
            # A provider's error text may echo its key; the journal outlives the process.
            details = {**details, "error": redact(error)}
        # The keys in the documented order (_KEYS, JournalRecord.as_json); the encoder writes
        # the effects' tuple as the array a list would be.
        value = {
            "time": iso_now(self._clock()),
            "machine": step.machine,
            "operationId": operation_id,
            "kind": kind,
            "from": step.source,
            "event": step.event,
            "to": step.dest,
            "effects": step.effects,
            "data": details,
        }
        wanted = is_operation if durable is None else durable
        self._sink.append(_encode_line(value), durable=wanted)
        self._wrote = True
        if is_operation:
            assert operation_id is not None
            if step.dest in self.operation_machine.final:
                self._open.discard(operation_id)
            else:
                self._open.add(operation_id)
        return value

    def may_mark_close(self) -> bool:
        """Whether a clean close may be journaled: records were written, none left open.

        The close record is where the next opening stops looking for operations to settle
        (:func:`unsettled_part`): everything before it was settled or finished. It is written
        only when that holds for what this journal wrote (every operation it began reached a
        final state; what opening found open it settled), and only when it wrote something, so
        a session opened and closed again leaves no journal.
        """
        return self._wrote and not self._open

    def close(self, *, durable: bool = False, unwritten: bool = False) -> None:
        """Close the journal file until the next record (which opens it again). Idempotent.

        Args:
            durable: First make every record written so far durable (a session's close: the
                last records of its operations wait for this fsync, not for one each). A
                failure is logged on the ``orchestrator`` logger, and the file closed anyway.
            unwritten: The session was never written (a new one, closed before its first
                write): an owned journal file that this journal made is removed, records and
                all; one that existed before it was opened is kept.
        """
        sink = self._sink
        if unwritten and isinstance(sink, FileSink) and sink.ours:
            sink.close(remove=True)  # nothing to make durable: the file goes
            return
        if durable and getattr(sink, "unsynced", True):
            try:
                self._sink.sync()
            except (OSError, SessionError) as error:
                _log.warning(
                    "%s: could not make the journal durable at close: %s", self.location, error
                )
        close = getattr(self._sink, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        # A journal opened for one piece of work (a cluster activity) gives its descriptor
        # back when the work ends, not when the collector finds the object: an exception's
        # traceback can hold it in a cycle, and a busy worker would run out of descriptors.
        self.close()

    def sync(self) -> None:
        """Make every record written so far durable (for a file: one fsync).

        It touches only the file, never this object's state, so it may run in a worker thread
        while the event loop goes on.

        Raises:
            SessionError: The journal file cannot be opened to sync it (a symbolic link...).
            OSError: The disk refused the fsync.
        """
        self._sink.sync()

    def observer(
        self,
        *,
        operation_id: str | None = None,
        kind: str | None = None,
        data: Callable[[Step], Mapping[str, Any] | None] | None = None,
    ) -> Callable[[Step], None]:
        """Return a ``Runner`` observer that records every step of one machine.

        Args:
            operation_id: The operation's id, for an operation machine.
            kind: The operation's kind.
            data: Called with each step for its ``data`` (e.g. the ``entryId`` on reaching
                ``committing``).

        Returns:
            The observer, for ``Runner.subscribe``.
        """

        def observe(taken: Step) -> None:
            extra = data(taken) if data is not None else None
            self.record(taken, operation_id=operation_id, kind=kind, data=extra)

        return observe

    def read(self) -> JournalRead:
        """Parse the journal, skipping and reporting damaged lines (never raising for them).

        Returns:
            The records and the problems; empty when nothing has been journaled.
        """
        if not self._sink.exists():
            return JournalRead(records=())
        return parse_journal(self._sink.read())

    def records(self) -> tuple[JournalRecord, ...]:
        """Return the usable records in order (see :meth:`read` for the problems)."""
        return self.read().records

    def open_operations(self) -> tuple[JournaledOperation, ...]:
        """Return the operations left in a non-final state, in order of first record."""
        final = self.operation_machine.final
        if not self._sink.exists():
            return ()
        # A sink that can read from its end (a file) reads only the part after the last close.
        read_unsettled = getattr(self._sink, "read_unsettled", None)
        raw = read_unsettled() if read_unsettled is not None else unsettled_part(self._sink.read())
        records = parse_journal(raw).records
        return tuple(op for op in operations(records) if op.state not in final)
