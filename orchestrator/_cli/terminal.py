r"""What a command prints never drives the terminal: control characters are shown, not sent.

A session's text comes from whoever wrote it: a tool result holds whatever the tool printed,
colour codes included, and a hostile page fetched by a tool can hold a sequence that retitles
the terminal, clears it or worse. ``tree``, ``context``, ``plan`` and the rest print that text
(previews, summaries, ids, labels), and so do the errors that name an entry. Rather than escape
it at each of those places (and miss the next one), the command line writes its standard output
and error through :class:`TerminalSafe`, which shows each such character as its ``\u`` escape
(:func:`~orchestrator._core.printable.terminal_safe`); a JSON line stays valid JSON with the
same value. Bytes written to ``.buffer`` (``export`` writes a session as it is stored) pass
unchanged. The commands that own the terminal or a protocol (``tui``, ``chat``, ``serve``,
``worker``) are not wrapped, and the progress spinner, our own control output, writes to the
stream underneath (:attr:`TerminalSafe.wrapped`).
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import unicodedata
from typing import Any, TextIO

from orchestrator._core.printable import terminal_safe


class TerminalSafe(io.TextIOBase):
    """A text stream that writes to ``wrapped`` with terminal controls escaped."""

    def __init__(self, wrapped: TextIO) -> None:
        super().__init__()
        self.wrapped = wrapped

    def write(self, text: str) -> int:
        self.wrapped.write(terminal_safe(text))
        return len(text)

    def flush(self) -> None:
        self.wrapped.flush()

    def isatty(self) -> bool:
        return self.wrapped.isatty()

    def fileno(self) -> int:
        return self.wrapped.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.wrapped.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.wrapped.errors

    def __getattr__(self, name: str) -> Any:
        # ``buffer`` (raw bytes, unchanged), ``reconfigure`` and whatever else a caller reads.
        return getattr(self.wrapped, name)


def unwrapped(stream: TextIO | TerminalSafe) -> TextIO:
    """The stream under a :class:`TerminalSafe` one (for our own control sequences)."""
    return stream.wrapped if isinstance(stream, TerminalSafe) else stream


def columns_of(stream: TextIO) -> int | None:
    """The width of the terminal ``stream`` writes to; ``None`` when it is not a terminal."""
    if not stream.isatty():
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (OSError, ValueError):  # a terminal without a size: $COLUMNS, or 80
        return shutil.get_terminal_size().columns


def fit(text: str, columns: int) -> str:
    """``text`` on one row of a terminal ``columns`` wide, cut with ``…`` when longer.

    Line breaks become ``"; "`` and controls are shown escaped. The last column stays empty:
    a character written there leaves some terminals about to wrap.
    """
    room = max(columns - 1, 1)
    line = terminal_safe("; ".join(part.strip() for part in text.splitlines() if part.strip()))
    if cells(line) <= room:
        return line
    # The longest start that leaves a cell for the ellipsis (widths only grow along the line).
    widths = itertools.accumulate(cells(char) for char in line)
    kept = sum(1 for _ in itertools.takewhile(lambda width: width < room, widths))
    return line[:kept] + "…"


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes: wide (East Asian) characters two, marks none."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )
