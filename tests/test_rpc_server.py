"""The RPC server's transports: line framing, connections, TCP on 127.0.0.1, stdio, ``serve``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._cli.main import main as cli_main
from orchestrator._cli.serve import _options
from orchestrator._core.model import ModelRequest
from orchestrator._rpc.connection import Limits
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import FdTransport, LineReader, Overlong, StreamTransport
from orchestrator._runtime.agent import ChatAgent
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._store.session import Session
from orchestrator.testing import AgentHang, FunctionModel, ScriptedAgent
from tests.cli_kit import pi_user_line

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"
REPO = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-m", "orchestrator", "serve"]
LIMIT = 4 * 1024 * 1024  # no answer in these tests comes near this: a bound on every read
TOKEN = "test-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(request_id: int | None, method: str, **params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return (json.dumps(message) + "\n").encode()


class Chunks:
    """A transport whose input is given chunks (then the end) and whose output is recorded."""

    def __init__(self, chunks: Iterable[bytes] = (), *, broken: bool = False) -> None:
        self.chunks = deque(chunks)
        self.out = bytearray()
        self.broken = broken
        self.closed = False

    async def read(self) -> bytes:
        await anyio.lowlevel.checkpoint()
        return self.chunks.popleft() if self.chunks else b""

    async def write(self, data: bytes) -> None:
        if self.broken:
            raise anyio.BrokenResourceError
        self.out += data

    async def close(self) -> None:
        self.closed = True

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.decode().splitlines()]


async def collect(transport: Chunks, limit: int = 10) -> list[bytes | None]:
    reader = LineReader(transport, limit)
    lines: list[bytes | None] = []
    while (line := await reader.next()) is not None:
        lines.append(None if isinstance(line, Overlong) else line)
    return lines


# -- framing -----------------------------------------------------------------------------------


async def test_lines_split_across_chunks_and_a_last_line_without_newline() -> None:
    lines = await collect(Chunks([b"ab", b"c\nde\n\nf", b"g"]))
    assert lines == [b"abc", b"de", b"", b"fg"]


async def test_an_over_long_line_is_reported_once_and_skipped_to_its_newline() -> None:
    lines = await collect(Chunks([b"ok\n0123456789AB", b"CDEF", b"GH\nnext\n", b"0123456789ABC"]))
    assert lines == [b"ok", None, b"next", None]


@given(
    lines=st.lists(st.binary(max_size=6).filter(lambda b: b"\n" not in b), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = [data[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert anyio.run(collect, Chunks(chunks), 100) == lines


# -- one connection ----------------------------------------------------------------------------


def example_hub(tmp_path: Path, **options: Any) -> SessionHub:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    return SessionHub(RuntimeOptions(root=tmp_path, **options))


async def test_a_connection_answers_every_line_then_ends(tmp_path: Path) -> None:
    hub = example_hub(tmp_path)
    transport = Chunks(
        [
            request(1, "session.open", path="example.jsonl"),
            b"not json\n",
            b"x" * 200 + b"\n",
            request(None, "session.list"),
            request(2, "session.list"),
        ]
    )
    await RpcServer(hub, limits=Limits(max_line_bytes=150)).serve_connection(transport)
    answers = {m["id"]: m for m in transport.messages() if "id" in m and m["id"] is not None}
    assert answers[1]["result"]["entries"] == 43
    assert len(answers[2]["result"]["sessions"]) == 1
    errors = [m["error"]["message"] for m in transport.messages() if m.get("id", 0) is None]
    assert sorted(errors) == sorted(
        [
            "Parse error: Expecting value: line 1 column 1 (char 0)",
            "Parse error: line over 150 bytes",
        ]
    )
    hub.close_all()


async def test_a_vanished_client_does_not_stop_the_work(tmp_path: Path) -> None:
    hub = example_hub(tmp_path)
    transport = Chunks(
        [request(1, "session.open", path="example.jsonl"), request(2, "session.list")], broken=True
    )
    server = RpcServer(hub)
    await server.serve_connection(transport)
    # The open ran although nobody could read its answer.
    listed = await server.dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": "session.list"})
    assert [s["leafId"] for s in listed["result"]["sessions"]] == ["935170bb"]
    hub.close_all()


# -- TCP ---------------------------------------------------------------------------------------


class Peer:
    """A client on a real socket: sends lines, reads messages (bounded), keeps notifications."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffered = BufferedByteReceiveStream(stream)
        self.notifications: list[dict[str, Any]] = []
        self.answers: dict[int, dict[str, Any]] = {}

    async def send(self, line: bytes) -> None:
        await self.stream.send(line)

    async def auth(self, token: str) -> None:
        await self.send(request(0, "auth", token=token))
        assert (await self.answer(0))["result"] == {"authenticated": True}

    async def answer(self, request_id: int) -> dict[str, Any]:
        """Read until the response to ``request_id``; other messages are kept on the way."""
        while request_id not in self.answers:
            message = json.loads(await self.buffered.receive_until(b"\n", LIMIT))
            if "id" not in message:
                self.notifications.append(message)
            else:
                self.answers[message["id"]] = message
        return self.answers.pop(request_id)

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [
            n["params"]["event"] for n in self.notifications if n["params"]["event"]["type"] == kind
        ]


async def test_tcp_compress_with_notifications(tmp_path: Path) -> None:
    hub = example_hub(tmp_path)
    server = RpcServer(hub)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            peer = Peer(stream)
            await peer.auth(TOKEN)
            await peer.send(request(1, "session.open", path="example.jsonl"))
            sid = (await peer.answer(1))["result"]["session_id"]
            await peer.send(
                request(
                    2,
                    "session.compress",
                    session_id=sid,
                    focus="Preserve decisions and unresolved constraints",
                )
            )
            compressed = await peer.answer(2)
            updates = [e["status"] for e in peer.events("compaction_update")]
            await peer.send(request(3, "session.compress", session_id=sid))
            again = await peer.answer(3)
        group.cancel_scope.cancel()
    hub.close_all()
    assert compressed["result"]["compacted"] is True
    assert again["result"] == {
        "compacted": False,
        "reason": "Already compacted",
        "operationId": again["result"]["operationId"],
    }
    # Events emitted before the answer are written before it.
    assert updates == ["in_progress", "completed"]
    assert {n["params"]["session_id"] for n in peer.notifications} == {sid}
    assert all(n["method"] == "session.event" and "id" not in n for n in peer.notifications)
    assert '"type":"compaction"' in (tmp_path / "example.jsonl").read_text()


async def test_tcp_compress_interrupts_a_hanging_prompt_on_the_same_connection(
    tmp_path: Path,
) -> None:
    agent = ScriptedAgent([[AgentHang()], [AgentHang()]])
    hub = example_hub(tmp_path, agent_factory=lambda: agent)
    server = RpcServer(hub)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            peer = Peer(stream)
            await peer.auth(TOKEN)
            await peer.send(request(1, "session.open", path="example.jsonl"))
            sid = (await peer.answer(1))["result"]["session_id"]
            await peer.send(request(2, "session.prompt", session_id=sid, text="carry on"))
            state = ""
            while state != "running":  # the turn has started: the agent is being called
                await peer.send(request(9, "session.list"))
                state = (await peer.answer(9))["result"]["sessions"][0]["state"]
            await peer.send(request(3, "session.compress", session_id=sid))
            compressed = await peer.answer(3)
            prompted = await peer.answer(2)
        group.cancel_scope.cancel()
    hub.close_all()
    assert compressed["result"]["compacted"] is True
    assert prompted["result"]["state"] == "idle"
    assert prompted["result"]["queued"] is False
    assert agent.remaining == 1  # the interrupted turn was not resumed
    assert peer.events("compaction_update")[-1]["status"] == "completed"


async def test_tcp_a_conflict_and_a_locked_session_have_their_own_codes(tmp_path: Path) -> None:
    # D27 over the wire: pi appends while the summary is written, so the commit is refused; and
    # a session another process owns. Neither is a wrong parameter (-32602).
    path = tmp_path / "example.jsonl"

    calls: list[str] = []

    async def pi_appends_meanwhile(request: ModelRequest) -> str:
        calls.append(request.purpose)
        if len(calls) > 1:
            return "## Goal\nSummarized again."  # pi typed once; asking again goes through
        with path.open("ab") as file:
            file.write(pi_user_line("935170bb", text="typed in pi meanwhile"))
        return "## Goal\nSummarized."

    summarizer = SummaryRoutes(candidates=(FunctionModel(pi_appends_meanwhile),))
    hub = example_hub(tmp_path, summarizer=summarizer)
    shutil.copy(EXAMPLE, tmp_path / "held.jsonl")
    holder = Session.open(tmp_path / "held.jsonl", owner="another program")
    server = RpcServer(hub)
    try:
        async with anyio.create_task_group() as group:
            port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                peer = Peer(stream)
                await peer.auth(TOKEN)
                await peer.send(request(1, "session.open", path="example.jsonl"))
                sid = (await peer.answer(1))["result"]["session_id"]
                await peer.send(request(2, "session.compress", session_id=sid))
                conflict = (await peer.answer(2))["error"]
                after_pi = path.read_bytes()
                await peer.send(request(3, "session.open", path="held.jsonl"))
                locked = (await peer.answer(3))["error"]
                # Asking again works from what is there now (D27): pi's line included.
                await peer.send(request(4, "session.compress", session_id=sid))
                again = await peer.answer(4)
            group.cancel_scope.cancel()
    finally:
        holder.close()
        hub.close_all()
    assert conflict["code"] == -32007
    assert conflict["data"] == {"kind": "conflict", "applied": False, "operationId": ANY}
    assert "the session changed since it was read" in conflict["message"]
    assert "now at entry c0ffee01" in conflict["message"]
    assert after_pi.endswith(b'typed in pi meanwhile","timestamp":1}}\n')  # nothing after it
    statuses = [event["status"] for event in peer.events("compaction_update")]
    assert statuses.index("failed") < statuses.index("completed")  # the conflict, then again
    assert locked["code"] == -32004
    assert locked["data"] == {"kind": "locked", "applied": False}
    assert "session is being changed by" in locked["message"]
    assert "another program" in locked["message"]
    assert again["result"]["compacted"] is True, again
    written = path.read_bytes()
    assert written.startswith(after_pi)
    [compaction] = [json.loads(line) for line in written[len(after_pi) :].splitlines()]
    assert compaction["type"] == "compaction"
    assert compaction["parentId"] == "c0ffee01"


# -- stdio and the serve command ---------------------------------------------------------------


async def read_all(stream: anyio.abc.ByteReceiveStream) -> bytes:
    data = bytearray()
    async for chunk in stream:
        data += chunk
        assert len(data) < LIMIT
    return bytes(data)


async def test_serve_stdio_subprocess(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    sid = json.loads(EXAMPLE.read_text().splitlines()[0])["id"]
    lines = [
        request(1, "session.list"),
        b"{oops\n",
        request(2, "session.compress", session_id=sid, focus="Preserve decisions"),
        request(3, "session.prompt", session_id=sid, text="hi"),
    ]
    async with await anyio.open_process(
        [*SERVE, "--stdio", str(session)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        for line in lines:
            await process.stdin.send(line)
        await process.stdin.aclose()
        out = await read_all(process.stdout)
        err = await read_all(process.stderr)
        assert await process.wait() == 0
    messages = [json.loads(line) for line in out.decode().splitlines()]
    answers = {m["id"]: m for m in messages if "id" in m}
    assert answers[1]["result"]["sessions"][0]["path"] == str(session)
    assert answers[None]["error"]["code"] == -32700
    assert answers[2]["result"]["compacted"] is True
    assert answers[3]["error"]["code"] == -32601
    statuses = [
        m["params"]["event"]["status"]
        for m in messages
        if "id" not in m and m["params"]["event"]["type"] == "compaction_update"
    ]
    assert statuses == ["in_progress", "completed"]
    assert f"session {sid}: {session}" in err.decode()


async def test_serve_tcp_subprocess_stops_cleanly_on_interrupt(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    async with await anyio.open_process(
        [*SERVE, "--port", "0", "--dir", str(tmp_path), "s.jsonl"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stderr is not None
        assert process.stdout is not None
        err = BufferedByteReceiveStream(process.stderr)
        line = b""
        try:  # whatever happens, the server is stopped (or leaving this block would wait for it)
            while b"listening on" not in line:
                line = await err.receive_until(b"\n", 4096)
            found = re.search(rb"listening on 127\.0\.0\.1:(\d+) \(token in (.+)\)$", line)
            assert found is not None, line
            port, token_file = int(found[1]), Path(found[2].decode())
            modes = (token_file.stat().st_mode & 0o777, token_file.parent.stat().st_mode & 0o777)
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                peer = Peer(stream)
                await peer.auth(token_file.read_text().strip())
                await peer.send(request(1, "session.list"))
                listed = await peer.answer(1)
        finally:
            process.send_signal(signal.SIGINT)
        rest = await read_all(err)
        assert await process.wait() == 0
        assert await read_all(process.stdout) == b""
    assert listed["result"]["sessions"][0]["path"] == str(session)
    assert b"stopped" in rest
    assert modes == (0o600, 0o700)
    assert not token_file.exists()  # removed at exit, with its folder
    assert not token_file.parent.exists()


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP"])
async def test_a_stop_signal_while_the_sessions_open_stops_the_start_cleanly(
    tmp_path: Path, stop: str
) -> None:
    """Ctrl+C during a slow start was lost (the server went on); SIGTERM killed it, leaving its
    token file. Now the start ends soon after the signal, and all is cleaned up."""
    from tests.bench.bench_core import write_session

    write_session(tmp_path / "big.jsonl", 60_000)  # long enough to open that the signal lands
    shutil.copy(EXAMPLE, tmp_path / "first.jsonl")
    names = ["first.jsonl", "big.jsonl", *(f"s{n}.jsonl" for n in range(12))]
    runtime_dir = tmp_path / "run"  # where the token file goes
    runtime_dir.mkdir(mode=0o700)
    async with await anyio.open_process(
        [*SERVE, "--port", "0", "--dir", str(tmp_path), *names],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)},
    ) as process:
        assert process.stderr is not None
        err = BufferedByteReceiveStream(process.stderr)
        try:
            first = await err.receive_until(b"\n", 4096)
        finally:
            process.send_signal(getattr(signal, stop))
        rest = await read_all(err)
        with anyio.move_on_after(120):  # a guard: before, Ctrl+C was lost and it served on
            code = await process.wait()
        if process.returncode is None:
            process.kill()
            pytest.fail(f"the server did not stop: {rest!r}")
    assert code == 0, rest
    assert first.endswith(f"{tmp_path / 'first.jsonl'}".encode())
    assert rest.endswith(b"orchestrator serve: stopped\n")
    assert b"listening" not in rest
    assert b"Traceback" not in rest
    assert b"s11.jsonl" not in rest  # the start ended a few sessions after the signal
    assert not any(tmp_path.glob("*.lock"))  # the sessions it opened are closed
    assert not any(runtime_dir.iterdir())  # the token file is gone with its folder


def socket_server(
    session: Path, path: Path, preexec_fn: Callable[[], object] | None = None
) -> subprocess.Popen[bytes]:
    """``orchestrator serve --socket PATH SESSION`` in a process of its own, once it listens."""
    process = subprocess.Popen(
        [*SERVE, "--socket", str(path), str(session)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,
    )
    assert process.stderr is not None
    while b"listening on" not in process.stderr.readline():
        assert process.poll() is None, "the server ended before it listened"
    return process


async def test_a_server_started_under_nohup_outlives_its_terminal(tmp_path: Path) -> None:
    """SIGHUP, ignored by ``nohup``, stopped the server all the same (its receiver undid it)."""
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    path = tmp_path / "serve.sock"
    # SIGHUP ignored, as nohup does.
    process = socket_server(session, path, lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        assert process.stderr is not None
        # Still ignored once it serves (Linux says so for each process): no receiver undid it.
        status = Path(f"/proc/{process.pid}/status").read_text()
        found = re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M)
        assert found is not None, status
        ignored = int(found[1], 16)
        assert ignored & (1 << (signal.SIGHUP - 1))
        process.send_signal(signal.SIGHUP)
        async with await anyio.connect_unix(path) as stream:  # still serving
            peer = Peer(stream)
            await peer.send(request(1, "session.list"))
            listed = await peer.answer(1)
        process.terminate()
        rest = process.stderr.read()
        assert process.wait() == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert listed["result"]["sessions"][0]["path"] == str(session)
    assert rest.endswith(b"orchestrator serve: stopped\n")


def test_serve_refuses_a_session_outside_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["serve", "--dir", str(tmp_path), "/elsewhere/s.jsonl"]) == 1
    assert "outside the served directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["serve", "--stdio", "--port", "1"])


def test_serve_options() -> None:
    import argparse

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        from orchestrator._cli.serve import register

        register(parser.add_subparsers())
        return parser.parse_args(["serve", *argv])

    offline = _options(parse())
    assert offline.agent_factory is None
    assert offline.root is None
    assert offline.settings is not None
    assert offline.settings.context_window == 128_000
    chat = _options(
        parse(
            "--model",
            "openai/gpt-test",
            "--model",
            "openai/other",
            "--context-window",
            "64000",
            "--keep-recent-tokens",
            "500",
            "--dir",
            "/srv",
        )
    )
    assert chat.agent_factory is not None
    agent = chat.agent_factory()
    assert isinstance(agent, ChatAgent)
    assert agent.model.name == "openai/gpt-test"
    assert chat.summarizer is not None
    assert len(chat.summarizer.candidates) == 2
    assert chat.settings is not None
    assert chat.settings.context_window == 64000
    assert chat.settings.compaction.keep_recent_tokens == 500
    assert chat.root == Path("/srv")


async def test_fd_transport_over_a_pipe_and_a_regular_file(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    out_file = tmp_path / "out"
    with open(out_file, "wb") as out, open(EXAMPLE, "rb") as regular:
        piped = FdTransport(read_end, out.fileno())
        os.write(write_end, b"hello\n")
        os.close(write_end)
        assert await piped.read() == b"hello\n"
        assert await piped.read() == b""
        await piped.write(b"x" * 10_000)
        from_file = FdTransport(regular.fileno(), out.fileno())
        assert (await from_file.read()).startswith(b'{"type":"session"')
        assert await from_file.read()  # a file is never polled: the next read goes straight on
    os.close(read_end)
    assert out_file.read_bytes() == b"x" * 10_000


async def test_serve_stdio_on_given_descriptors(tmp_path: Path) -> None:
    hub = example_hub(tmp_path)
    in_read, in_write = os.pipe()
    os.write(in_write, request(1, "session.open", path="example.jsonl"))
    os.close(in_write)
    with open(tmp_path / "out", "wb") as out:
        await RpcServer(hub).serve_stdio(in_read, out.fileno())
    os.close(in_read)
    hub.close_all()
    [answer] = [json.loads(line) for line in (tmp_path / "out").read_text().splitlines()]
    assert answer["result"]["entries"] == 43


async def test_stream_transport_reads_the_end_of_a_socket() -> None:
    received: list[bytes] = []
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as group:

            async def handle(stream: anyio.abc.SocketStream) -> None:
                async with stream:
                    transport = StreamTransport(stream)
                    while chunk := await transport.read():
                        received.append(chunk)
                group.cancel_scope.cancel()

            group.start_soon(listener.serve, handle)
            async with await anyio.connect_tcp("127.0.0.1", port) as client:
                await client.send(b"hi")
    assert b"".join(received) == b"hi"


# -- serve: option mistakes are one line, no traceback -----------------------------------------


def serve_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = cli_main(["serve", *argv])
    return code, capsys.readouterr().err.splitlines()


def test_serve_option_mistakes_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = tmp_path / "loose"
    loose.write_text("secret\n")
    loose.chmod(0o644)
    not_socket = tmp_path / "file"
    not_socket.write_text("")
    cases = [
        (["--port", "99999"], 2, "--port 99999: not a port number (0 to 65535)"),
        (["--port", "-1"], 2, "--port -1: not a port number (0 to 65535)"),
        (["--port", "0", "--host", "0.0.0.0"], 2, "--host 0.0.0.0: not a loopback address"),
        (["--port", "0", "--host", "example.com"], 2, "--host example.com: not a loopback"),
        (["--socket", str(not_socket), "--token-file", str(loose)], 2, "go with --port"),
        (["--api-key-file", str(loose)], 1, f"API key file {loose}: other users may read"),
        (["--api-key-file", str(tmp_path / "none")], 1, "No such file or directory"),
        (["--port", "0", "--token-file", str(loose)], 1, f"token file {loose}: other users"),
        (["--socket", str(not_socket)], 1, f"cannot listen on {not_socket}: exists and is not"),
    ]
    for argv, expected_code, message in cases:
        code, lines = serve_cli(capsys, *argv)
        assert code == expected_code, argv
        assert len(lines) == 1, (argv, lines)
        assert lines[0].startswith("orchestrator serve: ")
        assert message in lines[0], (argv, lines)


def test_serve_on_a_busy_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, lines = serve_cli(capsys, "--port", str(port))
    assert code == 1
    assert lines == [
        f"orchestrator serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


async def test_serve_unix_socket_subprocess(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    key.chmod(0o600)
    path = tmp_path / "serve.sock"
    async with await anyio.open_process(
        [*SERVE, "--socket", str(path), "--api-key-file", str(key), str(session)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stderr is not None
        assert process.stdout is not None
        err = BufferedByteReceiveStream(process.stderr)
        line = b""
        try:
            while b"listening on" not in line:
                line = await err.receive_until(b"\n", 4096)
            mode = path.stat().st_mode & 0o777
            async with await anyio.connect_unix(path) as stream:
                peer = Peer(stream)
                await peer.send(request(1, "session.list"))
                listed = await peer.answer(1)
        finally:
            process.terminate()  # SIGTERM stops it as cleanly as Ctrl+C
        rest = await read_all(err)
        assert await process.wait() == 0
        assert await read_all(process.stdout) == b""
    assert line == f"orchestrator serve: listening on unix:{path}".encode()
    assert mode == 0o600
    assert listed["result"]["sessions"][0]["path"] == str(session)
    assert b"stopped" in rest
    assert b"Traceback" not in rest
    assert not path.exists()


def test_serve_reads_the_api_key_from_a_file_and_warns_about_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from orchestrator._cli.common import API_KEY_VISIBLE
    from orchestrator._cli.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", "openai/gpt-test"])
    options = _options(args, "from-file")
    assert options.agent_factory is not None
    agent = options.agent_factory()
    assert isinstance(agent, ChatAgent)
    assert agent.model._api_key == "from-file"  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):  # one or the other
        parser.parse_args(["serve", "--api-key", "k", "--api-key-file", "f"])
    capsys.readouterr()
    # The flag still works, with a warning: stdin is empty, so the server ends at once.
    in_read, in_write = os.pipe()
    os.close(in_write)
    saved = os.dup(0)
    os.dup2(in_read, 0)
    try:
        assert cli_main(["serve", "--api-key", "sk-visible"]) == 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(in_read)
    assert capsys.readouterr().err.splitlines() == [f"orchestrator serve: {API_KEY_VISIBLE}"]
