"""The progress line: drawn on a terminal, silent when piped."""

from __future__ import annotations

import io

import anyio
import anyio.lowlevel
import pytest

from orchestrator._cli.progress import Progress, spinner
from orchestrator._cli.terminal import fit
from orchestrator._core.errors import ModelError

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


async def test_an_error_in_the_block_leaves_unwrapped() -> None:
    # It left inside the task group's ExceptionGroup: a 65-line traceback on a terminal.
    stream = Terminal()

    async def fail() -> None:
        async with spinner(Progress("Summarizing"), stream):
            await anyio.lowlevel.checkpoint()
            raise ModelError("no key")

    with pytest.raises(ModelError, match="^no key$"):
        await fail()
    assert stream.getvalue().endswith("\r\x1b[K")


async def test_the_line_is_cut_to_the_width_on_one_line_with_controls_shown() -> None:
    stream = Terminal()
    progress = Progress("provider said:\n" + "overloaded \x1b]0;title\x07" * 20)
    async with spinner(progress, stream, columns=40):
        while "provider" not in stream.getvalue():
            await anyio.lowlevel.checkpoint()
    draw = stream.getvalue().split("\r")[1]
    assert draw.endswith("…\x1b[K")
    line = draw.removesuffix("\x1b[K")
    assert len(line) == 39  # the last column stays empty
    assert "\n" not in line
    assert "\x1b]" not in line
    assert "\x07" not in line


def test_fit_counts_wide_characters_twice() -> None:
    assert fit("short", 80) == "short"
    assert fit("漢字漢字漢字", 8) == "漢字漢…"  # 6 cells and the ellipsis in 7
    assert fit("a\nb", 80) == "a; b"
