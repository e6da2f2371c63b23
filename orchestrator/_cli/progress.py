"""A progress line on stderr while a model call runs, quiet when stderr is not a terminal.

The line is redrawn in place with a carriage return, which only returns to the start of the
*last* screen row: a line wider than the terminal wrapped, and each redraw then added a row, so a
provider's long retry message filled the screen with copies of itself. I draw one row at most:
the text on one line, its controls escaped (a provider's message is not ours to send to the
terminal), cut to the terminal's width (:func:`~orchestrator._cli.terminal.fit`).

The drawing task runs in a task group around the command's work. An error of that work must
leave the block as itself, not inside the group's ``ExceptionGroup``: the command line turns
our errors into one line, and it did not recognise them wrapped (a 65-line traceback instead).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio

from orchestrator._cli.terminal import columns_of, fit, unwrapped

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    """Holds the current status text; :func:`spinner` draws it."""

    def __init__(self, text: str) -> None:
        self.text = text


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
            width = columns or columns_of(out) or 80  # asked again: the window may be resized
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
