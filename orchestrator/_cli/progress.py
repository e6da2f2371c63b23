"""A progress line on stderr while a model call runs, quiet when stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio

from orchestrator._cli.terminal import unwrapped

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    """Holds the current status text; :func:`spinner` draws it."""

    def __init__(self, text: str) -> None:
        self.text = text


@asynccontextmanager
async def spinner(progress: Progress, stream: TextIO | None = None) -> AsyncIterator[Progress]:
    """Draw ``progress.text`` with a spinner until the block ends (terminals only)."""
    # Our own control sequences: written under the command line's escaping (terminal.py).
    out = stream or unwrapped(sys.stderr)
    if not out.isatty():
        yield progress
        return

    async def draw() -> None:
        frame = 0
        while True:
            out.write(f"\r{_FRAMES[frame % len(_FRAMES)]} {progress.text}\033[K")
            out.flush()
            frame += 1
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as group:
        group.start_soon(draw)
        try:
            yield progress
        finally:
            group.cancel_scope.cancel()
            out.write("\r\033[K")
            out.flush()
