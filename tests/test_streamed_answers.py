"""A heavy answer is encoded as it is written, never whole in memory (issue 35, item 1).

``session.context`` of a 200,000-entry session is 100 MB of JSON: kept whole, it was most of
the server's growth during a flood. It is now encoded a piece at a time while the connection
writes it (``_rpc/work.py``, ``_rpc/connection.py``); only a small answer is kept with its
session (``answers.KEPT_BYTES``). The tests count the memory and the pieces, never the time:
the bytes a client receives are the very bytes of the whole encoding, and what a client that
leaves, a failing encoder, a batch, an in-process caller or a stopping server do to a stream.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._rpc import answers, work
from orchestrator._rpc.connection import AHEAD, Limits
from orchestrator._rpc.errors import INTERNAL_ERROR
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Dispatcher, encode, success
from orchestrator._rpc.server import RpcServer
from orchestrator._store.reports import context_report, tree_rows
from orchestrator._store.session import Session
from tests.bench.bench_core import write_session
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


OPEN: list[Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        client = OPEN.pop()
        client.to_server.close()
        client.incoming.close()


class Client:
    """A client's end of a connection: what it was sent, hashed, and kept when ``keep``.

    Attributes:
        fail_at: The write (counted from 1) that fails: the client left then.
        hold_at: The write after which the client stops reading until ``release`` is set.
    """

    def __init__(self, *lines: bytes, keep: bool = True) -> None:
        self.to_server, self.incoming = anyio.create_memory_object_stream[bytes](100)
        for line in lines:
            self.to_server.send_nowait(line)
        self.keep = keep
        self.out = bytearray()
        self.digest = hashlib.sha256()
        self.size = 0
        self.writes = 0
        self.fail_at: int | None = None
        self.hold_at: int | None = None
        self.holding = anyio.Event()
        self.release = anyio.Event()
        self.closed = anyio.Event()
        OPEN.append(self)

    def done_sending(self) -> None:
        self.to_server.close()

    async def read(self) -> bytes:
        try:
            return await self.incoming.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):  # it sent all, or it is gone
            return b""

    async def write(self, data: bytes) -> None:
        self.writes += 1
        if self.fail_at is not None and self.writes >= self.fail_at:
            raise anyio.BrokenResourceError
        self.digest.update(data)
        self.size += len(data)
        if self.keep:
            self.out += data
        if self.hold_at is not None and self.writes >= self.hold_at:
            self.holding.set()
            await self.release.wait()

    async def close(self) -> None:
        self.closed.set()
        self.to_server.close()  # as a socket's: the server's next read is the end


def call(request_id: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def line(message: Any) -> bytes:
    return (encode(message) + "\n").encode()


def tree_answer(session: Session) -> dict[str, Any]:
    """``session.tree``'s result, made whole as the cluster hub makes it."""
    return {
        "sessionId": session.session_id,
        "name": session.tree.session_name(),
        "leafId": session.leaf_id,
        "nodes": tree_rows(session),
    }


class Counted:
    """Wraps ``pieces_of`` in the answers: counts the pieces made, notes the generator closed.

    ``fail_after``: raise once that many pieces were made (an encoder failing midway).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_after: int | None = None) -> None:
        self.made = 0
        self.closed = 0
        self.fail_after = fail_after
        self.pieces_of = work.pieces_of
        monkeypatch.setattr(answers, "pieces_of", self)

    def __call__(self, value: Any) -> Iterator[bytes]:
        try:
            for piece in self.pieces_of(value):
                if self.fail_after is not None and self.made == self.fail_after:
                    raise RuntimeError("injected failure while encoding")
                self.made += 1
                yield piece
        finally:
            self.closed += 1


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of about 16 KiB and nothing kept: the example session's answers stream."""
    monkeypatch.setattr(work, "PIECE_BYTES", 16 * 1024)
    monkeypatch.setattr(work, "SMALL_PIECE", 1024)
    monkeypatch.setattr(answers, "KEPT_BYTES", 0)


@pytest.fixture
def example(tmp_path: Path) -> Iterator[SessionHub]:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    hub = SessionHub(RuntimeOptions(root=tmp_path))
    yield hub
    hub.close_all()


async def test_a_large_context_streams_with_a_bounded_memory_and_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work, "PIECE_BYTES", 256 * 1024)
    monkeypatch.setattr(answers, "KEPT_BYTES", 1024 * 1024)
    write_session(tmp_path / "big.jsonl", 40_000)
    hub = SessionHub(RuntimeOptions(root=tmp_path))
    session = hub.open("big.jsonl").runtime.session
    request = call(1, "session.context", session_id=session.session_id)
    whole = line(success(1, context_report(session, session.leaf_id)))
    size, digest = len(whole), hashlib.sha256(whole).hexdigest()
    del whole
    assert size > 20_000_000  # tens of MB
    server = RpcServer(hub)
    for _ in range(2):  # too large to be kept: the second request encodes it again
        client = Client(line(request), keep=False)
        client.done_sending()
        tracemalloc.start()
        try:
            await server.serve_connection(client)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (client.size, client.digest.hexdigest()) == (size, digest)
        # What the answer held at once: the part kept while it might be small, the pieces in
        # hand (one written, AHEAD made ahead, one being made, each copied once or twice while
        # it is made) and the report's lists of references (8 bytes an entry). The whole
        # encoding held the answer: over twenty times this.
        assert peak < answers.KEPT_BYTES + 8 * work.PIECE_BYTES + 3 * 8 * 40_000
        assert answers.CONTEXT not in hub.host.slot(session.session_id).answers.answers
    hub.close_all()


async def test_a_client_that_leaves_mid_answer_stops_its_encoding(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    session = example.open("example.jsonl").runtime.session
    client = Client(line(call(1, "session.tree", session_id=session.session_id)))
    client.fail_at = 4  # the head and two pieces are taken, then the client is gone
    await RpcServer(example).serve_connection(client)  # returns: the connection ended
    assert client.closed.is_set()
    assert counted.closed == 1  # the encoding was stopped, not left waiting in a thread
    assert counted.made <= 3 + AHEAD + 1  # written, failed, made ahead and being made
    whole = len(line(success(1, tree_answer(session))))
    assert client.size < whole
    assert example.fair.running == 0


async def test_an_encoding_that_fails_midway_closes_the_connection_and_says_why(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch, fail_after=3)
    session_id = example.open("example.jsonl").runtime.session.session_id
    logged: list[str] = []
    server = RpcServer(example, log=logged.append)
    client = Client(
        line(call(7, "session.context", session_id=session_id)), line(call(8, "session.list"))
    )
    await server.serve_connection(client)
    assert client.closed.is_set()
    assert client.out.startswith(b'{"jsonrpc":"2.0","id":7,"result":{')
    assert b"\n" not in client.out  # the line could not be ended; nothing came after it
    assert counted.made == 3
    assert counted.closed == 1
    assert len(logged) == 1
    assert logged[0].startswith("the answer to request 7 failed after ")
    assert "(RuntimeError: injected failure while encoding); closing the connection" in logged[0]
    # The server goes on: another connection is answered.
    other = Client(line(call(1, "session.list")))
    other.done_sending()
    await server.serve_connection(other)
    assert b'"sessions":[{' in other.out


async def test_an_encoding_that_fails_before_its_first_piece_is_answered_with_an_error(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing of the answer is out yet: an error answer takes its place, and the connection
    # goes on with the next request.
    counted = Counted(monkeypatch, fail_after=0)
    session_id = example.open("example.jsonl").runtime.session.session_id
    logged: list[str] = []
    server = RpcServer(example, log=logged.append)
    client = Client(
        line(call(7, "session.context", session_id=session_id)), line(call(8, "session.list"))
    )
    client.done_sending()
    await server.serve_connection(client)
    first, second, rest = bytes(client.out).split(b"\n", 2)
    assert rest == b""
    assert json.loads(first) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": INTERNAL_ERROR,
            "message": "Internal error: result not encodable: "
            "RuntimeError: injected failure while encoding",
        },
    }
    assert json.loads(second)["id"] == 8
    assert json.loads(second)["result"]["sessions"][0]["session_id"] == session_id
    assert counted.made == 0
    assert counted.closed == 1
    assert logged == [
        "the answer to request 7 failed before any of it was sent (RuntimeError: injected "
        f"failure while encoding); answered {INTERNAL_ERROR}"
    ]


async def test_a_failed_stream_in_a_batch_is_an_error_in_its_place(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    Counted(monkeypatch, fail_after=0)
    session_id = example.open("example.jsonl").runtime.session.session_id
    batch = [call(1, "session.context", session_id=session_id), call(2, "session.list")]
    client = Client(line(batch))
    client.done_sending()
    await RpcServer(example, log=lambda text: None).serve_connection(client)
    assert bytes(client.out).endswith(b"]\n")
    answers = json.loads(client.out)
    assert [answer["id"] for answer in answers] == [1, 2]
    assert answers[0]["error"]["code"] == INTERNAL_ERROR
    assert "result" in answers[1]


async def test_a_batch_of_heavy_requests_streams_each_answer_in_its_place(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    session = example.open("example.jsonl").runtime.session
    sid = session.session_id
    batch = [
        call(1, "session.context", session_id=sid),
        call(2, "session.tree", session_id=sid),
        call(3, "session.list"),
        call(4, "session.context", session_id=sid),
    ]
    client = Client(line(batch))
    client.done_sending()
    await RpcServer(example).serve_connection(client)
    listed = await Dispatcher(example.methods()).handle(batch[2])
    context = context_report(session, session.leaf_id)
    expected = [
        success(1, context),
        success(2, tree_answer(session)),
        listed,
        success(4, context),
    ]
    assert bytes(client.out) == line(expected)
    assert counted.closed == 3  # each heavy answer streamed (nothing kept at this bound)
    assert counted.made > 3 * 3  # in several pieces each


async def test_a_caller_in_process_gets_the_json_value(
    example: SessionHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = example.open("example.jsonl").runtime.session
    dispatcher = Dispatcher(example.methods())
    context = call(1, "session.context", session_id=session.session_id)
    tree = call(2, "session.tree", session_id=session.session_id)
    expected = [context_report(session, session.leaf_id), tree_answer(session)]
    cache = example.host.slot(session.session_id).answers
    for kept in (0, answers.KEPT_BYTES):  # streamed, then kept (and read from the cache)
        monkeypatch.setattr(answers, "KEPT_BYTES", kept)
        cache.too_large.clear()  # what was too large for the bound before
        for _ in range(2):
            results = [(await dispatcher.handle(r))["result"] for r in (context, tree)]
            assert results == expected
        assert set(cache.answers) == ({answers.CONTEXT, answers.TREE} if kept else set())


async def test_stopping_the_server_mid_answer_finishes_it_for_a_client_that_reads(
    example: SessionHub, small_pieces: None
) -> None:
    session = example.open("example.jsonl").runtime.session
    server = RpcServer(example)
    client = Client(line(call(1, "session.context", session_id=session.session_id)))
    client.hold_at = 3  # the head and a piece, then the client waits
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, client)
        await client.holding.wait()
        group.start_soon(server.stop)
        await anyio.wait_all_tasks_blocked()
        client.release.set()  # it reads again, within the drop timeout
    assert server.connections == 0  # the connection ended after the answer
    assert bytes(client.out) == line(success(1, context_report(session, session.leaf_id)))


async def test_stopping_the_server_cuts_the_answer_of_a_client_that_does_not_read(
    example: SessionHub, small_pieces: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    session = example.open("example.jsonl").runtime.session
    server = RpcServer(example, limits=Limits(drop_timeout=0.01))
    client = Client(line(call(1, "session.context", session_id=session.session_id)))
    client.hold_at = 3
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve_connection, client)
        await client.holding.wait()
        await server.stop()  # returns once the connection is closed: the write was cut
    assert client.closed.is_set()
    assert b"\n" not in client.out
    assert counted.closed == 1
    assert example.fair.running == 0


def test_pieces_stay_near_their_size_whatever_the_items() -> None:
    big = ["x" * 100_000] * 60
    small = list(range(5000))
    value = {"big": big, "small": small, "empty": [], "n": 1}
    pieces = list(work.pieces_of(value))
    assert b"".join(pieces) == encode(value).encode()
    assert max(map(len, pieces)) <= work.PIECE_BYTES + 100_010  # one item may pass it
    assert len(pieces) > 6  # 6 MB of items: cut


def test_pieces_are_the_standard_encoders_bytes_whatever_the_values() -> None:
    # msgspec encodes them, with Python's floats put back; what it refuses (a lone surrogate,
    # an integer over 64 bits, a type it does not know) takes the standard library's path.
    value = {
        "floats": [1e16, 1e-05, 0.1, -2.5e-7, 3.0] * 40,
        "text": ['é😀 "q" \\ \n\t\u2028', "a\udc80b", "1e16"],
        "big": [10**30, -(2**63)],
        "other": Path("/x"),
        "nested": [{"k": [1.5e300, None, True]}],
    }
    assert b"".join(work.pieces_of(value)) == encode(value).encode()


def test_a_streamed_result_is_not_joined_into_a_line_outside_a_connection() -> None:
    async def step(pull: work.Pull) -> bytes | None:
        return pull()

    streamed = work.Streamed(work.pieces_of({"a": [1]}), step)
    with pytest.raises(TypeError, match="written by a connection"):
        Dispatcher.encode(success(1, streamed))
    streamed.close()


def test_tree_answers_waiting_together_share_their_copy_of_the_session(
    example: SessionHub,
) -> None:
    runtime = example.open("example.jsonl").runtime
    cache = example.host.slot(runtime.session.session_id).answers
    first = cache.tree_snapshot(cache.version())
    assert cache.tree_snapshot(cache.version()) is first  # a batch's second tree request
    assert first.path == runtime.session.path()
    runtime.session.append_message({"role": "user", "content": "more", "timestamp": 1})
    later = cache.tree_snapshot(cache.version())
    assert later is not first  # the session changed: a copy of it as it is now
    assert len(later.entries) == len(first.entries) + 1
    size = len(later.entries)
    del first, later  # the answers were written: the copies are freed
    assert len(cache.tree_snapshot(cache.version()).entries) == size
    assert cache.tree_snapshot(None).path is None  # no context kept: the thread walks
