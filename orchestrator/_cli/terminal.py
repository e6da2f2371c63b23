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
