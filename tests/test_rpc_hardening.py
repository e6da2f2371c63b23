"""The server under a hostile client: garbage, deep nesting, huge lines and batches, clients that
do not read, clients without the token, browsers, other users (issue: a hardened server, D30)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._rpc.connection import Limits
from orchestrator._rpc.errors import INVALID_REQUEST, LIMIT, PARSE_ERROR, UNAUTHORIZED
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import FdTransport, StreamTransport
from tests.runtime_kit import until

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"
SID = json.loads(EXAMPLE.read_text().splitlines()[0])["id"]
TOKEN = "s3cret-token"
READ_CAP = 64 * 1024 * 1024  # a bound on every read of a whole reply stream
METHODS = [
    "session.open",
    "session.list",
    "session.tree",
    "session.context",
    "session.abort",
    "session.fork",
    "session.tree.navigate",
    "auth",
    "nope",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(request_id: Any, method: str, **params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return (json.dumps(message) + "\n").encode()


def strict(line: bytes) -> Any:
    """Parse as JSON allows (no NaN or Infinity): the server must never write anything else."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} written: {line[:200]!r}")

    return json.loads(line, parse_constant=refuse)


def replies(data: bytes) -> list[Any]:
    """Every line the server wrote, each checked to be a well-formed JSON-RPC response."""
    messages = [strict(line) for line in data.splitlines()]
    for message in messages:
        for answer in message if isinstance(message, list) else [message]:
            assert answer["jsonrpc"] == "2.0"
            if "id" in answer:
                assert ("result" in answer) != ("error" in answer)
                if "error" in answer:
                    # Nothing a client sends is an internal error (a bug) on our side.
                    assert answer["error"]["code"] != -32603, answer
    return messages


def fresh_hub(folder: Path) -> SessionHub:
    shutil.copy(EXAMPLE, folder / "example.jsonl")
    return SessionHub(RuntimeOptions(root=folder))


# -- garbage -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)
requests = st.builds(
    lambda method, request_id, params: json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    ),
    st.sampled_from(METHODS),
    st.integers() | st.text(max_size=4),
    st.fixed_dictionaries(
        {},
        optional={
            "session_id": st.just(SID) | st.text(max_size=4),
            "path": st.sampled_from(["example.jsonl", "a\x00b", "../x", "/", "."])
            | st.text(max_size=6),
            "entry_id": st.text(max_size=8),
            "target_id": st.sampled_from(["ec48c90d", "935170bb"]) | st.text(max_size=4),
            "x": json_values,
        },
    ),
)
special = st.sampled_from(
    [
        '{"jsonrpc":"2.0","id":NaN,"method":"session.list"}',
        '{"jsonrpc":"2.0","id":Infinity,"method":"session.list"}',
        '{"jsonrpc":"2.0","id":1e400,"method":"session.list"}',
        '{"jsonrpc":"2.0","id":-1e400,"method":"session.list"}',
        '{"jsonrpc":"2.0","id":' + "9" * 5000 + ',"method":"session.list"}',
        '{"jsonrpc":"2.0","id":1,"method":"session.open","params":{"path":"a\\u0000b"}}',
        '{"jsonrpc":"2.0","id":1,"method":"session.fork","params":'
        '{"session_id":"' + SID + '","entry_id":"ec48c90d","path":"no/such/dir/f.jsonl"}}',
        "[]",
        "[1,2,3]",
        "\ufeff{}",
    ]
)
nesting = st.tuples(st.integers(1, 3000), st.sampled_from(["[", '{"a":'])).map(
    lambda t: t[1] * t[0] + ("]" if t[1] == "[" else "}") * t[0]
)
batches = st.lists(requests, min_size=0, max_size=120).map(lambda rs: "[" + ",".join(rs) + "]")
text_lines = st.one_of(
    requests, special, nesting, batches, json_values.map(json.dumps), st.text(max_size=200)
)
LINE = 64 * 1024  # the fuzzed servers' line bound (smaller than the default, to reach it)
garbage = st.one_of(
    st.lists(text_lines, max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8")),
    st.binary(max_size=3000),
    st.integers(LINE - 8, LINE + 64).map(lambda n: b"x" * n),  # huge lines about the bound
    st.integers(0, 2).map(lambda n: b"[" * (3 * LINE) + b"\n" * n),  # unfinished huge line
)
LIMITS = Limits(max_line_bytes=LINE, auth_timeout=30.0)
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def looks_like_http(data: bytes) -> bool:
    first = data.split(b"\n", 1)[0]
    return re.match(rb"^[A-Za-z]{3,16} \S+ HTTP/\d", first) is not None


@FUZZ
@given(data=garbage)
def test_fuzz_stdio_answers_every_line_then_the_next_request(tmp_path: Path, data: bytes) -> None:
    """Over the stdio transport: garbage, then a probe on the same stream still answered."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    hub = fresh_hub(folder)
    logs: list[str] = []
    (folder / "in").write_bytes(data + b"\n" + request("probe", "session.list"))

    async def run() -> None:
        server = RpcServer(hub, limits=LIMITS, log=logs.append)
        with open(folder / "in", "rb") as source, open(folder / "out", "wb") as sink:
            await server.serve_connection(FdTransport(source.fileno(), sink.fileno()))

    try:
        anyio.run(run)
    finally:
        hub.abort_all()
        hub.close_all()
    out = (folder / "out").read_bytes()
    assert logs == []
    if looks_like_http(data):
        assert out.startswith(b"HTTP/1.1 400 Bad Request")
        return
    answers = [m for m in replies(out) if isinstance(m, dict) and m.get("id") == "probe"]
    assert len(answers) == 1
    assert "sessions" in answers[0]["result"]


async def read_to_end(stream: anyio.abc.ByteReceiveStream) -> bytes:
    data = bytearray()
    while True:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return bytes(data)
        assert len(data) < READ_CAP


async def exchange(stream: anyio.abc.SocketStream, data: bytes) -> bytes:
    """Send ``data``, say that is all, and read until the server closes."""
    async with stream:
        await stream.send(data)
        await stream.send_eof()
        return await read_to_end(stream)


async def probe(connect: Any, token: str | None) -> dict[str, Any]:
    """A well-behaved second client: (auth,) list the sessions."""
    first = request(0, "auth", token=token) if token else b""
    out = await exchange(await connect(), first + request("probe", "session.list"))
    [answer] = [m for m in replies(out) if m.get("id") == "probe"]
    return dict(answer)


def socket_case(folder: Path, data: bytes, *, tcp: bool) -> tuple[bytes, dict[str, Any], list[str]]:
    hub = fresh_hub(folder)
    logs: list[str] = []

    async def run() -> tuple[bytes, dict[str, Any]]:
        server = RpcServer(hub, limits=LIMITS, log=logs.append)
        async with anyio.create_task_group() as group:
            if tcp:
                port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
                connect: Any = partial(anyio.connect_tcp, "127.0.0.1", port)
                first = request(0, "auth", token=TOKEN)
            else:
                path = folder / "s.sock"
                await group.start(server.serve_unix, path)
                connect = partial(anyio.connect_unix, path)
                first = b""
            out = await exchange(await connect(), first + data)
            answer = await probe(connect, TOKEN if tcp else None)
            group.cancel_scope.cancel()
        return out, answer

    try:
        out, answer = anyio.run(run)
    finally:
        hub.abort_all()
        hub.close_all()
    return out, answer, logs


@FUZZ
@given(data=garbage)
def test_fuzz_tcp_then_another_client_is_answered(tmp_path: Path, data: bytes) -> None:
    out, answer, logs = socket_case(Path(tempfile.mkdtemp(dir=tmp_path)), data, tcp=True)
    assert logs == []
    assert "sessions" in answer["result"]
    lines = out.splitlines()
    assert strict(lines[0])["result"] == {"authenticated": True}
    replies(b"\n".join(lines[1:]))


@FUZZ
@given(data=garbage)
def test_fuzz_unix_socket_then_another_client_is_answered(tmp_path: Path, data: bytes) -> None:
    out, answer, logs = socket_case(Path(tempfile.mkdtemp(dir=tmp_path)), data, tcp=False)
    assert logs == []
    assert "sessions" in answer["result"]
    if looks_like_http(data):
        assert out.startswith(b"HTTP/1.1 400 Bad Request")
    else:
        replies(out)


# -- the reported breaks, on a real `serve` process --------------------------------------------

SERVE = [sys.executable, "-m", "orchestrator", "serve"]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tcp_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A real ``serve --port 0`` process with a token file; yields (port, token)."""
    shutil.copy(EXAMPLE, tmp_path / "s.jsonl")
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)
    process = subprocess.Popen(
        [*SERVE, "--port", "0", "--token-file", str(tmp_path / "token"), "--dir", str(tmp_path)]
        + ["s.jsonl"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    line = b""
    while b"listening on" not in line:
        line = process.stderr.readline()
        assert line, "the server ended before listening"
    port = int(line.split(b"127.0.0.1:")[1].split()[0])
    try:
        yield port, TOKEN
    finally:
        process.terminate()
        assert process.wait() == 0
        rest = process.stderr.read()
        process.stderr.close()
        assert b"Traceback" not in rest


def blocking_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        out = bytearray()
        while chunk := client.recv(65536):
            out += chunk
            assert len(out) < READ_CAP
        return bytes(out)


def test_the_reported_breaks_leave_a_real_server_answering(tcp_server: tuple[int, str]) -> None:
    port, token = tcp_server
    auth = request(0, "auth", token=token)
    deep = b"[" * 1200 + b"]" * 1200 + b"\n"
    out = blocking_exchange(
        port,
        auth
        + deep
        + b'{"jsonrpc":"2.0","id":NaN,"method":"session.list"}\n'
        + request(7, "session.open", path="a\x00b")
        + b"[" * (20 * 1024 * 1024)  # an unfinished 20 MiB line, over the 4 MiB bound
        + b"\n",
    )
    answers = replies(out)
    assert answers[0]["result"] == {"authenticated": True}
    errors = {a["error"]["code"] for a in answers[1:]}
    assert errors == {PARSE_ERROR, -32602}
    nul = [a for a in answers if a.get("id") == 7]
    assert "a path cannot hold a NUL character" in nul[0]["error"]["message"]
    assert answers[-1]["error"]["message"] == "Parse error: line over 4194304 bytes"
    listed = replies(blocking_exchange(port, auth + request(1, "session.list")))
    assert listed[1]["result"]["sessions"][0]["session_id"] == SID


def test_a_connection_without_the_token_gets_nothing(
    tcp_server: tuple[int, str], tmp_path: Path
) -> None:
    port, token = tcp_server
    before = (tmp_path / "s.jsonl").read_bytes()
    cases = {
        "no auth": request(1, "session.context", session_id=SID)
        + request(2, "session.compress", session_id=SID),
        "wrong token": request(1, "auth", token="guess") + request(2, "session.list"),
        "over-long first line": b"x" * 10_000 + b"\n" + request(2, "session.list"),
        "token later": request(2, "session.list") + request(1, "auth", token=token),
    }
    for name, data in cases.items():
        answers = replies(blocking_exchange(port, data))
        # One refusal, then the connection is closed: nothing about any session.
        assert len(answers) == 1, name
        assert answers[0]["error"]["code"] == UNAUTHORIZED, name
        assert answers[0]["id"] in (None, 1, 2), name
    assert (tmp_path / "s.jsonl").read_bytes() == before


def test_a_browser_post_is_refused_as_http(tcp_server: tuple[int, str], tmp_path: Path) -> None:
    port, token = tcp_server
    before = (tmp_path / "s.jsonl").read_bytes()
    body = request(1, "auth", token=token) + request(2, "session.compress", session_id=SID)
    post = (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
        b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    out = blocking_exchange(port, post)
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b'"jsonrpc"' not in out
    assert (tmp_path / "s.jsonl").read_bytes() == before


# -- bounds ------------------------------------------------------------------------------------


class Stalled:
    """A client that sends given lines and does not read until released."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)
        self.reads = 0
        self.out = bytearray()
        self.flowing = anyio.Event()
        self.closed = anyio.Event()

    async def read(self) -> bytes:
        self.reads += 1
        if self.lines:
            await anyio.lowlevel.checkpoint()
            return self.lines.pop(0)
        await self.closed.wait()  # a client that keeps the connection open
        return b""

    async def write(self, data: bytes) -> None:
        await self.flowing.wait()
        self.out += data

    async def close(self) -> None:
        self.closed.set()


def context_batch(size: int, first_id: int = 0) -> bytes:
    """A batch of ``session.context`` calls (each answer is about 100 KB)."""
    params = {"session_id": SID}
    calls = [
        {"jsonrpc": "2.0", "id": first_id + i, "method": "session.context", "params": params}
        for i in range(size)
    ]
    return (json.dumps(calls) + "\n").encode()


async def test_a_client_that_does_not_read_is_throttled_within_the_bound(tmp_path: Path) -> None:
    hub = fresh_hub(tmp_path)
    # A batch's answer is about 800 KB: reading pauses past 1 MiB waiting, the bound is 2 MiB.
    limits = Limits(max_queued_bytes=2 * 1024 * 1024, max_batch=8, max_in_flight=8)
    server = RpcServer(hub, limits=limits)
    lines = [request(1, "session.open", path="example.jsonl"), context_batch(5000)]
    lines += [context_batch(8, 100 * n) for n in range(40)]
    client = Stalled(lines)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, client)
        for _ in range(2000):  # let the server run as far as it will
            await anyio.lowlevel.checkpoint()
        # It stopped reading: most batches are still unread, and the output held is bounded.
        assert client.reads < 20
        assert server.peak_queued_bytes <= limits.max_queued_bytes
        # Once the client reads, everything it sent is answered.
        client.flowing.set()
        while client.lines:
            await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        client.closed.set()
    hub.close_all()
    answers = replies(bytes(client.out))
    # The refused batch is answered at once; the opening (in a worker thread) may come after.
    refused = next(a for a in answers if isinstance(a, dict) and a["id"] is None)
    assert refused["error"]["code"] == INVALID_REQUEST
    assert refused["error"]["message"] == (
        "Invalid request: a batch of 5000 requests; at most 8 are accepted"
    )
    batches = [a for a in answers if isinstance(a, list)]
    assert len(batches) == 40
    assert all(len(b) == 8 and "result" in b[0] for b in batches)
    assert server.peak_queued_bytes <= limits.max_queued_bytes


async def test_a_client_that_does_not_read_its_events_is_dropped(tmp_path: Path) -> None:
    hub = fresh_hub(tmp_path)
    limits = Limits(max_queued_bytes=64 * 1024)
    server = RpcServer(hub, limits=limits)
    client = Stalled([request(1, "session.open", path="example.jsonl")])
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, client)
        while SID not in hub.session_ids():
            await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        events = hub.runtime(SID).events
        for n in range(200):  # 200 events of 1 KB for a client that reads nothing
            events.emit("message", n=n, text="x" * 1000)
        assert server.peak_queued_bytes <= limits.max_queued_bytes
        client.flowing.set()
    hub.close_all()
    answers = replies(bytes(client.out))
    assert answers[0]["result"]["session_id"] == SID
    assert answers[-1]["error"] == {
        "code": LIMIT,
        "message": "Client not reading: over 65536 bytes of output waiting; closing the connection",
    }
    assert client.closed.is_set()


class TakesLittle(Stalled):
    """A client whose socket takes short writes but never a large one: it does not read."""

    def __init__(self, lines: list[bytes]) -> None:
        super().__init__(lines)
        self.stuck = anyio.Event()

    async def write(self, data: bytes) -> None:
        if len(data) > 32 * 1024:
            self.stuck.set()
            await anyio.sleep_forever()  # cancelled by the server's drop deadline
        self.out += data


async def test_a_client_that_never_reads_a_large_answer_gets_the_limit_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The deadline cancelled the large answer's write before it returned, and the writer then
    # read its unset result: UnboundLocalError, the connection never closed, no -32005 line.
    hub = fresh_hub(tmp_path)
    limits = Limits(max_queued_bytes=64 * 1024, drop_timeout=0.0)
    server = RpcServer(hub, limits=limits)
    opened = request(1, "session.open", path="example.jsonl")
    client = TakesLittle([opened, request(2, "session.context", session_id=SID)])
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, client)
        await client.stuck.wait()  # the context answer (100 KB) is being written
        events = hub.runtime(SID).events
        for n in range(100):  # 100 KB of events behind it, over the bound
            events.emit("message", n=n, text="x" * 1000)
        await client.closed.wait()
    hub.close_all()
    assert "internal error" not in capsys.readouterr().err
    opened_line, blank, limit_line, end = bytes(client.out).split(b"\n")
    assert json.loads(opened_line)["result"]["session_id"] == SID
    # The newline that ends whatever of the cut line went out: the answer is written in pieces
    # (its head went out, its messages did not).
    assert blank.startswith(b'{"jsonrpc":"2.0","id":2,') or not blank
    assert end == b""
    assert json.loads(limit_line)["error"] == {
        "code": LIMIT,
        "message": "Client not reading: over 65536 bytes of output waiting; closing the connection",
    }


async def test_too_many_connections_get_one_clear_line(tmp_path: Path) -> None:
    hub = fresh_hub(tmp_path)
    server = RpcServer(hub, limits=Limits(max_connections=2))
    path = tmp_path / "s.sock"
    async with anyio.create_task_group() as group:
        await group.start(server.serve_unix, path)
        held = [await anyio.connect_unix(path) for _ in range(2)]
        for stream in held:  # both are served
            await stream.send(request(1, "session.list"))
            answer = await BufferedByteReceiveStream(stream).receive_until(b"\n", READ_CAP)
            assert b'"sessions"' in answer
        out = await exchange(await anyio.connect_unix(path), request(1, "session.list"))
        for stream in held:
            await stream.aclose()
        await until(lambda: server.connections == 0, steps=100_000)
        group.cancel_scope.cancel()
    [answer] = replies(out)
    assert answer["error"] == {"code": LIMIT, "message": "Too many connections (at most 2)"}


async def test_connections_waiting_for_the_token_give_way_to_a_new_one(tmp_path: Path) -> None:
    # Any local user could hold every connection unauthenticated (reopening each as it timed
    # out), and the owner's own connection was refused for good with "Too many connections".
    hub = fresh_hub(tmp_path)
    server = RpcServer(hub, limits=Limits(max_connections=2))
    auth = request(1, "auth", token=TOKEN).decode()
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        squatters = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
        await until(lambda: server.connections == 2, steps=100_000)
        owner = await anyio.connect_tcp("127.0.0.1", port)
        await owner.send(auth.encode() + request(2, "session.list"))
        reader = BufferedByteReceiveStream(owner)
        first = await reader.receive_until(b"\n", READ_CAP)
        second = await reader.receive_until(b"\n", READ_CAP)
        # The oldest squatter was closed to make room; the other one still waits.
        assert await read_to_end(squatters[0]) == b""
        # A full server of authenticated connections still refuses one more.
        await squatters[1].send(auth.encode())
        await until(lambda: all(c.proven for c in server._running), steps=100_000)
        out = await exchange(await anyio.connect_tcp("127.0.0.1", port), auth.encode())
        for stream in (owner, *squatters):
            await stream.aclose()
        group.cancel_scope.cancel()
    assert json.loads(first) == {"jsonrpc": "2.0", "id": 1, "result": {"authenticated": True}}
    assert b'"sessions"' in second
    [refused] = replies(out)
    assert refused["error"] == {"code": LIMIT, "message": "Too many connections (at most 2)"}


async def test_a_failing_connection_is_logged_and_ends_alone(tmp_path: Path) -> None:
    class Broken:
        async def read(self) -> bytes:
            raise RuntimeError("disk on fire")

        async def write(self, data: bytes) -> None:
            raise AssertionError("nothing to write")

        async def close(self) -> None:
            pass

    hub = fresh_hub(tmp_path)
    logs: list[str] = []
    server = RpcServer(hub, log=logs.append)
    await server.serve_connection(Broken())
    assert logs == ["connection closed after an internal error: RuntimeError: disk on fire"]
    assert server.connections == 0


# -- who may connect ---------------------------------------------------------------------------


async def test_events_reach_only_the_connections_that_opened_the_session(tmp_path: Path) -> None:
    hub = fresh_hub(tmp_path)
    (tmp_path / "other.jsonl").write_bytes(
        EXAMPLE.read_bytes().replace(SID.encode(), b"other-session")
    )
    server = RpcServer(hub)
    path = tmp_path / "s.sock"

    async def call(stream: anyio.abc.SocketStream, line: bytes) -> list[dict[str, Any]]:
        """Send one request; return everything up to and including its answer."""
        buffered = BufferedByteReceiveStream(stream)
        await stream.send(line)
        seen = []
        while True:
            message = json.loads(await buffered.receive_until(b"\n", READ_CAP))
            seen.append(message)
            if "id" in message:
                return seen

    async with anyio.create_task_group() as group:
        await group.start(server.serve_unix, path)
        async with (
            await anyio.connect_unix(path) as owner,
            await anyio.connect_unix(path) as stranger,
        ):
            await call(owner, request(1, "session.open", path="example.jsonl"))
            await call(stranger, request(1, "session.open", path="other.jsonl"))
            owner_saw = await call(owner, request(2, "session.compress", session_id=SID))
            # The stranger's next answer comes after anything queued for it before.
            stranger_saw = await call(stranger, request(2, "session.list"))
        await until(lambda: server.connections == 0, steps=100_000)
        group.cancel_scope.cancel()
    hub.close_all()
    events = [m["params"] for m in owner_saw if "id" not in m]
    assert {e["session_id"] for e in events} == {SID}
    statuses = [e["event"]["status"] for e in events if e["event"]["type"] == "compaction_update"]
    assert statuses == ["in_progress", "completed"]
    assert [m for m in stranger_saw if "id" not in m] == []


def test_the_unix_socket_is_0600_and_another_user_cannot_connect() -> None:
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)  # the folder is open to all: only the socket's own mode protects it
    path = folder / "s.sock"
    try:
        hub = SessionHub()

        async def run() -> tuple[int, int | None, int | None]:
            async with anyio.create_task_group() as group:
                await group.start(RpcServer(hub).serve_unix, path)
                mode = stat.S_IMODE(os.stat(path).st_mode)
                refused = as_nobody(path) if os.geteuid() == 0 else None
                os.chmod(path, 0o666)  # the control: the same socket opened to all
                allowed = as_nobody(path) if os.geteuid() == 0 else None
                group.cancel_scope.cancel()
            return mode, refused, allowed

        mode, refused, allowed = anyio.run(run)
        assert mode == 0o600
        if os.geteuid() == 0:
            # Running as root, I can ask as user nobody: refused at 0600, let in at 0666.
            assert (refused, allowed) == (13, 0)
        assert not path.exists()  # removed when the server stopped
    finally:
        shutil.rmtree(folder)


def as_nobody(path: Path) -> int:
    """Connect to ``path`` as user ``nobody`` (a forked child drops to it); the errno, 0: in."""
    nobody = pwd.getpwnam("nobody")
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status only
        code = 1
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
            code = 0
        except OSError as exc:
            code = exc.errno or 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


async def test_tcp_listeners_are_loopback_only_with_a_token() -> None:
    server = RpcServer(SessionHub())
    with pytest.raises(ValueError, match="not a loopback address"):
        await server.serve_tcp(0, token=TOKEN, host="0.0.0.0")
    with pytest.raises(ValueError, match="needs a token"):
        await server.serve_tcp(0, token="")


async def test_a_silent_connection_is_refused_after_the_auth_timeout() -> None:
    server = RpcServer(SessionHub(), limits=Limits(auth_timeout=0))
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            out = await read_to_end(stream)
        group.cancel_scope.cancel()
    [answer] = replies(out)
    assert answer["error"] == {
        "code": UNAUTHORIZED,
        "message": "Unauthorized: no token sent in time",
    }


async def test_a_wrong_token_is_called_wrong_not_a_missing_auth_request() -> None:
    # It said "the first request must be {...auth...}" to a client that had sent just that.
    server = RpcServer(SessionHub())
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            out = await exchange(stream, request(7, "auth", token="guess"))
        group.cancel_scope.cancel()
    [answer] = replies(out)
    assert answer["id"] == 7
    assert answer["error"] == {
        "code": UNAUTHORIZED,
        "message": "Unauthorized: wrong token (the server's is in its token file)",
    }


async def test_the_auth_line_echoes_a_finite_id_and_refuses_one_it_cannot_echo() -> None:
    server = RpcServer(SessionHub())

    async def first_line(raw: bytes) -> list[dict[str, Any]]:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(raw + b"\n")
            await stream.send(b'{"jsonrpc":"2.0","id":2.5,"method":"session.list"}\n')
            await stream.send_eof()
            return replies(await read_to_end(stream))

    def auth(request_id: str, token: str = TOKEN) -> bytes:
        return (
            f'{{"jsonrpc":"2.0","id":{request_id},"method":"auth","params":{{"token":"{token}"}}}}'
        ).encode()

    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        finite = await first_line(auth("1.5"))
        unusable = [await first_line(auth(text)) for text in ("true", "1e400")]
        surrogate = await first_line(auth("7", token="\\ud800"))
        group.cancel_scope.cancel()
    assert finite[0] == {"jsonrpc": "2.0", "id": 1.5, "result": {"authenticated": True}}
    assert finite[1]["id"] == 2.5
    for answers in unusable:
        [refused] = answers  # and the connection closed: session.list never answered
        assert refused["id"] is None
        assert refused["error"]["code"] == UNAUTHORIZED
    [refused] = surrogate
    assert refused["id"] == 7
    assert refused["error"]["code"] == UNAUTHORIZED


async def test_stream_transport_close(tmp_path: Path) -> None:
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as group:

            async def handle(stream: anyio.abc.SocketStream) -> None:
                await StreamTransport(stream).close()

            group.start_soon(listener.serve, handle)
            async with await anyio.connect_tcp("127.0.0.1", port) as client:
                assert await read_to_end(client) == b""
            group.cancel_scope.cancel()


async def test_auth_is_held_to_the_rules_of_every_method(tmp_path: Path) -> None:
    # An auth with another parameter was accepted, and one without an id authenticated in
    # silence (the client waited for ever for {"authenticated": true}).
    server = RpcServer(fresh_hub(tmp_path))
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        extra = await exchange(
            await anyio.connect_tcp("127.0.0.1", port), request(1, "auth", token=TOKEN, x=1)
        )
        silent = await exchange(
            await anyio.connect_tcp("127.0.0.1", port), request(None, "auth", token=TOKEN)
        )
        group.cancel_scope.cancel()
    [refused] = replies(extra)
    assert (refused["id"], refused["error"]["code"]) == (1, UNAUTHORIZED)
    [refused] = replies(silent)
    assert (refused["id"], refused["error"]["code"]) == (None, UNAUTHORIZED)
