"""Where a journal's lines go: its file beside the session, or memory (D24).

Each append is one ``os.write`` of a whole line on an ``O_APPEND`` descriptor, so a crash leaves
at most one torn line at the end; before appending after a torn line the sink writes a newline
first, so the torn bytes stay a line of their own and never swallow the next record.
:mod:`orchestrator._store.journal` decides what to write and when to make it durable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Protocol

from orchestrator._core.errors import SessionError
from orchestrator._store.dirsync import DIRECTORIES
from orchestrator._store.files import open_side_file, read_side_file, read_side_file_tail
from orchestrator._store.journal_records import after_last_close
from orchestrator._store.whole import append_whole

JOURNAL_MODE = 0o600
"""A journal file is created readable and writable by its owner only."""

_log = logging.getLogger("orchestrator")


class Sink(Protocol):
    location: str

    def exists(self) -> bool: ...

    def read(self) -> bytes: ...

    def append(self, line: bytes, *, durable: bool) -> None: ...

    def sync(self) -> None: ...

    @property
    def is_open(self) -> bool: ...

    def open(self) -> object: ...


class FileSink:
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
        self._closer: weakref.finalize[[int], FileSink] | None = None
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
        return read_side_file_tail(self.path, "read the journal", after_last_close) or b""

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


class MemorySink:
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
