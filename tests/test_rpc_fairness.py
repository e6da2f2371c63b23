"""Heavy requests share the server fairly (``_rpc/fair.py``), shown with a fake slow operation.

The fake operation (``test.slow``) is heavy work whose thread waits until the test releases it,
so nothing here depends on how fast the machine is: the tests wait for events, never for time.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.stapled import StapledObjectStream

from orchestrator._core.errors import Cancelled
from orchestrator._rpc import connection
from orchestrator._rpc.connection import Limits
from orchestrator._rpc.errors import CANCELLED, LIMIT, RpcError
from orchestrator._rpc.fair import Fairness
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Method, Params, Peer, encode
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import StreamTransport
from orchestrator._rpc.work import Stop, pieces_of
from orchestrator._runtime import ports
from orchestrator._store.reports import context_report

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gate:
    """One fake operation: set when its thread began, and what lets it end."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.release = threading.Event()

    async def started(self) -> None:
        await anyio.to_thread.run_sync(self.began.wait)


class SlowHub(SessionHub):
    """A hub with ``test.slow``: heavy work that runs until the test releases it."""

    def __init__(self, root: Path) -> None:
        super().__init__(RuntimeOptions(root=root))
        self.gates: dict[str, Gate] = {}
        self.ran: list[str] = []

    def gate(self, name: str) -> Gate:
        return self.gates.setdefault(name, Gate())

    def methods(self) -> dict[str, Method]:
        slow = Method(handler=self._slow, params=frozenset({"name", "key"}), heavy=True)
        return {**super().methods(), "test.slow": slow}

    async def _slow(self, p: Params) -> dict[str, Any]:
        name = p.text("name")
        gate = self.gate(name)

        def prepare() -> Callable[[Stop], dict[str, Any]]:
            def work(stop: Stop) -> dict[str, Any]:
                self.ran.append(name)
                gate.began.set()
                gate.release.wait()
                stop.check()
                return {"done": name}

            return work

        return await self.fair.run(p.peer, p.optional_text("key") or name, prepare)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[SlowHub]:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    made = SlowHub(tmp_path)
    yield made
    for gate in made.gates.values():  # a failed test leaves no thread waiting
        gate.release.set()
    made.close_all()


class Pipe:
    """A client's end of a connection: lines to send, answers as they come."""

    def __init__(self) -> None:
        self.to_server, self.incoming = anyio.create_memory_object_stream[bytes](100)
        self.out = bytearray()
        self.wrote = anyio.Event()
        self.broken = False  # the client is gone: writes fail
        self.closed = anyio.Event()

    async def read(self) -> bytes:
        try:
            return await self.incoming.receive()
        except anyio.EndOfStream:
            return b""

    async def write(self, data: bytes) -> None:
        if self.broken:
            raise anyio.BrokenResourceError
        self.out += data
        self.wrote.set()
        self.wrote = anyio.Event()

    async def close(self) -> None:
        self.broken = True
        self.closed.set()

    async def send(self, *requests: tuple[int, str, dict[str, Any]]) -> None:
        lines = [
            encode({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n"
            for i, method, params in requests
        ]
        await self.to_server.send("".join(lines).encode())

    def answers(self) -> dict[int, Any]:
        found = {}
        for line in bytes(self.out).split(b"\n")[:-1]:  # whole lines (an answer may be coming)
            message = json.loads(line)
            if "id" in message:
                found[message["id"]] = message
        return found

    async def answer(self, request_id: int) -> Any:
        while request_id not in self.answers():
            await self.wrote.wait()
        return self.answers()[request_id]


def slow(request_id: int, name: str, key: str | None = None) -> tuple[int, str, dict[str, Any]]:
    return request_id, "test.slow", {"name": name, **({"key": key} if key else {})}


@pytest.fixture
async def connect(hub: SlowHub) -> AsyncIterator[Callable[..., Pipe]]:
    """Connects a new :class:`Pipe` to a server over ``hub`` (``limits`` optional)."""
    async with anyio.create_task_group() as group:
        servers: dict[Limits, RpcServer] = {}
        pipes: list[Pipe] = []

        def make(limits: Limits | None = None) -> Pipe:
            limits = limits or Limits()
            server = servers.setdefault(limits, RpcServer(hub, limits=limits))
            pipes.append(Pipe())
            group.start_soon(server.serve_connection, pipes[-1])
            return pipes[-1]

        yield make
        for gate in hub.gates.values():
            gate.release.set()
        group.cancel_scope.cancel()
    for pipe in pipes:
        pipe.to_server.close()
        pipe.incoming.close()


async def test_another_client_is_answered_while_heavy_work_runs(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    heavy, light = connect(), connect()
    await heavy.send(slow(1, "a"))
    await hub.gate("a").started()
    await light.send((1, "session.list", {}))
    assert (await light.answer(1))["result"] == {"sessions": []}
    assert 1 not in heavy.answers()  # still running
    hub.gate("a").release.set()
    assert (await heavy.answer(1))["result"] == {"done": "a"}


async def test_one_heavy_request_per_connection_runs_at_a_time(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    # The server would run both; the connection's turn keeps them apart.
    first, other = connect(Limits(max_heavy=3)), connect(Limits(max_heavy=3))
    assert hub.fair.total == 3
    await first.send(slow(1, "a1"), slow(2, "a2"))
    await hub.gate("a1").started()
    await other.send(slow(1, "b"))
    await hub.gate("b").started()
    await anyio.wait_all_tasks_blocked()
    assert hub.ran == ["a1", "b"]
    hub.gate("a1").release.set()
    await hub.gate("a2").started()  # its turn now
    assert hub.ran == ["a1", "b", "a2"]
    hub.gate("a2").release.set()
    hub.gate("b").release.set()
    assert [(await first.answer(i))["result"]["done"] for i in (1, 2)] == ["a1", "a2"]


async def test_the_65th_request_of_a_connection_waits(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    pipe = connect(Limits(max_in_flight=64, max_heavy=64))
    await pipe.send(*(slow(i, f"s{i}") for i in range(64)), (64, "session.list", {}))
    await hub.gate("s0").started()
    await anyio.wait_all_tasks_blocked()
    assert hub.ran == ["s0"]  # the other 63 wait for the connection's turn
    assert pipe.answers() == {}  # the 65th line is not even read
    for i in range(64):
        hub.gate(f"s{i}").release.set()
    listed = await pipe.answer(64)
    # A light request waits for the heavy ones its connection sent before it: in order.
    assert sorted(pipe.answers()) == list(range(65))
    assert listed["result"] == {"sessions": []}
    assert hub.ran == [f"s{i}" for i in range(64)]


async def test_a_client_that_leaves_cancels_its_waiting_work(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    pipe = connect()
    await pipe.send(slow(1, "a"), slow(2, "b"), slow(3, "c"))
    await hub.gate("a").started()
    pipe.broken = True  # the client went away; its answers cannot be written
    await pipe.to_server.aclose()
    hub.gate("a").release.set()
    await pipe.closed.wait()  # a's answer could not be written: the server knows it left
    await anyio.wait_all_tasks_blocked()
    assert hub.ran == ["a"]  # b and c never ran
    assert hub.fair.started == 1


async def test_the_server_runs_at_most_total_heavy_jobs(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    assert hub.fair.total == 2
    pipes = [connect() for _ in range(3)]
    for n, pipe in enumerate(pipes):
        await pipe.send(slow(1, f"p{n}"))
    await hub.gate("p0").started()
    await hub.gate("p1").started()
    await anyio.wait_all_tasks_blocked()
    # Three connections read at once: which of the first two the server took first is the
    # scheduler's choice; that the third waits for a slot is the promise.
    assert sorted(hub.ran) == ["p0", "p1"]
    assert hub.fair.running == 2
    hub.gate("p0").release.set()
    await hub.gate("p2").started()
    assert hub.fair.peak == 2
    for name in ("p1", "p2"):
        hub.gate(name).release.set()
    assert [(await p.answer(1))["result"]["done"] for p in pipes] == ["p0", "p1", "p2"]


async def test_work_on_one_session_is_serialized(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    one, two = connect(), connect()
    await one.send(slow(1, "first", key="same"))
    await hub.gate("first").started()
    await two.send(slow(1, "second", key="same"))
    await anyio.wait_all_tasks_blocked()
    assert hub.ran == ["first"]  # a place is free, but not the session
    hub.gate("first").release.set()
    await hub.gate("second").started()
    hub.gate("second").release.set()
    assert (await two.answer(1))["result"] == {"done": "second"}


async def test_running_work_is_asked_to_stop_when_its_client_leaves() -> None:
    fair, peer, gate = Fairness(), Peer(), Gate()

    def prepare() -> Callable[[Stop], str]:
        def work(stop: Stop) -> str:
            gate.began.set()
            gate.release.wait()
            stop.check()
            return "finished"

        return work

    outcome: list[BaseException] = []

    async def run() -> None:
        try:
            await fair.run(peer, "s", prepare)
        except Cancelled as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await gate.started()
        peer.leave()
        gate.release.set()
    assert [str(e) for e in outcome] == ["Cancelled: the client left"]


async def test_a_session_context_is_encoded_once_per_context(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    pipe = connect()
    await pipe.send((1, "session.open", {"path": "example.jsonl"}))
    session_id = (await pipe.answer(1))["result"]["session_id"]
    context = (2, "session.context", {"session_id": session_id})
    tree = (3, "session.tree", {"session_id": session_id})
    await pipe.send(context, tree, (4, *context[1:]), (5, *tree[1:]))
    answers = [(await pipe.answer(i))["result"] for i in (2, 3, 4, 5)]
    assert answers[0] == answers[2]
    assert answers[1] == answers[3]
    assert answers[0]["leafId"] == answers[1]["leafId"] == "935170bb"
    slot = hub._slots[session_id]
    assert set(slot.answers.answers) == {"session.context", "session.tree"}
    assert hub.fair.started == 5  # the cached answers still take their turn


def test_encoding_in_steps_matches_the_encoder() -> None:
    value = {
        "a": list(range(1234)),
        "b": iter([{"x": "\udc80"}, None]),
        "c": [],
        "d": "é",
    }
    expected = encode({**value, "b": [{"x": "\udc80"}, None]})
    assert b"".join(pieces_of(value)).decode() == expected
    assert b"".join(pieces_of({})) == b"{}"


async def test_a_unix_socket_tells_when_its_client_hung_up(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listener = await anyio.create_unix_listener(path)
    async with listener:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))
        stream = await listener.accept()
        transport = StreamTransport(stream)
        client.shutdown(socket.SHUT_WR)  # no more requests, but it still reads: not gone
        assert not transport.hung_up()
        client.close()
        assert transport.hung_up()
        await stream.aclose()
        assert transport.hung_up()
    send, receive = anyio.create_memory_object_stream[bytes](1)
    with send, receive:  # no socket under it: it cannot tell
        assert not StreamTransport(StapledObjectStream(send, receive)).hung_up()  # type: ignore[arg-type]


async def test_a_request_of_a_client_already_gone_never_starts() -> None:
    fair, peer = Fairness(), Peer()
    peer.leave()
    with pytest.raises(RpcError) as caught:
        await fair.run(peer, "s", lambda: lambda stop: "never")
    assert caught.value.code == CANCELLED
    assert fair.started == 0


async def test_the_context_of_a_leaf_the_runtime_keeps_none_for_is_built_in_the_thread(
    hub: SlowHub, connect: Callable[..., Pipe]
) -> None:
    pipe = connect()
    await pipe.send((1, "session.open", {"path": "example.jsonl"}))
    session_id = (await pipe.answer(1))["result"]["session_id"]
    session = hub.runtime(session_id).session
    session.branch(session.tree.entries[5]["id"])  # the leaf moves without an entry
    assert not session.context_is_live
    await pipe.send((2, "session.context", {"session_id": session_id}))
    answer = (await pipe.answer(2))["result"]
    assert answer == context_report(session, session.leaf_id)
    assert hub._slots[session_id].answers.answers == {}  # not kept: no version to check


async def test_a_heavy_answer_cut_by_a_drop_ends_its_line_before_the_limit_line(
    hub: SlowHub,
) -> None:
    server = RpcServer(hub, limits=Limits(max_queued_bytes=64 * 1024))
    pipe = Held()
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, pipe)
        await pipe.send((1, "session.open", {"path": "example.jsonl"}))
        session_id = (await pipe.answer(1))["result"]["session_id"]
        pipe.hold = True  # the client takes the next write, then stops reading
        await pipe.send((2, "session.context", {"session_id": session_id}))
        await pipe.holding.wait()  # the first piece of the answer was written
        events = hub.runtime(session_id).events
        for n in range(100):  # 100 KB of events behind it: over the bound, the client is dropped
            events.emit("message", n=n, text="x" * 1000)
        pipe.proceed.set()
    lines = bytes(pipe.out).split(b"\n")
    assert json.loads(lines[0])["id"] == 1
    assert lines[1].startswith(b'{"jsonrpc":"2.0","id":2,"result":')  # cut
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[1])
    assert json.loads(lines[2])["error"]["code"] == LIMIT
    assert lines[3:] == [b""]
    pipe.to_server.close()
    pipe.incoming.close()


class Held(Pipe):
    """A pipe whose client stops reading after one more write, once ``hold`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.holding = anyio.Event()
        self.proceed = anyio.Event()

    async def write(self, data: bytes) -> None:
        await super().write(data)
        if self.hold:
            self.holding.set()
            await self.proceed.wait()


async def test_a_client_that_hangs_up_its_unix_socket_cancels_its_waiting_work(
    hub: SlowHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "HANGUP_POLL", 0.01)
    left = anyio.Event()
    leave = Peer.leave

    def leaving(peer: Peer) -> None:
        leave(peer)
        left.set()

    monkeypatch.setattr(Peer, "leave", leaving)
    server = RpcServer(hub)
    path = tmp_path / "s.sock"
    async with anyio.create_task_group() as group:
        await group.start(server.serve_unix, path)
        client = await anyio.connect_unix(path)
        lines = [
            encode({"jsonrpc": "2.0", "id": i, "method": "test.slow", "params": {"name": n}})
            for i, n in enumerate("abc")
        ]
        await client.send(("\n".join(lines) + "\n").encode())
        await hub.gate("a").started()
        await client.aclose()  # gone while a runs and b, c wait: no write has failed yet
        await left.wait()
        await anyio.wait_all_tasks_blocked()
        assert hub.ran == ["a"]
        hub.gate("a").release.set()
        group.cancel_scope.cancel()
    assert hub.ran == ["a"]


class SlowOpenHub(SlowHub):
    """A hub whose file reading waits for the test (gate ``load``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        load = self.host._load

        def slowly(*args: Any) -> Any:
            gate = self.gate("load")
            gate.began.set()
            gate.release.wait()
            return load(*args)

        self.host._load = slowly  # type: ignore[method-assign,assignment]


async def test_a_session_read_while_the_server_stops_is_not_lost(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    hub = SlowOpenHub(tmp_path)
    server = RpcServer(hub)
    pipe = Pipe()
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, pipe)
        await pipe.send((1, "session.open", {"path": "example.jsonl"}))
        await hub.gate("load").started()
        group.start_soon(server.stop)
        await anyio.wait_all_tasks_blocked()
        hub.gate("load").release.set()  # the file is read after all, once stopping began
        answer = await pipe.answer(1)
    # The thread's result is not lost to the cancel: the session is open (the answer says so),
    # and closing the hub, as the server does once stopped, releases it.
    assert hub.session_ids() == {answer["result"]["session_id"]}
    hub.close_all()
    again = SessionHub(RuntimeOptions(root=tmp_path))
    assert again.open("example.jsonl") is again.open("example.jsonl")  # its lock was released
    again.close_all()
    pipe.to_server.close()
    pipe.incoming.close()


async def test_a_fork_and_a_navigation_of_a_big_session_run_as_heavy_work(
    hub: SlowHub, connect: Callable[..., Pipe], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Their copy, walks and context ran on the event loop: 4 forks of a 200,000-entry session
    # stopped every other client for 8.8 s, a navigation for 1.3 s (bench_fairness.py).
    monkeypatch.setattr(ports, "HEAVY_ENTRIES", 0)  # the example counts as big
    pipe = connect()
    await pipe.send((1, "session.open", {"path": "example.jsonl"}))
    session_id = (await pipe.answer(1))["result"]["session_id"]
    opened = hub.fair.started
    await pipe.send(
        (2, "session.fork", {"session_id": session_id, "entry_id": "ec48c90d", "path": "f.jsonl"})
    )
    assert "result" in await pipe.answer(2)
    assert hub.fair.started == opened + 1  # the copy and its write
    session = hub.runtime(session_id).session
    target = session.tree.entries[6]["id"]
    await pipe.send((3, "session.tree.navigate", {"session_id": session_id, "target_id": target}))
    assert (await pipe.answer(3))["result"]["newLeafId"] == target
    assert hub.fair.started == opened + 3  # the branch's walk and the new context
    assert hub.fair.running == 0
