"""No new session takes a side file's name (a fork to ``s.jsonl.lock`` was destroyed by ``s``).

A session forked or created as ``s.jsonl.lock``, ``s.jsonl.journal`` or ``s.jsonl.corrupt`` was
then taken for ``s.jsonl``'s side file: the lock text written over it, journal records appended
to it, the file deleted as a stale lock.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionError
from orchestrator._rpc.errors import INVALID_PARAMS
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._runtime.session import AgentSession
from tests.cli_kit import EXAMPLE, run
from tests.runtime_kit import HubClient as Client

pytestmark = pytest.mark.anyio

USER_MESSAGE = "daa66d13"  # a user message of the example
NAMES = ["s.jsonl.lock", "s.jsonl.journal", "s.jsonl.corrupt", ".s.jsonl.0badc0de.tmp"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("name", NAMES)
def test_fork_refuses_a_side_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    source = tmp_path / "a.jsonl"
    shutil.copy(EXAMPLE, source)
    code, _, err = run(
        capsys, "fork", str(source), "--from", USER_MESSAGE, "--out", str(tmp_path / name)
    )
    assert code == 1
    assert "a new session cannot take a side file's name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]


@pytest.mark.parametrize("name", NAMES[:2])
async def test_the_api_and_the_server_refuse_it_too(tmp_path: Path, name: str) -> None:
    source = tmp_path / "a.jsonl"
    shutil.copy(EXAMPLE, source)
    runtime = AgentSession.open(source)
    try:
        with pytest.raises(SessionError, match="cannot take a side file's name"):
            await runtime.fork(USER_MESSAGE, tmp_path / name)
    finally:
        runtime.close()
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    opened = await client.call("session.open", path="a.jsonl")
    error = await client.error(
        "session.fork", session_id=opened["session_id"], entry_id=USER_MESSAGE, path=name
    )
    assert error["code"] == INVALID_PARAMS
    assert "cannot take a side file's name" in error["message"]
    error = await client.error("session.open", path=name, create=True)
    assert error["code"] == INVALID_PARAMS
    assert "cannot take a side file's name" in error["message"]
    await client.call("session.close", session_id=opened["session_id"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
