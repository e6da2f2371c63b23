"""What reading a stored session gives: the usable part, every problem found, where it ends.

These records sit in the core, below the stores, because the sans-I/O parser
(:mod:`orchestrator._core.loading`) produces them and every store hands them on unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator._core.entries import Entry


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a stored session, with where it is.

    Attributes:
        line: 1-based line number in the file (0 for the file as a whole).
        code: A stable code: ``not_json``, ``no_id``, ``unknown_parent``, ``cycle``,
            ``duplicate_id``, ``torn_line``, ``not_session``, ``bad_header``, ``not_object``,
            ``bad_usage``, ``kept_off_path``, ``edit_target_off_path``.
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


@dataclass(frozen=True, slots=True, kw_only=True)
class EntryIndex:
    """What the line pass learned of the entries it read, for the tree to take over.

    Attributes:
        by_id: Each entry by its id (handed over: the tree goes on adding to it).
        linear: Each entry's parent is the entry before it, and the first is a root.
    """

    by_id: dict[str, Entry]
    linear: bool


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
        index: The entries by id and whether they form one line, when the read built them
            (entries as read, not migrated); ``None`` otherwise, and the tree indexes itself.
    """

    header: Entry | None
    entries: list[Entry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    migrated: bool = False
    torn_tail: bytes = b""
    tail: Tail = EMPTY_TAIL
    index: EntryIndex | None = None
