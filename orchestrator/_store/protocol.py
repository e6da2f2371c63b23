"""The store protocol: where a session's lines live (decisions D3, D4).

A store holds one session: a header and entries in file order. The core never sees a file;
:class:`~orchestrator.Session` talks to a store through this protocol, so a database store can be
added later without touching the core.
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


@dataclass(slots=True, kw_only=True)
class LoadResult:
    """What a store read: the usable part, and every problem found.

    Attributes:
        header: The session header (migrated to version 3), or ``None`` when there is none.
        entries: Usable entries in file order (migrated to version 3).
        problems: Everything that was skipped or suspicious, in line order.
        migrated: The stored data was an older version and was migrated in memory.
        torn_tail: Bytes of a truncated last line (a crash mid-append), if any.
    """

    header: Entry | None
    entries: list[Entry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    migrated: bool = False
    torn_tail: bytes = b""


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

    def append(self, entries: Sequence[Entry]) -> None:
        """Append whole entries durably, per the fsync policy (D4)."""
        ...

    def rewrite(self, header: Entry, entries: Sequence[Entry]) -> None:
        """Replace the whole content atomically (temporary file, fsync, rename) (D4)."""
        ...

    def sync(self) -> None:
        """Make everything appended so far durable (the ``per_turn`` policy's turn boundary)."""
        ...

    def close(self) -> None:
        """Release the writer lock and any handle."""
        ...
