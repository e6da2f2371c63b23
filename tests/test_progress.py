"""The progress line: drawn on a terminal, silent when piped."""

from __future__ import annotations

import io

import anyio
import anyio.lowlevel
import pytest

from orchestrator._cli.progress import Progress, spinner

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_quiet_when_not_a_terminal() -> None:
    stream = io.StringIO()
    async with spinner(Progress("Summarizing"), stream):
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
    assert stream.getvalue() == ""


async def test_draws_and_clears_on_a_terminal() -> None:
    stream = Terminal()
    progress = Progress("Summarizing with the offline summarizer")
    async with spinner(progress, stream):
        while "Summarizing" not in stream.getvalue():
            await anyio.lowlevel.checkpoint()
        progress.text = "retrying in 2.0s"
    text = stream.getvalue()
    assert "\r⠋ Summarizing with the offline summarizer" in text
    assert text.endswith("\r\x1b[K")  # the line is cleared at the end
