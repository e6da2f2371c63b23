"""A session path naming a named pipe or a device is refused at once, never waited on.

Opening a named pipe for reading waits for a writer, for ever, and the wait is not even ended by
SIGTERM (the system call is restarted after the handler). A client could name one through
``session.open`` with ``create: true`` and stop the whole server; a device such as /dev/zero
would be read without end. The JSONL store opens the session without waiting and refuses
anything that is not a regular file, with one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import SessionError
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import FdTransport
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.session import Session


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path, 0o600)
    return path


def test_loading_a_named_pipe_is_refused_without_waiting(pipe: Path) -> None:
    with pytest.raises(SessionError, match=r"pipe.jsonl: not a regular file"):
        JsonlStore(pipe).load()
    with pytest.raises(SessionError, match="not a regular file"):
        JsonlStore(pipe).tail()
    with pytest.raises(SessionError, match="not a regular file"):
        Session.open(pipe, owner="test")


def test_writing_to_a_named_pipe_is_refused_without_waiting(pipe: Path) -> None:
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"}
    with pytest.raises(SessionError, match="not a regular file"):
        JsonlStore(pipe).append([header])


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(SessionError, match="not a regular file"):
        JsonlStore(link).load()


def test_session_open_of_a_named_pipe_is_an_error_and_the_server_goes_on(
    tmp_path: Path, pipe: Path
) -> None:
    hub = SessionHub(RuntimeOptions(root=tmp_path))
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "session.open", "params": {"path": pipe.name}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session.open",
            "params": {"path": pipe.name, "create": True},
        },
        {"jsonrpc": "2.0", "id": 3, "method": "session.list"},
    ]
    (tmp_path / "in").write_text("".join(json.dumps(r) + "\n" for r in requests))

    async def run() -> None:
        server = RpcServer(hub, log=print)
        with open(tmp_path / "in", "rb") as source, open(tmp_path / "out", "wb") as sink:
            await server.serve_connection(FdTransport(source.fileno(), sink.fileno()))

    try:
        anyio.run(run)
    finally:
        hub.abort_all()
        hub.close_all()
    answers = {m["id"]: m for m in map(json.loads, (tmp_path / "out").read_text().splitlines())}
    assert answers[1]["error"]["code"] == -32602
    assert answers[2]["error"]["code"] == -32602
    assert "not a regular file" in answers[2]["error"]["message"]
    assert answers[3]["result"]["sessions"] == []


@pytest.mark.parametrize("side", [".journal", ".lock"])
def test_a_named_pipe_in_place_of_a_side_file_is_refused_without_waiting(
    tmp_path: Path, side: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator._cli.main import main

    session = tmp_path / "s.jsonl"
    session.write_bytes((Path(__file__).parent / "data" / "example-session.jsonl").read_bytes())
    before = session.read_bytes()
    os.mkfifo(f"{session}{side}", 0o600)
    assert main(["compact", str(session)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"s.jsonl{side}: cannot " in err
    assert session.read_bytes() == before
