"""A progress line on stderr while a model call runs, quiet when stderr is not a terminal.

The line is redrawn in place with a carriage return, which only returns to the start of the
*last* screen row: a line wider than the terminal wrapped, and each redraw then added a row, so a
provider's long retry message filled the screen with copies of itself. I draw one row at most:
the text on one line, its controls escaped (a provider's message is not ours to send to the
terminal), cut to the terminal's width.

The drawing task runs in a task group around the command's work. An error of that work must
leave the block as itself, not inside the group's ``ExceptionGroup``: the command line turns
our errors into one line, and it did not recognise them wrapped (a 65-line traceback instead).
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio

from orchestrator._cli.common import one_line
from orchestrator._cli.terminal import unwrapped
from orchestrator._core.printable import terminal_safe

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    """Holds the current status text; :func:`spinner` draws it."""

    def __init__(self, text: str) -> None:
        self.text = text


def fit(text: str, columns: int) -> str:
    """``text`` on one line of fewer than ``columns`` cells, cut with ``…`` when longer.

    The last column stays empty: writing there leaves some terminals about to wrap.
    """
    room = max(columns - 1, 1)
    line = terminal_safe(one_line(text))
    if _cells(line) <= room:
        return line
    kept, used = [], 1  # the ellipsis takes one cell
    for char in line:
        used += _cells(char)
        if used > room:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _cells(text: str) -> int:
    # Wide (East Asian) characters take two cells, combining marks none.
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def _columns(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):  # not a real terminal (a test's stream)
        return 80


@asynccontextmanager
async def spinner(
    progress: Progress, stream: TextIO | None = None, *, columns: int | None = None
) -> AsyncIterator[Progress]:
    """Draw ``progress.text`` with a spinner until the block ends (terminals only).

    Args:
        progress: The text to show; change ``progress.text`` to change the line.
        stream: Where to draw (default: standard error, under its escaping).
        columns: The terminal's width (default: asked of the terminal at each frame).

    Raises:
        Exception: Whatever the block raised, as it was raised.
    """
    # Our own control sequences: written under the command line's escaping (terminal.py).
    out = stream or unwrapped(sys.stderr)
    if not out.isatty():
        yield progress
        return

    async def draw() -> None:
        frame = 0
        while True:
            width = columns or _columns(out)  # asked again: the window may be resized
            line = fit(f"{_FRAMES[frame % len(_FRAMES)]} {progress.text}", width)
            out.write(f"\r{line}\033[K")
            out.flush()
            frame += 1
            await anyio.sleep(0.1)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(draw)
        try:
            yield progress
        except Exception as exc:  # re-raised below, outside the group, unwrapped
            failure = exc
        finally:
            group.cancel_scope.cancel()
            out.write("\r\033[K")
            out.flush()
    if failure is not None:
        raise failure
