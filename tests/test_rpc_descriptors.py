"""A server out of file descriptors keeps serving (it used to exit with a traceback)."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
from pathlib import Path

LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'orchestrator', 'serve', *sys.argv[1:]])"
)
REPO = Path(__file__).resolve().parent.parent
SHORT = b"orchestrator serve: cannot accept a connection now: Too many open files; trying again\n"


def ask(client: socket.socket, request_id: int) -> dict[str, object]:
    request = {"jsonrpc": "2.0", "id": request_id, "method": "session.list"}
    client.sendall(json.dumps(request).encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = client.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    answer: dict[str, object] = json.loads(data)
    return answer


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
