"""Stopping the server: every request still running is answered before its connection closes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from orchestrator._rpc.connection import Limits
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import LineReader, Overlong
from orchestrator._runtime.hooks import Hooks
from orchestrator.testing import AgentHang, LocalProvider, Reply, ScriptedAgent
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
LIMIT = 4 * 1024 * 1024  # a bound on every read, far above any line here
TOKEN = "test-token"
SHUTDOWN_ERROR = {
    "code": -32003,
    "message": "Server shutting down: the operation was cancelled; the session file is unchanged",
    "data": {"kind": "shutdown", "applied": False},
}
OPERATION_SHUTDOWN_ERROR = {
    **SHUTDOWN_ERROR,
    "data": {"kind": "shutdown", "applied": False, "operationId": ANY},
}
"""An operation's (``session.compress``): with its id, as every error of an operation."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(request_id: int, method: str, **params: Any) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return (json.dumps(message) + "\n").encode()


async def read_all(stream: BufferedByteReceiveStream) -> bytes:
    data = bytearray()
    while True:
        try:
            data += await stream.receive(LIMIT)
        except anyio.EndOfStream:
            return bytes(data)
        assert len(data) < LIMIT


async def lines_until_closed(stream: BufferedByteReceiveStream) -> list[Any]:
    """Every message the server sends until it closes the connection."""
    messages: list[Any] = []
    while True:
        try:
            line = await stream.receive_until(b"\n", LIMIT)
        except (anyio.EndOfStream, anyio.IncompleteRead):
            return messages
        messages.append(json.loads(line))


async def test_a_request_running_at_shutdown_is_answered_before_the_connection_closes(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    before = session.read_bytes()
    socket_path = tmp_path / "serve.sock"
    with LocalProvider((Reply.hang(Reply.remote("too late")),)) as provider:
        command = [sys.executable, "-m", "orchestrator", "serve", "--socket", str(socket_path)]
        command += ["--remote", provider.url + "/summary", str(session)]
        async with await anyio.open_process(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        ) as process:
            assert process.stderr is not None
            err = BufferedByteReceiveStream(process.stderr)
            messages: list[Any] = []
            stopped = False
            try:
                while b"listening on" not in await err.receive_until(b"\n", 4096):
                    pass
                async with await anyio.connect_unix(socket_path) as stream:
                    client = BufferedByteReceiveStream(stream)
                    await stream.send(request(1, "session.open", path=str(session)))
                    opened = json.loads(await client.receive_until(b"\n", LIMIT))
                    sid = opened["result"]["session_id"]
                    await stream.send(request(2, "session.compress", session_id=sid))
                    started = json.loads(await client.receive_until(b"\n", LIMIT))
                    # The compaction is running (its summary will be held by the provider).
                    assert started["params"]["event"]["status"] == "in_progress", started
                    process.terminate()
                    stopped = True
                    messages = await lines_until_closed(client)
            finally:
                if not stopped:  # stopped once, however the block ends
                    process.terminate()
                rest = await read_all(err)
            assert await process.wait() == 0
    *events, answer = messages  # the answer is the last line before the connection closed
    assert answer == {"jsonrpc": "2.0", "id": 2, "error": OPERATION_SHUTDOWN_ERROR}
    kinds = [e["params"]["event"]["type"] for e in events]
    assert kinds == ["compaction_update", "session_compact_failed"], kinds
    assert events[0]["params"]["event"]["status"] == "cancelled"
    assert events[1]["params"]["event"]["aborted"] is True
    assert b"Traceback" not in rest
    assert session.read_bytes() == before
    journal = session.with_name("s.jsonl.journal").read_text(encoding="utf-8").splitlines()
    operation = [r for r in map(json.loads, journal) if r["machine"] == "operation"]
    assert operation[-1]["to"] == "cancelled", operation[-1]


class Served:
    """A server on loopback TCP holding one session whose agent hangs, and a client of it."""

    def __init__(self, server: RpcServer, port: int, stream: Any, agent: ScriptedAgent) -> None:
        self.server, self.port, self.stream, self.agent = server, port, stream, agent
        self.client = BufferedByteReceiveStream(stream)
        self.sid = ""

    async def call(self, line: bytes) -> Any:
        """The answer to ``line`` (events on the way are passed over)."""
        await self.stream.send(line)
        while True:
            message = json.loads(await self.client.receive_until(b"\n", LIMIT))
            if "id" in message:
                return message


@asynccontextmanager
async def serving(tmp_path: Path, limits: Limits | None = None) -> AsyncIterator[Served]:
    """Serve ``s.jsonl`` (a copy of the example) and connect, authenticated, with it open."""
    shutil.copy(EXAMPLE, tmp_path / "s.jsonl")
    agent = ScriptedAgent([[AgentHang()]])
    hub = SessionHub(RuntimeOptions(root=tmp_path, agent_factory=lambda: agent))
    server = RpcServer(hub, limits=limits)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            served = Served(server, port, stream, agent)
            await served.call(request(0, "auth", token=TOKEN))
            opened = await served.call(request(1, "session.open", path="s.jsonl"))
            served.sid = opened["result"]["session_id"]
            yield served
        group.cancel_scope.cancel()
    hub.close_all()


async def test_stopping_answers_each_running_request_of_a_batch_and_closes_new_connections(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as served:
        tree, prompt = (
            request(2, "session.tree", session_id=served.sid),
            request(3, "session.prompt", session_id=served.sid, text="hang"),
        )
        await served.stream.send(b"[" + tree.strip() + b"," + prompt.strip() + b"]\n")
        state = ""
        while state != "running":  # the turn has started: the agent is being called
            state = (await served.call(request(9, "session.list")))["result"]["sessions"][0][
                "state"
            ]
        await served.server.stop()
        messages = await lines_until_closed(served.client)
        async with await anyio.connect_tcp("127.0.0.1", served.port) as late:
            closed = await read_all(BufferedByteReceiveStream(late))
    [batch] = [m for m in messages if isinstance(m, list)]
    assert batch[0]["id"] == 2
    assert batch[0]["result"]["sessionId"] == served.sid  # it had finished: its answer is kept
    assert batch[1] == {"jsonrpc": "2.0", "id": 3, "error": SHUTDOWN_ERROR}
    assert closed == b""  # a connection made while stopping is closed without a word
    assert served.agent.remaining == 0


async def test_a_compaction_cancelled_after_its_commit_is_not_called_unchanged(
    tmp_path: Path,
) -> None:
    # The commit takes no cancel, what follows it does (here a session_compact hook that never
    # returns): stopping then answered "the session file is unchanged" for an entry in it.
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    hooks = Hooks()
    committed = anyio.Event()

    async def never_returns(event: dict[str, Any]) -> None:
        committed.set()
        await anyio.sleep_forever()

    hooks.on("session_compact", never_returns)
    hub = SessionHub(RuntimeOptions(root=tmp_path, runtime_kwargs={"hooks": hooks}))
    server = RpcServer(hub)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            client = BufferedByteReceiveStream(stream)
            await stream.send(
                request(0, "auth", token=TOKEN) + request(1, "session.open", path="s.jsonl")
            )
            answers = [json.loads(await client.receive_until(b"\n", LIMIT)) for _ in range(2)]
            sid = answers[1]["result"]["session_id"]
            await stream.send(request(2, "session.compress", session_id=sid))
            await committed.wait()
            await server.stop()
            messages = await lines_until_closed(client)
        group.cancel_scope.cancel()
    hub.close_all()
    [answer] = [m for m in messages if m.get("id") == 2]
    last = json.loads(session.read_bytes().splitlines()[-1])
    assert last["type"] == "compaction"
    assert answer["error"] == {
        "code": -32003,
        "message": (
            f"Cancelled after its commit: the compaction entry {last['id']} is in the session"
        ),
        "data": {
            "kind": "cancelled_after_commit",
            "applied": True,
            "entryId": last["id"],
            "operationId": ANY,
        },
    }


async def test_requests_read_but_not_started_at_shutdown_are_answered_too(tmp_path: Path) -> None:
    # One request may run at a time here: the lines sent after the hanging prompt are read (they
    # came in the same write) but wait behind it. Stopping answered the prompt and left them
    # with no answer at all; each is now answered with the shutdown error (nothing was started).
    async with serving(tmp_path, Limits(max_in_flight=1)) as served:
        waiting = [request(i, "session.tree", session_id=served.sid) for i in (3, 4)]
        batch = b"[" + request(5, "session.list").strip() + b"]\n"
        notification = b'{"jsonrpc":"2.0","method":"session.list"}\n'
        prompt = request(2, "session.prompt", session_id=served.sid, text="hang")
        await served.stream.send(prompt + b"".join(waiting) + batch + notification)
        while served.agent.remaining:  # until the prompt's turn has called the agent
            await anyio.sleep(0.01)
        await served.server.stop()
        messages = await lines_until_closed(served.client)
    answers = [m for m in messages if isinstance(m, list) or "id" in m]
    assert answers == [
        {"jsonrpc": "2.0", "id": 2, "error": SHUTDOWN_ERROR},
        {"jsonrpc": "2.0", "id": 3, "error": SHUTDOWN_ERROR},
        {"jsonrpc": "2.0", "id": 4, "error": SHUTDOWN_ERROR},
        [{"jsonrpc": "2.0", "id": 5, "error": SHUTDOWN_ERROR}],
    ]  # in the order sent; the notification gets none


class Chunks:
    """A transport reading the given chunks, then waiting for ever (a client that went quiet)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def read(self) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        await anyio.sleep_forever()
        return b""

    async def write(self, data: bytes) -> None:
        raise AssertionError("nothing is written")

    async def close(self) -> None:
        pass


async def test_the_lines_a_reader_holds_come_out_as_next_would_give_them() -> None:
    # What a stopping connection answers: the whole lines already read, an overlong one as
    # Overlong (answered -32700, never parsed), and not the unfinished last one.
    sent = b'{"a":1}\n' + b"y" * 100 + b'\n{"b":2}\n{"c"'
    reader = LineReader(Chunks(sent), limit=16)
    assert await reader.next() == b'{"a":1}'
    assert reader.held() == Overlong(16)
    assert reader.held() == b'{"b":2}'
    assert reader.held() is None
    assert reader.held() is None  # asking again reads nothing


async def test_a_prompt_queued_behind_a_compaction_never_starts_at_shutdown(
    tmp_path: Path,
) -> None:
    # Issue 35: with a prompt queued behind a running compaction, stopping the server left the
    # compaction's request unanswered, then started the queued prompt: a new model call and two
    # entries written after the signal.
    from orchestrator._core.model import ModelRequest, ModelResponse
    from orchestrator._runtime.operation.summarize import SummaryRoutes
    from orchestrator.testing import FakeClock, FunctionModel
    from orchestrator.testing._agent import reply

    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    before = session.read_bytes()
    summarizing = anyio.Event()

    async def hang(request: ModelRequest) -> ModelResponse:
        summarizing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = ScriptedAgent([[reply("too late")]])
    routes = SummaryRoutes(candidates=(FunctionModel(hang),), sleep=FakeClock().sleep)
    hub = SessionHub(RuntimeOptions(root=tmp_path, agent_factory=lambda: agent, summarizer=routes))
    server = RpcServer(hub)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            served = Served(server, port, stream, agent)
            await served.call(request(0, "auth", token=TOKEN))
            opened = await served.call(request(1, "session.open", path="s.jsonl"))
            sid = opened["result"]["session_id"]
            await stream.send(request(2, "session.compress", session_id=sid))
            await summarizing.wait()
            queued = await served.call(request(3, "session.prompt", session_id=sid, text="next"))
            assert queued["result"]["queued"] is True, queued
            await server.stop()
            messages = await lines_until_closed(served.client)
        group.cancel_scope.cancel()
    hub.close_all()
    answers = {m["id"]: m for m in messages if isinstance(m, dict) and "id" in m}
    assert answers[2] == {"jsonrpc": "2.0", "id": 2, "error": OPERATION_SHUTDOWN_ERROR}
    assert agent.remaining == 1  # the queued prompt never ran
    assert session.read_bytes() == before
