"""A server out of file descriptors keeps serving (it used to exit with a traceback)."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def limited_server(tmp_path: Path) -> Iterator[tuple[Path, socket.socket, list[bytes]]]:
    """``orchestrator serve`` at 20 descriptors over ``tmp_path/sessions``, and a client.

    Yields the sessions folder, the connected client and a list that holds the server's stderr
    once it has stopped (it must still be running when the block ends).
    """
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
    err: list[bytes] = []
    try:
        while b"listening on" not in next_line(server):
            assert server.poll() is None
        client.settimeout(120)  # a safety net against a hang, not a measure of speed
        client.connect(str(path))
        yield sessions, client, err
        assert server.poll() is None
    finally:
        client.close()
        server.terminate()
        err.append(server.communicate(timeout=120)[1])


def test_opening_sessions_past_the_descriptor_limit_is_the_servers_limit(tmp_path: Path) -> None:
    # It was -32602 (invalid params) "…: cannot read it: Too many open files".
    with limited_server(tmp_path) as (sessions, client, err):
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


SUMMARY: dict[str, object] = {"summarize": True}


class Lines:
    """A client connection that reads answers line by line, skipping event notifications."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.buffer = b""

    def call(self, request_id: int, method: str, **params: object) -> dict[str, object]:
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self.client.sendall(json.dumps(request).encode() + b"\n")
        while True:
            while b"\n" not in self.buffer:
                chunk = self.client.recv(65536)
                assert chunk, "the server closed the connection"
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\n", 1)
            answer: dict[str, object] = json.loads(line)
            if answer.get("id") == request_id:
                return answer


def test_requests_at_the_descriptor_limit_are_the_servers_limit_and_change_nothing(
    tmp_path: Path,
) -> None:
    # At the limit, the first session.compress was -32603 "Internal error: OSError: [Errno 24]
    # Too many open files: '.../msgspec/__init__.py'" (a lazy import for the journal's first
    # record) and session.tree.navigate was -32603 "DefinitionError: .../navigation.toml:
    # cannot read" (a lazily read table). The server reads both at start now; what still needs
    # a descriptor (the folder fsync that makes a new journal's name durable) is -32005.
    with limited_server(tmp_path) as (sessions, client, err):
        lines = Lines(client)
        opened: list[str] = []
        header, rest = EXAMPLE.read_text(encoding="utf-8").split("\n", 1)
        for n in range(20):
            fresh = json.loads(header) | {"id": f"session-{n}"}
            (sessions / f"n{n}.jsonl").write_text(json.dumps(fresh) + "\n" + rest)
            answer = lines.call(n, "session.open", path=f"n{n}.jsonl")
            if "error" in answer:
                break
            opened.append(f"session-{n}")
        assert "error" in answer, "the limit was never reached"
        assert len(opened) >= 3
        last = sessions / f"n{len(opened) - 1}.jsonl"
        session_id = opened[-1]
        asked: list[tuple[str, dict[str, object]]] = [
            ("session.compress", {"session_id": session_id}),
            (
                "session.tree.navigate",
                {"session_id": session_id, "target_id": "daa66d13"} | SUMMARY,
            ),
            ("session.tree", {"session_id": session_id}),
            ("session.context", {"session_id": session_id}),
        ]
        refused: list[tuple[str, dict[str, object]]] = []
        for n, (method, params) in enumerate(asked):
            before = last.read_bytes()
            answer = lines.call(100 + n, method, **params)
            error = answer.get("error")
            if error is None:
                continue
            # The server's limit, named, never an internal error; and nothing applied.
            assert isinstance(error, dict)
            assert error["code"] == -32005, (method, error)
            assert error["message"].startswith(f"{method}: the server has too many files")
            assert last.read_bytes() == before
            assert method in ("session.compress", "session.tree.navigate")  # they need a file
            refused.append((method, params))
        assert refused, "no request met the limit"
        # Descriptors given back: what was refused now works.
        for n, other in enumerate(opened[:2]):
            assert "result" in lines.call(200 + n, "session.close", session_id=other)
        for n, (method, params) in enumerate(refused):
            answer = lines.call(300 + n, method, **params)
            assert "result" in answer, answer
    assert b"Traceback" not in err[0]  # the server was still running (limited_server checks)
