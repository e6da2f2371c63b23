"""A session kept in memory, behind the same protocol as the file store.

I keep the serialized bytes, not the entry objects, so every ``load()`` goes through the same
parser as a file: a round trip through this store proves what a round trip through a file would
(unknown fields kept, damage reported), and tests can start it from damaged bytes. It applies
the file store's rules too: a torn tail is moved aside (into :attr:`MemoryStore.corrupt`) before
the first write, and a damaged session is never rewritten. Ownership and conditional writes
(D27) follow the file store's contract: the store object is what two owners would share, and
its bytes are what a conditional write checks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError, SessionLockedError
from orchestrator._core.load_result import LoadResult, Tail
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    plan_tail_repair,
    read_session,
    rewrite_refusal,
)
from orchestrator._core.migration import RandomHex, header_version, uuid_hex
from orchestrator._store.jsonl import write_pi_line
from orchestrator._store.tail import check_tail, tail_after, tail_of_bytes


class MemoryStore:
    """A session held as bytes in memory.

    Args:
        data: Initial content, as a session file would hold it.
        name: Shown in :attr:`location` and in error messages.
        random_hex: Randomness for ids a v1 migration assigns on load.
    """

    def __init__(
        self, data: bytes = b"", *, name: str = "memory", random_hex: RandomHex = uuid_hex
    ) -> None:
        self._data = bytearray(data)
        self._name = name
        self._random_hex = random_hex
        self._state: ParsedSession | None = None
        self._owner: str | None = None
        self._end: Tail | None = None
        self.corrupt = bytearray()
        """Torn tails moved aside, like the file store's ``.corrupt`` side file."""

    @property
    def location(self) -> str:
        """``<memory:NAME>``."""
        return f"<memory:{self._name}>"

    @property
    def data(self) -> bytes:
        """The stored bytes, exactly as a file would hold them."""
        return bytes(self._data)

    def exists(self) -> bool:
        """True when anything is stored."""
        return bool(self._data)

    @property
    def owner(self) -> str | None:
        """Who owns this store (see :meth:`own`), or ``None``."""
        return self._owner

    def load(self) -> LoadResult:
        """Parse the stored bytes, reporting problems (D3)."""
        data = self.data
        result = read_session(data, random_hex=self._random_hex).result
        result.tail = self._end = tail_of_bytes(data)
        return result

    def tail(self) -> Tail:
        """Where the stored bytes end now: the last entry id and the length (D27)."""
        return tail_of_bytes(self.data)

    def own(self, owner: str) -> None:
        """Own the store until :meth:`close`; a second owner is refused (D27).

        Raises:
            SessionLockedError: Someone else owns it.
        """
        if self._owner is not None:
            raise SessionLockedError(
                f"{self.location}: session is being changed by pid {os.getpid()} ({self._owner})"
            )
        self._owner = owner

    def append(self, entries: Sequence[Entry], *, expect: Tail | None = None) -> Tail:
        """Append entries as whole lines.

        Args:
            entries: The entries to write.
            expect: Write only if the store still ends here (D27).

        Returns:
            Where the store ends after the write, as this store accounts for it (see
            ``JsonlStore.append``).

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
            SessionError: For the same reasons as ``JsonlStore.append``.
        """
        if not entries:
            return expect or self._end or self.tail()
        if expect is not None:  # reading the tail scans the data: only for a conditional write
            check_tail(self.location, expect, self.tail())
        data = b"".join(write_pi_line(entry) for entry in entries)
        base = expect or self._end or self.tail()
        before = len(self._data)
        state = self._writer()
        refusal = append_refusal(self.location, state, entries)
        if refusal:
            raise SessionError(refusal)
        length = base.length + len(self._data) - before  # the tail repair's change, if any
        self._data += data
        if state.result.header is None:
            self._state = read_session(data, random_hex=self._random_hex)
        self._end = tail_after(base, entries, length + len(data))
        return self._end

    def rewrite(
        self, header: Entry, entries: Sequence[Entry], *, expect: Tail | None = None
    ) -> Tail:
        """Replace everything with ``header`` and ``entries``.

        Args:
            header: The session header.
            entries: Every entry, in order.
            expect: Replace only if the store still ends here (D27).

        Returns:
            Where the store ends after the rewrite.

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
            SessionError: For the same reasons as ``JsonlStore.rewrite``.
        """
        if header.get("type") != "session" or not isinstance(header.get("id"), str):
            raise SessionError(
                f"cannot rewrite {self.location}: the header is not a session header"
            )
        if expect is not None:
            check_tail(self.location, expect, self.tail())
        data = b"".join(write_pi_line(entry) for entry in (header, *entries))
        refusal = rewrite_refusal(self.location, self._writer())
        if refusal:
            raise SessionError(refusal)
        self._data = bytearray(data)
        result = LoadResult(header=header, entries=list(entries))
        self._state = ParsedSession(result=result, stored_version=header_version(header))
        self._end = tail_after(None, entries, len(data))
        return self._end

    def repair_torn_tail(self) -> bytes:
        """Move a torn last line into :attr:`corrupt`; return the bytes moved."""
        plan = plan_tail_repair(self.data)
        if plan is None:
            return b""
        if plan.add_newline:
            self._data += b"\n"
        else:
            self.corrupt += plan.moved + b"\n"  # a line of its own, as in the file store's
            del self._data[plan.keep :]
        return plan.moved

    def sync(self) -> None:
        """Nothing to make durable."""

    def close(self) -> None:
        """Forget the checked state and the owner; the next write checks the data again."""
        self._state = None
        self._owner = None

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _writer(self) -> ParsedSession:
        if self._state is None:
            self._state = read_session(self.data, random_hex=self._random_hex)
            self.repair_torn_tail()
        return self._state
