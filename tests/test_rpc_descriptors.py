"""A server out of file descriptors keeps serving (it used to exit with a traceback)."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
from pathlib import Path

from tests.cli_kit import EXAMPLE

LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'orchestrator', 'serve', *sys.argv[1:]])"
)
REPO = Path(__file__).resolve().parent.parent
SHORT = b"orchestrator serve: cannot accept a connection now: Too many open files; trying again\n"


def ask(client: socket.socket, request_id: int) -> dict[str, object]:
    return call(client, request_id, "session.list")


def next_line(server: subprocess.Popen[bytes]) -> bytes:
    assert server.stderr is not None
    # A safety net against a hang (the line never comes), not a measure of speed.
    ready, _, _ = select.select([server.stderr], [], [], 120)
    assert ready, "the server said nothing"
    return server.stderr.readline()


def test_a_server_out_of_descriptors_waits_and_serves_the_waiting_connections(
    tmp_path: Path,
) -> None:
    path = tmp_path / "serve.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", LIMITED, "--socket", str(path)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    clients: list[socket.socket] = []
    try:
        while b"listening on" not in next_line(server):
            assert server.poll() is None
        # More connections than the server has descriptors for (fewer than its bound of 32
        # connections): the last ones wait in the kernel's backlog while accept fails.
        for _ in range(20):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(120)  # a safety net against a hang, not a measure of speed
            client.connect(str(path))
            clients.append(client)
        assert next_line(server) == SHORT  # said once, and the server goes on
        assert ask(clients[0], 1)["id"] == 1
        for client in clients[:12]:
            client.close()
        assert ask(clients[-1], 2)["id"] == 2  # accepted once descriptors were free again
        assert server.poll() is None
    finally:
        for client in clients:
            client.close()
        server.terminate()
        _, err = server.communicate(timeout=120)
    assert server.returncode == 0
    assert b"Traceback" not in err


def call(
    client: socket.socket, request_id: int, method: str, **params: object
) -> dict[str, object]:
    request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    client.sendall(json.dumps(request).encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = client.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    answer: dict[str, object] = json.loads(data)
    return answer


def test_opening_sessions_past_the_descriptor_limit_is_the_servers_limit(tmp_path: Path) -> None:
    # It was -32602 (invalid params) "…: cannot read it: Too many open files".
    path = tmp_path / "serve.sock"
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-c", LIMITED, "--socket", str(path), "--dir", str(sessions)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while b"listening on" not in next_line(server):
            assert server.poll() is None
        client.settimeout(120)  # a safety net against a hang, not a measure of speed
        client.connect(str(path))
        errors = []
        for n in range(20):
            header, rest = EXAMPLE.read_text(encoding="utf-8").split("\n", 1)
            fresh = json.loads(header) | {"id": f"session-{n}"}  # each its own session
            (sessions / f"n{n}.jsonl").write_text(json.dumps(fresh) + "\n" + rest)
            answer = call(client, n, "session.open", path=f"n{n}.jsonl")
            if "error" in answer:
                errors.append(answer["error"])
        assert errors, "the limit was never reached"
        # A fork opens a new session too (it was -32602, "cannot create the lock file ...").
        fork = {"session_id": "session-0", "entry_id": "daa66d13"}
        for n, params in enumerate(({**fork, "path": "f.jsonl"}, fork)):
            answer = call(client, 50 + n, "session.fork", **params)
            errors.append(answer.get("error"))
        for error in errors:
            assert isinstance(error, dict)
            assert error["code"] == -32005, error
            assert "the server has too many files open" in str(error["message"])
        assert "result" in call(client, 99, "session.list")  # and it goes on answering
        assert not [p.name for p in sessions.iterdir() if "f" in p.name]  # no fork written
    finally:
        client.close()
        server.terminate()
        server.communicate(timeout=120)
