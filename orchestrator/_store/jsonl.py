"""The JSONL file store: pi's session file, durable appends, atomic rewrites, one writer.

Its byte-level pieces (line encoding, chunked reads, temporary files) are in
:mod:`~orchestrator._store.jsonl_io`; ``write_pi_line`` and ``read_outline`` are re-exported here.
Reading the file and owning it (the lock, the descriptor opened for appending) are in
:mod:`~orchestrator._store.jsonl_file`, with their theory; this module holds the writes.

Theory of operation (decisions D3 and D4):

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
from collections.abc import Sequence
from types import TracebackType

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import EMPTY_TAIL, LoadResult, Tail
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    plan_tail_repair,
    read_session,
    rewrite_refusal,
)
from orchestrator._core.migration import header_version
from orchestrator._store.dirsync import fsync_dir
from orchestrator._store.files import (
    mode_like,
    open_side_file,
    os_failure,
    side_file_name,
)
from orchestrator._store.jsonl_file import JsonlFile
from orchestrator._store.jsonl_io import (
    corrupt_fragment,
    default_owner,
    file_signature,
    link_new,
    open_session_file,
    read_last_line,
    read_outline,
    write_pi_line,
    write_temporary,
)
from orchestrator._store.tail import changed, check_tail, tail_after, tail_of_file
from orchestrator._store.whole import append_whole


class JsonlStore(JsonlFile):
    """A session kept in a pi-compatible JSONL file.

    Args:
        path: The session file. It need not exist yet.
        fsync: ``"always"`` (fsync after every append), ``"per_turn"`` (at :meth:`sync` and
            :meth:`close`) or ``"never"``.
        lock: Take the single-writer lock at the first write. Turn off only where another
            mechanism guarantees one writer.
        random_hex: Randomness for ids a v1 migration assigns on load (tests inject it).
    """

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
