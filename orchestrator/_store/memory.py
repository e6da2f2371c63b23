"""A session kept in memory, behind the same protocol as the file store.

I keep the serialized bytes, not the entry objects, so every ``load()`` goes through the same
parser as a file: a round trip through this store proves what a round trip through a file would
(unknown fields kept, damage reported), and tests can start it from damaged bytes. It applies
the file store's rules too: a torn tail is moved aside (into :attr:`MemoryStore.corrupt`) before
the first write, and a damaged session is never rewritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    plan_tail_repair,
    read_session,
    rewrite_refusal,
)
from orchestrator._core.migration import RandomHex, header_version, uuid_hex
from orchestrator._store.jsonl import write_pi_line
from orchestrator._store.protocol import LoadResult


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

    def load(self) -> LoadResult:
        """Parse the stored bytes, reporting problems (D3)."""
        return read_session(self.data, random_hex=self._random_hex).result

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries as whole lines.

        Raises:
            SessionError: For the same reasons as ``JsonlStore.append``.
        """
        if not entries:
            return
        data = b"".join(write_pi_line(entry) for entry in entries)
        state = self._writer()
        refusal = append_refusal(self.location, state, entries)
        if refusal:
            raise SessionError(refusal)
        self._data += data
        if state.result.header is None:
            self._state = read_session(data, random_hex=self._random_hex)

    def rewrite(self, header: Entry, entries: Sequence[Entry]) -> None:
        """Replace everything with ``header`` and ``entries``.

        Raises:
            SessionError: For the same reasons as ``JsonlStore.rewrite``.
        """
        if header.get("type") != "session" or not isinstance(header.get("id"), str):
            raise SessionError(
                f"cannot rewrite {self.location}: the header is not a session header"
            )
        data = b"".join(write_pi_line(entry) for entry in (header, *entries))
        refusal = rewrite_refusal(self.location, self._writer())
        if refusal:
            raise SessionError(refusal)
        self._data = bytearray(data)
        result = LoadResult(header=header, entries=list(entries))
        self._state = ParsedSession(result=result, stored_version=header_version(header))

    def repair_torn_tail(self) -> bytes:
        """Move a torn last line into :attr:`corrupt`; return the bytes moved."""
        plan = plan_tail_repair(self.data)
        if plan is None:
            return b""
        if plan.add_newline:
            self._data += b"\n"
        else:
            self.corrupt += plan.moved
            del self._data[plan.keep :]
        return plan.moved

    def sync(self) -> None:
        """Nothing to make durable."""

    def close(self) -> None:
        """Forget the checked state; the next write checks the data again."""
        self._state = None

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
