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

Settling (:func:`settle_unfinished_operations`) reads the open operations when the session is
opened again and closes each with the operation table's own ``reopened`` row, without calling any
model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator._core.entries import iso_now
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import Problem
from orchestrator._core.redact import redact
from orchestrator._lifecycle.machine import MachineDef, Step, load_machine
from orchestrator._store.dirsync import DIRECTORIES
from orchestrator._store.files import (
    open_side_file,
    read_side_file,
    read_side_file_tail,
    session_file,
)
from orchestrator._store.whole import append_whole

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds."""

JOURNAL_SUFFIX = ".journal"
JOURNAL_MODE = 0o600
"""A journal file is created readable and writable by its owner only."""
OPERATION_MACHINE = "operation"
_KEYS = ("time", "machine", "operationId", "kind", "from", "event", "to", "effects", "data")


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


class _Sink(Protocol):
    location: str

    def exists(self) -> bool: ...

    def read(self) -> bytes: ...

    def append(self, line: bytes, *, durable: bool) -> None: ...

    def sync(self) -> None: ...

    @property
    def is_open(self) -> bool: ...

    def open(self) -> object: ...


class _FileSink:
    """The journal file, opened at the first append and kept open until :meth:`close`.

    Each append is one write (fsynced when asked). Before it, the sink checks that the file
    ends with a complete line (a process killed mid-write leaves a torn one, and another program
    may have appended one). When the file still has the size this sink's own last complete
    write left, that write's newline ends it: no need to read the last byte (issue 9). An
    exclusive sink (its session owned) checks only before its first write after opening.
    """

    def __init__(self, path: Path, *, exclusive: bool = False) -> None:
        self.path = path
        self.location = str(path)
        self._exclusive = exclusive
        self._dir_synced = False
        self._ticket = 0  # for the folder fsync that makes the file's name durable (dirsync.py)
        self._clean_size = -1  # the size after this sink's last complete write
        self._appended = False  # by this sink, since it was made
        self._made = False  # the file did not exist when this sink opened it (it is ours)
        self.unsynced = False  # written by this sink since its last fsync
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], _FileSink] | None = None
        self._closing = threading.Lock()

    def exists(self) -> bool:
        # lstat: anything in the journal's place counts as present (a symbolic link, a folder,
        # a pipe), so reading it is refused with its reason, not taken for "nothing journaled".
        return os.path.lexists(self.path)

    def read(self) -> bytes:
        return read_side_file(self.path, "read the journal") or b""

    def read_unsettled(self) -> bytes:
        # From the end, until the last close mark: a journal of a session run for months is
        # not read (nor held) whole at each opening, only its last run's records.
        return read_side_file_tail(self.path, "read the journal", _after_last_close) or b""

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def open(self) -> int:
        """Open (or create) the file for appending, once; the descriptor."""
        fd = self._fd
        if fd is None:
            # Never through a symbolic link: the journal stays beside its session (issue 8).
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
            # 0600 whatever the session's mode: the journal holds error texts and the details of
            # every step, and the owner alone runs the operations it records. (A journal made
            # before stays as it is.)
            made = not os.path.lexists(self.path)
            fd = self._fd = open_side_file(self.path, flags, "write the journal", JOURNAL_MODE)
            self._made = self._made or made
            # At every opening: the file may be new again (an empty one is removed at close).
            self._ticket = DIRECTORIES.ticket()
            # Closed with the sink if nobody closes it (a journal is not always closed).
            self._closer = weakref.finalize(self, os.close, fd)
        return fd

    def append(self, line: bytes, *, durable: bool) -> None:
        fd = self.open()
        if self._exclusive and self._clean_size >= 0:
            # Nobody else appends while the session is owned (D27): the file ends where this
            # sink's last write left it, on a newline. One system call per record (issue 9).
            size = self._clean_size
        else:
            size = os.fstat(fd).st_size
            if size and size != self._clean_size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # keep a torn line apart from this record
        self._clean_size = -1  # until the whole line is written
        # The whole record or nothing, naming the file (a full disk, a quota): a short write
        # is cut off again (whole.py), so no torn record is left for the next one to follow.
        append_whole(fd, self.path, line, "write the journal")
        self._appended = True  # (not before: a journal still empty at close goes)
        self._clean_size = size + len(line)
        self.unsynced = True
        if durable:
            os.fsync(fd)
            self.unsynced = False
            self._sync_dir_once()

    @property
    def ours(self) -> bool:
        """Whether every record in the file is this sink's: it made the file, owning the session."""
        return self._exclusive and self._made

    def close(self, *, remove: bool = False) -> None:
        with self._closing:  # not under a sync in a worker thread
            fd, closer, self._closer, self._fd = self._fd, self._closer, None, None
            self._clean_size = -1  # others may write it once closed: look again at reopening
            if closer is None:
                return
            if remove and self.ours:
                self._remove_own()
            elif fd is not None and self._exclusive and not self._appended:
                self._remove_if_empty(fd)
            closer()

    def _remove_own(self) -> None:
        # The session was never written and this sink made the file: every record in it is
        # this owner's, about attempts that could not have applied anything (there is no
        # file to apply them to), so nothing is left to settle. Left behind, it would sit
        # beside no session, and a new session made at the same path would take its records
        # for its own history. A journal that was there before is never removed.
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._made = False
        self._dir_synced = False  # a journal made again later is a new name

    def _remove_if_empty(self, fd: int) -> None:
        # An owned session's journal is opened with the session, before anything is recorded:
        # one that is still empty at close was only opened, and goes (nobody else writes it
        # while the session is owned, D27). Left behind, an empty journal is harmless.
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:
                os.unlink(self.path)
                self._dir_synced = False  # a journal made again later is a new name

    def sync(self) -> None:
        # fsync flushes the file, not the descriptor: whatever any descriptor wrote before now.
        # The open descriptor when there is one (one system call, not four: issue 9), held
        # against a close meanwhile (this runs in worker threads); else the file, opened as
        # every side file is: a symbolic link (even a dangling one), a pipe or a device is
        # refused; only a missing file means there is nothing to sync.
        with self._closing:
            if self._fd is not None:
                os.fsync(self._fd)
                self.unsynced = False
                self._sync_dir_once()
                return
        try:
            fd = open_side_file(self.path, os.O_RDONLY, "sync the journal")
        except SessionError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return  # nothing journaled yet
            raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_dir_once()

    def _sync_dir_once(self) -> None:
        if not self._dir_synced:
            # The file may have been created by this process, maybe by a turn record that was
            # not fsynced: its name is durable only once the folder is. Once per journal, and
            # not even that when a folder fsync since the file was opened covered it: the
            # journals of a thousand sessions in one folder share a few (issue 9).
            if not self._ticket:
                self._ticket = DIRECTORIES.ticket()  # it exists: it was just fsynced
            DIRECTORIES.sync(self.path.parent, self._ticket)
            self._dir_synced = True


class _MemorySink:
    """The journal of an in-memory session: the same bytes, kept in a buffer."""

    location = "<memory>"

    def __init__(self) -> None:
        self.buffer = bytearray()

    def exists(self) -> bool:
        return True

    def read(self) -> bytes:
        return bytes(self.buffer)

    def append(self, line: bytes, *, durable: bool) -> None:
        self.buffer += line  # always whole lines: nothing in memory can tear

    def sync(self) -> None:
        pass  # nothing in memory is durable, nor claims to be

    is_open = True

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


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
        sink: _Sink,
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
        sink = _FileSink(journal_path(session_path), exclusive=exclusive)
        return cls(sink, clock=clock, operation_machine=operation_machine)

    @classmethod
    def in_memory(
        cls, *, clock: Clock = _wall_clock, operation_machine: MachineDef | None = None
    ) -> Journal:
        """Return a journal kept in memory, for an in-memory session."""
        return cls(_MemorySink(), clock=clock, operation_machine=operation_machine)

    @property
    def location(self) -> str:
        """The journal's path, or ``<memory>``."""
        return self._sink.location

    @property
    def in_memory_only(self) -> bool:
        """Whether the records are kept in memory (nothing to wait for; no thread needed)."""
        return isinstance(self._sink, _MemorySink)

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
        if unwritten and isinstance(sink, _FileSink) and sink.ours:
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
    read from its end until the mark (:func:`_after_last_close`), not whole.
    """
    start = _after_last_close(raw, True)
    assert start is not None  # the whole journal always has an answer
    return raw[start:]


def _after_last_close(data: bytes, whole: bool) -> int | None:
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
