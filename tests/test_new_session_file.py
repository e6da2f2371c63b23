"""A session opened on a missing file creates no file until pi would write one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator._runtime.session import AgentSession
from orchestrator.testing import ScriptedAgent, reply
from tests.cli_kit import run

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_owner_opening_a_missing_file_writes_it_with_the_first_answer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new.jsonl"
    runtime = AgentSession.open(path, agent=ScriptedAgent([[reply("hello")]]))
    try:
        assert not path.exists()  # opened, owned, nothing written yet
        session_id = runtime.session.session_id
        await runtime.prompt("hi")
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert lines[0]["type"] == "session"
        assert lines[0]["id"] == session_id
        assert [line["message"]["role"] for line in lines[1:]] == ["user", "assistant"]
    finally:
        runtime.close()


def test_opening_and_closing_a_missing_file_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo.jsonl"
    AgentSession.open(path).close()
    assert list(tmp_path.iterdir()) == []
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", str(path), "--stdio"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_empty_file_has_no_session_id_rather_than_a_new_random_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    ids = []
    for _ in range(2):
        code, out, err = run(capsys, "tree", str(path), "--json")
        assert code == 0, err
        ids.append(json.loads(out)["sessionId"])
    assert ids == [None, None]
