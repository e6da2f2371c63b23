"""A session file as a store reads it and owns it: loading, stamps, the tail, the writer lock.

:class:`~orchestrator._store.jsonl.JsonlStore` builds on :class:`JsonlFile`: this module holds
what comes before any write (reading and rereading the file, the stamps that tell whether it
changed, where it ends, the owner lock and the descriptor opened for appending, synced and
closed); the store's own module holds the writes themselves (appends, rewrites, the tail repair
and the conditional checks). They are apart because reading never writes (D3), and the writes
only ask this part for "the file, open and locked" (:meth:`JsonlFile._writer`).

Theory of operation (decisions D3 and D27):

* **Reading never writes.** :meth:`JsonlStore.load` reads the bytes and parses them with
  :func:`~orchestrator._core.loading.parse_session_bytes`; damage becomes a list of problems.
* **One writer, the owner** (D27). A process that will change the session calls :meth:`own`
  before it reads what it acts on; a store that writes without owning takes the same lock at
  its first write. The lock is :class:`~orchestrator._store.owner.OwnerLock` (its module says
  why it is a side file that its holder deletes); it is released at :meth:`close`.
* **A killed writer's litter goes.** A rewrite's temporary file is written only while the
  lock is held, and a writer killed before its rename leaves it (a whole copy of the session)
  beside the session, with the lock's side file still naming it. The next store to take the
  lock over from such a killed owner removes the session's leftover temporary files: nobody else
  can be writing them. A lock let go normally was deleted, so most acquisitions never look.
* **One name per written file** (D27). The lock and the journal are named after the session
  file, so a file with two names (a hard link) would have two of each: two owners could both
  append, and an operation left half-done under one name would never be settled under the
  other. Such a file is read like any other but never written: :meth:`own` refuses it and lets
  the lock go again (so before any model is called; it looks only once it holds the lock, when
  a killed writer's temporary file, maybe a second name of the file, is gone), and so does
  opening the writer, from the opened descriptor, for a store that writes without owning.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from stat import S_ISREG

from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import EMPTY_TAIL, LoadResult, Tail
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    read_session_chunks,
)
from orchestrator._core.migration import RandomHex, uuid_hex
from orchestrator._store.dirsync import fsync_dir
from orchestrator._store.files import os_failure, session_file
from orchestrator._store.jsonl_io import (
    default_owner,
    file_signature,
    open_session_file,
    parse_file,
    read_chunks,
    refuse_shared,
    remove_temporaries,
)
from orchestrator._store.owner import OwnerLock
from orchestrator._store.protocol import FsyncPolicy
from orchestrator._store.tail import tail_of_file


class JsonlFile:
    """The reading and owning half of a :class:`~orchestrator._store.jsonl.JsonlStore`.

    It takes the arguments ``JsonlStore`` documents.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "per_turn",
        lock: bool = True,
        random_hex: RandomHex = uuid_hex,
    ) -> None:
        # The file itself, when `path` is a symbolic link: its lock, journal and rewrites are
        # the file's, whatever name it was opened by (files.session_file).
        self.path = session_file(path)
        self._owner_lock = OwnerLock(self.path)
        self.lock_path = self._owner_lock.path
        self.corrupt_path = Path(f"{self.path}.corrupt")
        self._policy: FsyncPolicy = fsync
        self._use_lock = lock
        self._random_hex = random_hex
        self._fd: int | None = None
        self._repaired = False
        self._dirty = False
        self._state: ParsedSession | None = None
        self._loaded: tuple[tuple[int, int, int, int], ParsedSession] | None = None
        self._end: Tail | None = None
        # The stamp of the file when this store last read it whole and found it ending on a
        # newline, its end then being `_end`: while the open file still has that stamp, the
        # first write needs to read neither its tail nor its last line (see _known_clean).
        self._clean_stamp: tuple[int, int, int, int] | None = None
        self.private_like: Path | None = None
        """A session file whose privacy a new file here keeps (a fork's source): created, this
        file is no more open to the group and others than that one (``files.mode_like``)."""

    @property
    def location(self) -> str:
        """The file's path as given."""
        return str(self.path)

    def known_refusal(self) -> str | None:
        """Why an append would be refused, as far as the file as last read tells (D3, D27).

        A header this version cannot write after (version 4, say), or a file that is not a
        session, refuses every append; so does a torn last line whose ``.corrupt`` side file
        is not a file to append to. All are known when the file is read, so a compaction asks
        here before its model call is paid for, not at its commit.
        """
        known = self._state or (self._loaded[1] if self._loaded is not None else None)
        if known is None:
            return None
        codes = {problem.code for problem in known.result.problems}
        if known.write_refusal is not None or "not_session" in codes:
            return append_refusal(self.location, known, [])
        if "torn_line" in codes:
            return self._corrupt_refusal()
        return None

    def _corrupt_refusal(self) -> str | None:
        try:
            found = os.lstat(self.corrupt_path)
        except FileNotFoundError:
            return None  # made when the torn line is moved
        except OSError as exc:
            return f"{self.corrupt_path}: cannot keep the torn last line there: {exc.strerror}"
        where = f"{self.corrupt_path}: cannot keep the torn last line of {self.location} there"
        if not stat.S_ISREG(found.st_mode):
            return f"{where}: it is not a regular file"
        if found.st_nlink > 1:  # as the store says it when it opens the file (files.py)
            return (
                f"{self.corrupt_path}: has {found.st_nlink} names (hard links); "
                "refusing to write a side file another file shares"
            )
        return None

    @property
    def owned(self) -> bool:
        """Whether this store holds the writer lock."""
        return self._owner_lock.held

    @property
    def writer_open(self) -> bool:
        """Whether the file is open for appending (an append is then one ``write``)."""
        return self._fd is not None

    def open_writer(self) -> None:
        """Take the writer lock and open the file for appending now, not at the next write.

        Opening reads what the file holds when it changed since it was loaded; the runtime
        calls this from a worker thread so the event loop does not wait for it (issue 9).

        Raises:
            SessionLockedError: Another store or process is writing this file.
            SessionError: The file cannot be opened for writing.
        """
        self._writer()

    def exists(self) -> bool:
        """True when the file exists and is not empty.

        A size of 0 is checked by reading: a file of the kernel's (``/proc/self/status``) says
        0 and has content, and taking it for an empty file made it a new, empty session.
        """
        try:
            if self.path.stat().st_size > 0:
                return True
            fd = open_session_file(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except (OSError, SessionError):
            return False  # nothing readable, or not a file: loading or writing says why
        try:
            return bool(os.read(fd, 1))
        except OSError:
            return False
        finally:
            os.close(fd)

    def load(self) -> LoadResult:
        """Read and parse the file; a missing file loads as empty. Never writes (D3).

        A writer left open is closed first (synced per the policy; the lock is kept): reading
        again means the file may have been replaced, and the next write opens the file that is
        at the path now.

        Raises:
            SessionError: The file cannot be read (permissions, a folder...).
        """
        if self._fd is not None:
            self.sync()
            self._close_fd()
            self._state = None
        self._clean_stamp = None
        read = parse_file(self.path, self._random_hex, outline=False)
        if read is None:
            self._loaded, self._end = None, EMPTY_TAIL
            return LoadResult(header=None)
        stat, parsed, last = read
        self._end = parsed.result.tail
        self._loaded = (file_signature(stat), parsed)
        if self._end.length == stat.st_size and (not last or last.endswith(b"\n")):
            self._clean_stamp = self._loaded[0]
        return parsed.result

    def stamp(self) -> tuple[int, int, int, int] | None:
        """The file's identity, size and change time now; ``None`` when there is no file.

        Two equal stamps mean no write happened in between, as far as the file system can
        tell: an append changes the size, a rewrite (a rename) the inode, and any write the
        change time (nanoseconds).

        Raises:
            SessionError: The file cannot be read.
        """
        try:
            return file_signature(os.stat(self.path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_failure(self.path, "read it", exc) from exc

    @property
    def loaded(self) -> tuple[tuple[int, int, int, int], ParsedSession] | None:
        """The last parse this store made or was primed with, and the stamp of the file then."""
        return self._loaded

    @property
    def written(self) -> None:
        """Always ``None``: a file's stamp after a write cannot be read in the same step.

        Another program (pi) may append between this store's write and a ``stat``, so a stamp
        read then could vouch for bytes this store never parsed.
        """
        return None

    def prime(self, stamp: tuple[int, int, int, int], parsed: ParsedSession) -> None:
        """Take a parse another store of this file made at ``stamp`` as this store's own.

        The first write uses it only if the file still has that stamp (else it reads the file
        again), and compares the tail before writing as always (D27).
        """
        self._loaded = (stamp, parsed)
        self._end = parsed.result.tail
        self._clean_stamp = None  # whether that parse ended on a newline is not known here

    def tail(self) -> Tail:
        """Where the file ends now: its last entry id and its length (read fresh, D27).

        Raises:
            SessionError: The file cannot be read.
        """
        if self._fd is not None:
            return tail_of_file(self._fd, os.fstat(self._fd).st_size)
        try:
            fd = open_session_file(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return EMPTY_TAIL
        except OSError as exc:
            raise os_failure(self.path, "read it", exc) from exc
        try:
            return tail_of_file(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def own(self, owner: str) -> None:
        """Take the writer lock now, without waiting, until :meth:`close` (D27).

        Nothing is written to the session file: a process that owns it and then fails leaves
        it byte-identical.

        Args:
            owner: Who changes the session (``"orchestrator compact"``), for the refusal.

        Raises:
            SessionLockedError: ``session is being changed by pid N (owner)``.
            SessionError: The session file has other names (hard links), or the lock's side
                file cannot be created (read-only or missing folder, a symbolic link in its
                place).
        """
        held = self.owned
        self._lock(owner)  # first: a killed writer's temporary file may be a second name
        try:
            named = os.stat(self.path)
            if S_ISREG(named.st_mode):  # a folder has names too (its entries' ".."): not ours
                refuse_shared(self.path, named.st_nlink)
        except OSError:
            pass  # a new session (one name, when created), or one the load reports in a line
        except SessionError:
            if not held:
                self._owner_lock.release()  # deletes the side file: nothing is left behind
            raise

    def sync(self) -> None:
        """Fsync what was appended since the last sync (the ``per_turn`` boundary)."""
        if self._fd is not None and self._dirty and self._policy != "never":
            self._fsync(self._fd)
        self._dirty = False

    def _fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:  # an I/O error: say which file
            raise os_failure(self.path, "make what was appended durable", exc) from exc

    def close(self) -> None:
        """Sync per the policy, close the file and release the writer lock. Idempotent."""
        try:
            self.sync()
        finally:
            self._close_fd()
            self._state = None
            self._owner_lock.release()

    def _lock(self, owner: str) -> None:
        """Take the owner lock; after a killed owner, remove its temporary files (docstring)."""
        if self._owner_lock.held:
            return
        self._owner_lock.acquire(owner)
        if self._owner_lock.took_over:
            remove_temporaries(self.path)

    def _writer(self) -> int:
        if self._fd is None:
            self._open_writer()
        assert self._fd is not None
        return self._fd

    def _open_writer(self) -> None:
        """Lock, open for appending and learn what the file holds (the tail is repaired later)."""
        if self._use_lock:
            self._lock(default_owner())
        created = not self.path.exists()
        try:
            fd = open_session_file(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        except OSError as exc:
            raise os_failure(self.path, "write it", exc) from exc
        try:
            if created and self._policy != "never":
                fsync_dir(self.path.parent)  # a new file's name is durable only this way
            stat = os.fstat(fd)
            refuse_shared(self.path, stat.st_nlink)
            loaded = self._loaded
            # Parsing a big file twice is wasteful: reuse the last load if the file is unchanged.
            # A torn tail does not matter for that: the refusals ignore it.
            if loaded is not None and loaded[0] == file_signature(stat):
                state = loaded[1]
            else:
                state = read_session_chunks(
                    read_chunks(fd), size=stat.st_size, random_hex=self._random_hex
                )
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._state, self._repaired = fd, state, False

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
