"""Where a stored session ends, and the rule a conditional write applies to it (D27).

Every store refuses a conditional write through :func:`check_tail` and :func:`changed`, so the
rule (the end found must equal the end the caller read, exactly) and the words of the refusal
are the same for a file, the memory store and PostgreSQL: ``LOCATION: the session changed since
it was read (HOW); ... nothing was written``.

A conditional write compares the store's end now with the end the caller read. I read the id
from the stored bytes themselves rather than from what this process parsed, so an entry that
another program (pi) appended without our lock is seen. Lines are scanned from the end: the
last line that parses as an entry (an object with a string id that is not the header) names
the tail; a torn or damaged last line is passed over, the same way at read time and at write
time, so both sides agree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence

from orchestrator._core.entries import Entry
from orchestrator._core.errors import ConflictError
from orchestrator._store.protocol import Tail

_WINDOW = 1 << 16


def entry_id_of_line(line: bytes) -> str | None:
    """The id of an entry line, or ``None`` for the header, a damaged line or a non-entry."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, deep nesting, huge numbers
        return None
    if not isinstance(value, dict) or value.get("type") == "session":
        return None
    entry_id = value.get("id")
    return entry_id if isinstance(entry_id, str) else None


def last_id_in_lines(lines: Iterable[bytes]) -> str | None:
    """The id of the last entry among ``lines`` given last-first, or ``None``."""
    for line in lines:
        found = entry_id_of_line(line)
        if found is not None:
            return found
    return None


def tail_of_bytes(data: bytes) -> Tail:
    """The tail of a whole session held in memory, read back from its end line by line.

    Not by splitting the whole file: that made a second copy of it, a bytes object per line, to
    read one or two lines (at 1M entries 640 MB more, and its page faults; issue 9).
    """
    return Tail(last_id=last_id_in_lines(_lines_backwards(data)), length=len(data))


def _lines_backwards(data: bytes) -> Iterator[bytes]:
    r"""``reversed(data.split(b"\n"))``, one line at a time."""
    end = len(data)
    while True:
        start = data.rfind(b"\n", 0, end) + 1
        yield data[start:end]
        if start == 0:
            return
        end = start - 1


def tail_of_file(fd: int, size: int) -> Tail:
    """The tail of an open session file of ``size`` bytes, reading back only as far as needed.

    The window doubles until it holds a whole entry line (or the whole file), so a long last
    line (a big tool result) costs one read of its size, never a read of the file.
    """
    window = _WINDOW
    while True:
        start = max(0, size - window)
        data = os.pread(fd, size - start, start) if size > start else b""
        lines = data.split(b"\n")
        if start > 0:
            lines = lines[1:]  # the first piece may be the end of a longer line
        found = last_id_in_lines(reversed(lines))
        if found is not None or start == 0:
            return Tail(last_id=found, length=size)
        window *= 2


def tail_after(previous: Tail | None, entries: Sequence[Entry], length: int) -> Tail:
    """The tail once ``entries`` are written and the store is ``length`` bytes long."""
    for entry in reversed(entries):
        entry_id = entry.get("id")
        if entry.get("type") != "session" and isinstance(entry_id, str):
            return Tail(last_id=entry_id, length=length)
    return Tail(last_id=previous.last_id if previous else None, length=length)


def check_tail(location: str, expect: Tail | None, found: Tail) -> Tail:
    """Refuse a conditional write unless the session still ends where the caller read it.

    Args:
        location: The store's location, for the message.
        expect: Where the caller read the session ending (``None``: an unconditional write).
        found: Where it ends now, read under the store's write lock or transaction.

    Returns:
        ``found``, the base the write builds on.

    Raises:
        ConflictError: ``found`` differs from ``expect``; the caller writes nothing.
    """
    if expect is not None and found != expect:
        raise ConflictError(conflict_message(location, expect, found))
    return found


def changed(location: str, how: str) -> ConflictError:
    """The refusal of a conditional write for a change the tail alone does not show.

    Args:
        location: The store's location.
        how: What happened, as a clause (``the file was replaced``).

    Returns:
        The error to raise; nothing was written.
    """
    return ConflictError(
        f"{location}: the session changed since it was read ({how}); nothing was written"
    )


def conflict_message(location: str, expect: Tail, found: Tail) -> str:
    """One line saying that a conditional write was refused, and why."""

    def where(tail: Tail) -> str:
        entry = f"entry {tail.last_id}" if tail.last_id else "no entry"
        return f"{entry}, {tail.length} bytes"

    return (
        f"{location}: the session changed since it was read (it ended at {where(expect)}; "
        f"now at {where(found)}); another program wrote to it, so nothing was written"
    )
