"""``orchestrator operation``: an operation's outcome, asked of the server that ran it.

A real ``orchestrator serve --socket`` process compacts under a client's ``operationId``; the
command then shows the outcome as text and as JSON (``session.operation``'s answer), refuses an
unknown id, a session the server does not have open and a socket nobody listens on, each in one
line. ``--temporal`` (the cluster, asked directly) is in tests/test_cluster_operations.py.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from pathlib import Path

import pytest

from orchestrator._cli.main import main
from orchestrator._cli.operation import _Connection
from orchestrator._core.errors import SessionError
from tests.test_rpc_server import EXAMPLE, socket_server


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_the_operation_command_asks_the_server_that_ran_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    sock = tmp_path / "serve.sock"
    process = socket_server(session, sock)
    try:
        with _Connection(sock) as server:
            sid = server.call("session.list", {})["sessions"][0]["session_id"]
            done = server.call("session.compress", {"session_id": sid, "operationId": "cli-1"})
        assert done["compacted"] is True
        assert main(["operation", str(session), "cli-1", "--socket", str(sock)]) == 0
        assert capsys.readouterr().out == (
            "operation cli-1: done\n"
            f"compacted: entry {done['entryId']} (tokens before: {done['tokensBefore']})\n"
        )
        assert main(["operation", sid, "cli-1", "--socket", str(sock), "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        assert answer == {"operationId": "cli-1", "state": "done", "result": done}
        assert main(["operation", sid, "nobody", "--socket", str(sock)]) == 1
        assert one_line(capsys) == (
            f"orchestrator operation: operation nobody is not known in session {sid}: "
            f"session.operation: no operation nobody in session {sid} (never asked for here, "
            "or forgotten: a server keeps the last 1000 for 1 h)"
        )
        assert main(["operation", "other.jsonl", "cli-1", "--socket", str(sock)]) == 1
        assert one_line(capsys) == (
            f"orchestrator operation: other.jsonl: not open on the server at {sock} (its "
            "outcome is kept only by the server that ran it)"
        )
    finally:
        process.terminate()
        assert process.wait() == 0
        if process.stderr is not None:
            process.stderr.close()
    assert main(["operation", sid, "cli-1", "--socket", str(sock)]) == 1
    assert one_line(capsys).startswith(f"orchestrator operation: {sock}: no server answers there (")


def test_the_operation_command_describes_every_ending() -> None:
    from orchestrator._cli.operation import describe

    assert describe({"operationId": "a", "state": "running"}) == ["operation a: running"]
    skipped = {"compacted": False, "reason": "Already compacted"}
    assert describe({"operationId": "a", "state": "done", "result": skipped}) == [
        "operation a: done",
        "not compacted: Already compacted",
    ]
    moved = {"cancelled": False, "oldLeafId": "x", "newLeafId": "y"}
    assert describe({"operationId": "a", "state": "done", "result": moved})[1] == (
        "navigated: leaf x -> y"
    )
    cancelled = {"code": -32003, "message": "Compaction cancelled"}
    assert describe({"operationId": "a", "state": "cancelled", "error": cancelled}) == [
        "operation a: cancelled",
        "error -32003: Compaction cancelled",
    ]


def test_the_operation_command_wants_one_place_to_ask(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["operation", "s", "id"])
    assert usage.value.code == 2
    assert "one of the arguments --socket --temporal is required" in capsys.readouterr().err


def test_a_server_that_sends_events_first_or_hangs_up_is_read_as_such(tmp_path: Path) -> None:
    path = tmp_path / "fake.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()

        def serve() -> None:
            accepted, _ = listener.accept()
            with accepted:
                accepted.recv(65536)
                event = {"jsonrpc": "2.0", "method": "session.event", "params": {}}
                answer = {"jsonrpc": "2.0", "id": 1, "result": {"sessions": []}}
                accepted.sendall(json.dumps(event).encode() + b"\n")
                accepted.sendall(json.dumps(answer).encode() + b"\n")
                accepted.recv(65536)  # the second request: hung up on

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with _Connection(path) as server:
                assert server.call("session.list", {}) == {"sessions": []}
                with pytest.raises(SessionError) as closed:
                    server.call("session.list", {})
        finally:
            thread.join()
    assert str(closed.value) == f"{path}: the server closed the connection"


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["operation", "s", "", "--socket", "x"], "the operation id is empty"),
        (["operation", "/", "id", "--temporal", "127.0.0.1:1"], "'/': not a session id"),
    ):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")
