"""A turn starts only from the file as it is (D27): another program's change is not lost.

pi appending between two turns made the next turn go on from the old leaf (pi's message an
abandoned branch the model never saw); a file replaced by a rename took the next turn's
messages into the old inode, where they were lost; a removed file swallowed them in silence.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import ConflictError
from orchestrator._runtime.session import AgentSession
from orchestrator.testing import ScriptedAgent, reply
from tests.cli_kit import EXAMPLE, pi_user_line

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def opened(tmp_path: Path) -> tuple[Path, AgentSession]:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    agent = ScriptedAgent([[reply("first answer")], [reply("second answer")]])
    return path, AgentSession.open(path, agent=agent)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_pi_appending_between_turns_is_a_conflict_then_the_next_turn_follows_it(
    tmp_path: Path,
) -> None:
    path, runtime = opened(tmp_path)
    try:
        await runtime.prompt("first")
        leaf = runtime.session.leaf_id
        with path.open("ab") as file:
            file.write(pi_user_line(leaf))
        after_pi = path.read_bytes()
        with pytest.raises(ConflictError, match="the session changed since it was read"):
            await runtime.prompt("second")
        assert path.read_bytes() == after_pi  # nothing written after pi's line
        assert runtime.session.leaf_id == "c0ffee01"  # read again: pi's message is the leaf
        assert runtime.state == "idle"
        await runtime.prompt("second")
    finally:
        runtime.close()
    entries = lines(path)
    assert entries[-2]["parentId"] == "c0ffee01"  # the next turn goes on from pi's message


@pytest.mark.parametrize("change", ["replaced", "removed"])
async def test_a_file_replaced_or_removed_between_turns_is_a_conflict(
    tmp_path: Path, change: str
) -> None:
    path, runtime = opened(tmp_path)
    try:
        await runtime.prompt("first")
        before = path.read_bytes()
        if change == "replaced":
            copy = tmp_path / "copy.jsonl"
            copy.write_bytes(before)
            os.replace(copy, path)  # same bytes, another file
        else:
            path.unlink()
        with pytest.raises(ConflictError, match=f"the file was {change}"):
            await runtime.prompt("second")
        assert runtime.state == "idle"
    finally:
        runtime.close()
    if change == "replaced":
        assert path.read_bytes() == before  # nothing lost into the old file, nothing added
    else:
        assert not path.exists()
