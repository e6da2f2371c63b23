"""A closed runtime refuses every call: its lock is released, so writing would be unowned (D27).

Navigating after ``close()`` used to append a branch summary to the released file and take its
lock again with nothing left to release it, so the file could not be opened any more.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import AgentSession, SummaryRoutes
from orchestrator._core.errors import SessionError
from orchestrator.testing import ScriptedModel
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


CALLS: dict[str, Callable[[AgentSession], Awaitable[Any]]] = {
    "prompt": lambda runtime: runtime.prompt("hi"),
    "compact": lambda runtime: runtime.compact(),
    "navigate": lambda runtime: runtime.navigate("cc623a9b", summarize=True),
    "fork": lambda runtime: runtime.fork("daa66d13"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_every_call_after_close_is_refused_and_writes_nothing(
    tmp_path: Path, call: str
) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    routes = SummaryRoutes(candidates=(ScriptedModel(["## Goal\nok"] * 4),))
    runtime = AgentSession.open(path, summarizer=routes)
    runtime.close()
    assert runtime.closed
    before = path.read_bytes()
    with pytest.raises(SessionError, match="the session is closed; open it again"):
        await CALLS[call](runtime)
    runtime.close()  # again: nothing to do
    assert path.read_bytes() == before
    assert not Path(f"{path}.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "fork" in p.name) == []
    AgentSession.open(path).close()  # nobody holds it


@pytest.mark.parametrize("text", [None, 5, b"bytes"])
async def test_a_prompt_that_is_not_text_is_refused_and_writes_nothing(
    tmp_path: Path, text: Any
) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path)
    try:
        with pytest.raises(TypeError, match="takes the user's text, a str, not"):
            await runtime.prompt(text)
    finally:
        runtime.close()
    assert path.read_bytes() == EXAMPLE.read_bytes()


OTHER_BRANCH = "36fbeee7"  # an assistant message off the example's active path


@pytest.mark.parametrize(
    ("call", "complaint"),
    [
        (lambda r: r.navigate(None), "navigate() takes target_id as a str, not NoneType"),
        (lambda r: r.navigate(5), "navigate() takes target_id as a str, not int"),
        (
            lambda r: r.navigate(OTHER_BRANCH, label=5),
            "navigate() takes label as a str or None, not int",
        ),
        (
            lambda r: r.navigate(OTHER_BRANCH, summarize=True, instructions=["x"]),
            "navigate() takes instructions as a str or None, not list",
        ),
        (lambda r: r.compact(focus=42), "compact() takes focus as a str or None, not int"),
        (lambda r: r.fork(None), "fork() takes entry_id as a str, not NoneType"),
    ],
)
async def test_an_id_label_or_focus_that_is_not_text_is_refused_and_writes_nothing(
    tmp_path: Path, call: Any, complaint: str
) -> None:
    # Before, a label of 5 was written as a label entry (pi reads a string there) and a None
    # id was reported as a missing entry, "Entry None not found".
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path)
    try:
        with pytest.raises(TypeError, match=re.escape(complaint)):
            await call(runtime)
    finally:
        runtime.close()
    assert path.read_bytes() == EXAMPLE.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
