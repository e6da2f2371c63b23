"""The JSONL file store: pi's session file, durable appends, atomic rewrites, one writer.

Its byte-level pieces (line encoding, chunked reads, temporary files) are in
:mod:`~orchestrator._store.jsonl_io`; ``write_pi_line`` and ``read_outline`` are re-exported here.

Theory of operation (decisions D3 and D4):

* **Reading never writes.** :meth:`JsonlStore.load` reads the bytes and parses them with
  :func:`~orchestrator._core.loading.parse_session_bytes`; damage becomes a list of problems.
* **The first write checks the file.** The first append, rewrite or tail repair takes the writer
  lock, moves a torn last line aside (into ``<path>.corrupt``, appended, never overwritten, as a
  line of its own so that two torn lines kept there stay two; see :func:`as_fragment`) and
  looks at what the file holds. A damaged file may still be appended to, since appending keeps
  every byte, but never rewritten, since a rewrite keeps only what loaded. pi overwrites such a
  file with a fresh header; I refuse and say why.
* **Appends are whole lines in one ``os.write``** on an ``O_APPEND`` descriptor, so a crash
  leaves at worst one torn line at the end, which the next writer moves aside. The fsync policy
  decides when they become durable: after every append, at :meth:`sync` (once per turn), or
  never.
* **Rewrites are atomic**: a temporary file in the same directory, fsynced, renamed over the
  original, then the directory fsynced. A crash leaves the old file or the new one, never a mix.
  A rewrite that creates the file (a fork, a new session's first write) writes it whole the
  same way and gives it its name last, by a hard link that fails if the name was taken: a crash
  leaves no file at all, never an empty one that passes ``check`` and makes a retry "already
  exists", and nothing that appeared meanwhile is replaced.
  Rewrites and tail repairs fsync whatever the policy says: they replace or cut data, and an
  unsynced rename is exactly how files end up empty after a power cut.
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
* **Conditional writes** (D27). pi appends without our lock, so a commit passes the
  :class:`~orchestrator._store.protocol.Tail` it planned from and I compare it with the file's
  end before writing: same inode, same length, same last entry id, else
  :class:`~orchestrator._core.errors.ConflictError` and nothing is written. The size and
  inode are checked once more as the last system calls before the write (after the tail
  repair, and after a rewrite's copy is fsynced), so the window left to an appender that
  ignores the lock is the gap between those calls and the write, which no lock it ignores can
  close; :meth:`JsonlStore._recheck` says what such an append does.
"""

from __future__ import annotations

__all__ = ["JsonlStore", "read_outline", "write_pi_line"]

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from stat import S_ISREG
from types import TracebackType

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import EMPTY_TAIL, LoadResult, Tail
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    plan_tail_repair,
    read_session,
    read_session_chunks,
    rewrite_refusal,
)
from orchestrator._core.migration import RandomHex, header_version, uuid_hex
from orchestrator._store.dirsync import fsync_dir
from orchestrator._store.files import (
    mode_like,
    open_side_file,
    os_failure,
    session_file,
    side_file_name,
)
from orchestrator._store.jsonl_io import (
    corrupt_fragment,
    default_owner,
    file_signature,
    link_new,
    open_session_file,
    parse_file,
    read_chunks,
    read_last_line,
    read_outline,
    refuse_shared,
    remove_temporaries,
    write_pi_line,
    write_temporary,
)
from orchestrator._store.owner import OwnerLock
from orchestrator._store.protocol import FsyncPolicy
from orchestrator._store.tail import changed, check_tail, tail_after, tail_of_file
from orchestrator._store.whole import append_whole


class JsonlStore:
    """A session kept in a pi-compatible JSONL file.

    Args:
        path: The session file. It need not exist yet.
        fsync: ``"always"`` (fsync after every append), ``"per_turn"`` (at :meth:`sync` and
            :meth:`close`) or ``"never"``.
        lock: Take the single-writer lock at the first write. Turn off only where another
            mechanism guarantees one writer.
        random_hex: Randomness for ids a v1 migration assigns on load (tests inject it).
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

    def append(self, entries: Sequence[Entry], *, expect: Tail | None = None) -> Tail:
        """Append entries as whole lines in one write, fsynced per the policy.

        Args:
            entries: The entries to write.
            expect: Write only if the file still ends here (D27).

        Returns:
            Where the file ends after the write, as this store accounts for it: an append by
            another program that this store never read is not counted, so a later conditional
            write still sees it.

        Raises:
            SessionLockedError: Another store or process is writing this file.
            ConflictError: The file no longer ends at ``expect``; nothing was written.
            SessionError: The file is not a session file, is a v1 file not yet rewritten, or
                has no header and the first entry is not one; or an entry is not JSON.
        """
        if not entries:
            return expect or self._end or self.tail()
        data = b"".join(write_pi_line(entry) for entry in entries)
        fd = self._writer()
        base = self._check(fd, expect) if expect is not None else self._end
        assert self._state is not None  # set by _writer
        refusal = append_refusal(self.location, self._state, entries)
        if refusal:
            raise SessionError(refusal)
        if base is None:
            base = tail_of_file(fd, os.fstat(fd).st_size)
        length = base.length + self._repair_once(fd)
        self._clean_stamp = None
        if expect is not None:
            self._recheck(fd, length)  # the last system calls before the write: see _recheck
        self._write(fd, data)
        if self._policy == "always":
            self._fsync(fd)
        else:
            self._dirty = True
        if self._state.result.header is None:
            self._state = read_session(data, random_hex=self._random_hex)
        self._end = tail_after(base, entries, length + len(data))
        return self._end

    def rewrite(
        self, header: Entry, entries: Sequence[Entry], *, expect: Tail | None = None
    ) -> Tail:
        """Replace the file atomically with ``header`` and ``entries``.

        Args:
            header: The session header.
            entries: Every entry, in order.
            expect: Replace only if the file still ends here (D27).

        Returns:
            Where the file ends after the rewrite.

        Raises:
            SessionLockedError: Another store or process is writing this file.
            ConflictError: The file no longer ends at ``expect``; nothing was written.
            SessionError: ``header`` is not a session header, or the file has problems a
                rewrite would erase (D3; see :func:`~orchestrator._core.loading.rewrite_refusal`).
        """
        if header.get("type") != "session" or not isinstance(header.get("id"), str):
            raise SessionError(
                f"cannot rewrite {self.location}: the header is not a session header"
            )
        # Lines, not one joined copy: a fork of 200,000 entries held both (250 MB), two at once
        # in a server. They are written a batch at a time (_write_temporary).
        data = [write_pi_line(entry) for entry in (header, *entries)]
        # Refuse from what was loaded before taking the writer, whose first act is to move a torn
        # tail aside: a refused rewrite must leave the file exactly as it was.
        known = self._state or (self._loaded[1] if self._loaded is not None else None)
        early = rewrite_refusal(self.location, known) if known is not None else None
        if early:
            raise SessionError(early)
        if self._fd is None and not os.path.lexists(self.path):
            return self._create(header, entries, data, expect)
        fd = self._writer()
        checked = self._check(fd, expect) if expect is not None else None
        assert self._state is not None
        refusal = rewrite_refusal(self.location, self._state)
        if refusal:
            raise SessionError(refusal)
        delta = self._repair_once(fd)
        self._clean_stamp = None
        temporary = write_temporary(self.path, data, self.path.stat().st_mode & 0o7777)
        try:
            if checked is not None:
                # Writing and fsyncing the copy took a while: what pi appended meanwhile would
                # be replaced by it, lost. Checked again, right before the rename.
                self._recheck(fd, checked.length + delta)
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)
        # The old descriptor still points at the replaced file: reopen on the new one.
        self._close_fd()
        return self._written_whole(header, entries, sum(map(len, data)))

    def _create(
        self, header: Entry, entries: Sequence[Entry], data: list[bytes], expect: Tail | None
    ) -> Tail:
        """Write a new file whole, then name it: a crash leaves no file (module docstring).

        Raises:
            SessionLockedError: Another store or process is writing this file.
            ConflictError: ``expect`` is not the end of an empty store; nothing was written.
            SessionError: The name was taken meanwhile (nothing replaced), or the folder
                refuses the file.
        """
        if side_file_name(self.path):
            raise SessionError(
                f"{self.path}: a new session cannot take a side file's name (.lock, .journal, "
                ".corrupt, or a rewrite's .NAME.tmp): another session's would be written over it"
            )
        if self._use_lock:
            self._lock(default_owner())
        if expect is not None:
            check_tail(self.location, expect, EMPTY_TAIL)
        like = self.private_like
        temporary = write_temporary(
            self.path, data, None, 0o666 if like is None else mode_like(like)
        )
        try:
            link_new(temporary, self.path)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
        try:
            self._fd = open_session_file(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise os_failure(self.path, "write it", exc) from exc
        return self._written_whole(header, entries, sum(map(len, data)))

    def _written_whole(self, header: Entry, entries: Sequence[Entry], length: int) -> Tail:
        """Take a file just written whole as this store's state (its writer already open)."""
        self._repaired = True
        self._dirty = False
        self._loaded = None
        result = LoadResult(header=header, entries=list(entries))
        self._state = ParsedSession(result=result, stored_version=header_version(header))
        self._end = tail_after(None, entries, length)
        return self._end

    def repair_torn_tail(self) -> bytes:
        """Make the file end on a whole line before writing (D3); takes the writer lock.

        A torn last line is appended to ``<path>.corrupt`` and cut from the file; a whole last
        line missing its newline gets one. Every write does this first, once.

        Returns:
            The bytes moved aside (empty when there was no torn line).
        """
        fd = self._writer()
        self._repaired = True
        moved, _ = self._repair(fd)
        return moved

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

    def __enter__(self) -> JsonlStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------

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

    def _still_ours(self, fd: int) -> os.stat_result:
        """``fd``'s status, once the file at the path is known to be ``fd``'s file (D27).

        Raises:
            ConflictError: the file was removed or replaced; nothing written.
        """
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            raise changed(self.location, "the file was removed") from None
        held = os.fstat(fd)
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise changed(self.location, "the file was replaced")
        return held

    def _check(self, fd: int, expect: Tail) -> Tail:
        """Refuse unless the file at the path is ours and still ends at ``expect`` (D27)."""
        held = self._still_ours(fd)
        if self._known_clean(held):
            assert self._end is not None  # set with the stamp
            self._repaired = True  # it ends on a newline: nothing to repair
            return check_tail(self.location, expect, self._end)
        return check_tail(self.location, expect, tail_of_file(fd, held.st_size))

    def _recheck(self, fd: int, length: int) -> None:
        """Refuse unless the file at the path is still ``fd``'s and still ``length`` bytes (D27).

        :meth:`_check` compared the whole tail; between it and the write came the tail repair
        (and, for a rewrite, the copy written and fsynced), and pi appends without our lock.
        This is the same check made cheap (a ``stat`` and an ``fstat``: an append changes the
        size, a rename the inode) and made last, so the write follows it at once.

        What remains is the gap between these calls and the write itself. Python cannot make
        them one system call, and no lock helps against a writer that ignores it. An append
        that lands in that gap is not lost: ``O_APPEND`` puts our whole line after pi's whole
        line, so the file stays valid JSONL, and our entry's parent is then pi's entry's
        sibling (a branch, as if both had been written from the same leaf). A rewrite's rename
        in that gap would replace pi's line; that gap is one ``rename`` wide. Also left: the
        tail repair runs before this check, so an append pi has half written at that instant
        looks like a torn line and is moved to ``.corrupt``.

        Raises:
            ConflictError: the file was removed, replaced, or changed size; nothing written.
        """
        held = self._still_ours(fd)
        if held.st_size != length:
            how = f"it is {held.st_size} bytes long, not the {length} checked just before"
            raise changed(self.location, how)

    def _known_clean(self, held: os.stat_result) -> bool:
        """Whether the open file is still the one loaded, unchanged, ending on a newline.

        Then its tail is the loaded one and it needs no repair, so the first write of a session
        opened and then compacted reads nothing back: the worker thread that commits makes
        three system calls fewer, each a wait for the interpreter's lock while the event loop
        computes (about 7 % of the thousand compactions' wall time, issue 9). The stamp is the
        one that already lets the writer reuse the load's parse (device, inode, size,
        modification time): an append changes the size, a rewrite by rename the inode, and any
        write the modification time.
        """
        return self._clean_stamp is not None and file_signature(held) == self._clean_stamp

    def _repair_once(self, fd: int) -> int:
        """Repair the tail before the first write; returns the change in length."""
        if self._repaired:
            return 0
        _, delta = self._repair(fd)
        self._repaired = True
        return delta

    def _repair(self, fd: int) -> tuple[bytes, int]:
        self._clean_stamp = None
        size = os.fstat(fd).st_size
        offset, last = read_last_line(fd, size)
        plan = plan_tail_repair(last)
        if plan is None:
            return b"", 0
        if plan.add_newline:
            append_whole(fd, self.path, b"\n", "end its last line")
        else:
            created = not self.corrupt_path.exists()
            flags, doing = os.O_RDWR | os.O_APPEND | os.O_CREAT, "keep the torn line"
            side = open_side_file(self.corrupt_path, flags, doing, mode_like(self.path))
            try:
                append_whole(side, self.corrupt_path, corrupt_fragment(side, plan.moved), doing)
                os.fsync(side)  # the copy must be durable before the original is cut
            finally:
                os.close(side)
            if created:
                fsync_dir(self.path.parent)
            os.ftruncate(fd, offset + plan.keep)
        os.fsync(fd)
        return plan.moved, os.fstat(fd).st_size - size

    def _write(self, fd: int, data: bytes) -> None:
        try:
            # Whole lines or nothing: a short write is cut off again (whole.py), so pi's next
            # append, which does not look, starts on a line boundary.
            append_whole(fd, self.path, data, "append to it")
        except BaseException:
            # Should the cut have failed (or an interrupt come mid-write), reopening repairs
            # the tail before our next append.
            self._close_fd()
            raise

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
