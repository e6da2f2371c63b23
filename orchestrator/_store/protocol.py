"""The store protocol: where a session's lines live (decisions D3, D4, D27).

A store holds one session: a header and entries in file order. The core never sees a file;
:class:`~orchestrator.Session` talks to a store through this protocol, so a database store can be
added later without touching the core.

Two promises make a session safe across processes (D27). **Ownership**: a process that will
change a session calls :meth:`SessionStore.own` before it reads the state it acts on, and keeps
it until :meth:`SessionStore.close`; a second owner is refused at once with
:class:`~orchestrator._core.errors.SessionLockedError`. Readers never own. **Conditional
writes**: programs that do not take our lock (pi) may still append, so a commit names the
:class:`Tail` it planned from, and the store refuses with
:class:`~orchestrator._core.errors.ConflictError`, writing nothing, when the session no longer
ends there. A database store would use a row version where the file store uses the last id and
the byte length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchestrator._core.entries import Entry

FsyncPolicy = Literal["always", "per_turn", "never"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a stored session, with where it is.

    Attributes:
        line: 1-based line number in the file (0 for the file as a whole).
        code: A stable code: ``not_json``, ``no_id``, ``unknown_parent``, ``cycle``,
            ``duplicate_id``, ``torn_line``, ``not_session``, ``bad_header``, ``not_object``.
        message: One readable sentence.
    """

    line: int
    code: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Tail:
    """Where a stored session ends: what a conditional write checks (D27).

    Attributes:
        last_id: The id of the last entry stored (``None`` when there is none yet).
        length: The stored size in bytes (a file's length, torn bytes included).
    """

    last_id: str | None
    length: int


EMPTY_TAIL = Tail(last_id=None, length=0)
"""The tail of a store that holds nothing."""


@dataclass(slots=True, kw_only=True)
class LoadResult:
    """What a store read: the usable part, and every problem found.

    Attributes:
        header: The session header (migrated to version 3), or ``None`` when there is none.
        entries: Usable entries in file order (migrated to version 3).
        problems: Everything that was skipped or suspicious, in line order.
        migrated: The stored data was an older version and was migrated in memory.
        torn_tail: Bytes of a truncated last line (a crash mid-append), if any.
        tail: Where the data read ends: the state a later conditional write expects (D27).
    """

    header: Entry | None
    entries: list[Entry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    migrated: bool = False
    torn_tail: bytes = b""
    tail: Tail = EMPTY_TAIL


class SessionStore(Protocol):
    """Where one session's header and entries are kept."""

    @property
    def location(self) -> str:
        """Where the session lives (a path for files), for messages and ``parentSession``."""
        ...

    def exists(self) -> bool:
        """True when something is stored (for files: the file exists and is not empty)."""
        ...

    def load(self) -> LoadResult:
        """Read everything, reporting problems instead of raising on damaged data (D3)."""
        ...

    def tail(self) -> Tail:
        """Where the stored session ends now (read fresh, not remembered)."""
        ...

    def own(self, owner: str) -> None:
        """Take the writer lock now, without waiting, and keep it until :meth:`close` (D27).

        Args:
            owner: Who changes the session, for the refusal others see
                (``"orchestrator compact"``).

        Raises:
            SessionLockedError: Another store or process owns the session.
        """
        ...

    def append(self, entries: Sequence[Entry], *, expect: Tail | None = None) -> Tail:
        """Append whole entries durably, per the fsync policy (D4).

        Args:
            entries: The entries, written as whole lines in one write.
            expect: Write only if the store still ends here (D27); ``None`` writes regardless.

        Returns:
            Where the store ends after the write.

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
        """
        ...

    def rewrite(
        self, header: Entry, entries: Sequence[Entry], *, expect: Tail | None = None
    ) -> Tail:
        """Replace the whole content atomically (temporary file, fsync, rename) (D4).

        Args:
            header: The session header.
            entries: Every entry, in order.
            expect: Replace only if the store still ends here (D27).

        Returns:
            Where the store ends after the rewrite.

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
        """
        ...

    def sync(self) -> None:
        """Make everything appended so far durable (the ``per_turn`` policy's turn boundary)."""
        ...

    def close(self) -> None:
        """Release the writer lock and any handle."""
        ...
