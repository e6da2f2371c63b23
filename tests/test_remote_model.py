import gc
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator._core.errors import FatalModelError, ModelError, TransientModelError
from orchestrator._core.model import ModelRequest
from orchestrator._models.remote import MISSING_SUMMARY, RemoteSummaryModel
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import EXAMPLE
from tests.runtime_kit import UVLOOP

pytestmark = pytest.mark.anyio


# uvloop too: an embedder may run the runtime on it, and the route's asyncio client uses the
# loop's own connections and transports (uvloop's take fewer keywords and are other classes).
@pytest.fixture(params=["asyncio", UVLOOP, "trio"], ids=["asyncio", "uvloop", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as running:
        yield running


REQUEST = ModelRequest(
    purpose="history",
    system="You summarise.",
    messages=({"role": "user", "content": "<conversation>...</conversation>"},),
    max_tokens=100,
)


def remote(provider: LocalProvider) -> RemoteSummaryModel:
    return RemoteSummaryModel(provider.url + "/summary", timeout=30)


async def test_posts_system_prompt_and_prompt(provider: LocalProvider) -> None:
    provider.push(Reply.remote("the summary", shortSummary="ignored"))
    async with remote(provider) as model:
        response = await model.complete(REQUEST)
    assert (response.text, response.stop_reason, response.provider) == (
        "the summary",
        "stop",
        "remote",
    )
    (sent,) = provider.requests
    assert sent.path == "/summary"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "systemPrompt": "You summarise.",
        "prompt": "<conversation>...</conversation>",
    }
    assert model.name == f"remote/{provider.url}/summary"
    assert model.context_window == 0
    assert RemoteSummaryModel("http://x", context_window=9).context_window == 9


@pytest.mark.parametrize(
    ("reply", "message", "failure", "retry_after"),
    [
        (Reply.rate_limited(retry_after=3), "(429 Too Many Requests)", TransientModelError, 3.0),
        (Reply.error(500, "x"), "(500 Internal Server Error)", TransientModelError, None),
        (Reply.error(503, "x"), "(503 Service Unavailable)", TransientModelError, None),
        (Reply.error(400, "x"), "(400 Bad Request)", FatalModelError, None),
        (Reply.error(404, "x"), "(404 Not Found)", FatalModelError, None),
    ],
)
async def test_non_2xx(
    provider: LocalProvider,
    reply: Reply,
    message: str,
    failure: type[ModelError],
    retry_after: float | None,
) -> None:
    provider.push(reply)
    with pytest.raises(ModelError) as caught:
        async with remote(provider) as model:
            await model.complete(REQUEST)
    assert str(caught.value) == f"Remote compaction failed {message}"
    assert type(caught.value) is failure
    assert (caught.value.kind, caught.value.retry_after) == (failure.kind, retry_after)
    assert caught.value.status == reply.status
    assert len(provider.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply.malformed(),
        Reply(body={"shortSummary": "only"}),
        Reply.remote(summary=42),
        Reply.remote(summary=None),
        Reply(body=["summary"]),
    ],
)
async def test_missing_summary(provider: LocalProvider, reply: Reply) -> None:
    provider.push(reply)
    with pytest.raises(FatalModelError, match=f"^{MISSING_SUMMARY}$") as caught:
        async with remote(provider) as model:
            await model.complete(REQUEST)
    assert caught.value.kind == "fatal"


READ = [
    b'{"summary": "plain"}',
    b'{"summary": "first", "summary": "last"}',
    b'{"summary": "x", "n": 123456789012345678901234567890, "z": -0, "u": "\\u0000"}',
    # Read by the standard library, refused by msgspec: read as before.
    b'{"summary": "x", "n": NaN}',
    b'{"summary": "x", "n": 1e400}',
    b'\xef\xbb\xbf{"summary": "after a byte-order mark"}',
    '{"summary": "in UTF-16"}'.encode("utf-16"),
    b'{"summary": "\\ud800 lone"}',
    b'{"summary": "\xed\xa0\x80 encoded surrogate"}',
]
REFUSED = [
    b'{"summary": "a\nraw newline"}',
    b'{"summary": "\xff"}',
    b'{"summary": "x"} trailing',
    b'{"summary": "x",}',
    b"\x0c{}",
]


@pytest.mark.parametrize("body", READ)
def test_an_answer_reads_as_the_standard_library_reads_it(body: bytes) -> None:
    from orchestrator._models.remote import _read_json

    assert repr(_read_json(body)) == repr(json.loads(body))  # repr: NaN is not equal to itself


@pytest.mark.parametrize("body", REFUSED)
def test_an_answer_the_standard_library_refuses_is_refused(body: bytes) -> None:
    from orchestrator._models.remote import _read_json

    with pytest.raises(ValueError, match="."):  # "missing summary" follows
        _read_json(body)
    with pytest.raises(ValueError, match="."):
        json.loads(body)


async def test_an_answer_msgspec_refuses_is_read_as_before(provider: LocalProvider) -> None:
    provider.push(Reply(body=b'{"summary": "not a number", "score": NaN}'))
    async with remote(provider) as model:
        assert (await model.complete(REQUEST)).text == "not a number"


async def test_refused_connection_is_transient() -> None:
    with LocalProvider() as stopped:
        model = remote(stopped)
    with pytest.raises(TransientModelError) as caught:
        await model.complete(REQUEST)
    assert caught.value.kind == "transient"
    assert caught.value.__cause__ is not None


async def test_hang_is_cancelled_by_the_callers_scope(provider: LocalProvider) -> None:
    provider.push(Reply.hang(then=Reply.remote("late")))
    finished = False
    with anyio.move_on_after(30) as safety, anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                nonlocal finished
                await remote(provider).complete(REQUEST)
                finished = True

            tg.start_soon(call)
            while not provider.requests:
                await anyio.wait_all_tasks_blocked()
                await anyio.lowlevel.checkpoint()
            # Same effect as scope.cancel(), which anyio 4.16's trio backend cannot call on
            # the installed trio 0.22.
            scope.deadline = -math.inf
    assert scope.cancelled_caught
    assert not safety.cancelled_caught
    assert not finished
    provider.release()


async def test_one_client_serves_every_call_of_a_route_until_closed(
    provider: LocalProvider,
) -> None:
    provider.push(Reply.remote("one"))
    provider.push(Reply.remote("two"))
    async with remote(provider) as model:
        assert (await model.complete(REQUEST)).text == "one"
        client = model._client
        assert client is not None
        assert (await model.complete(REQUEST)).text == "two"
        assert model._client is client
    assert client.is_closed
    assert model._client is None
    # Closed is not finished: the next call opens a new client.
    provider.push(Reply.remote("three"))
    assert (await model.complete(REQUEST)).text == "three"
    await model.aclose()
    await model.aclose()  # twice is fine


async def test_one_route_has_no_cap_on_calls_in_flight(provider: LocalProvider) -> None:
    """Issue 9: past httpx's default pool of 100, calls waited for a free connection."""
    count = 120
    provider.push(*(Reply.hang(then=Reply.remote("ok")) for _ in range(count)))
    texts: list[str] = []
    async with remote(provider) as model:

        async def call() -> None:
            texts.append((await model.complete(REQUEST)).text)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(call)
                while len(provider.requests) < count:  # every call is at the server at once
                    await anyio.sleep(0.01)
                provider.release()
    assert texts == ["ok"] * count


def test_a_second_event_loop_gets_a_client_of_its_own(provider: LocalProvider) -> None:
    model = remote(provider)
    clients = []

    async def call() -> None:
        provider.push(Reply.remote("ok"))
        assert (await model.complete(REQUEST)).text == "ok"
        clients.append(model._client)
        await model.aclose()

    anyio.run(call)
    anyio.run(call)
    assert len({id(c) for c in clients}) == 2
    assert all(c is not None and c.is_closed for c in clients)


@pytest.mark.parametrize("anyio_backend", ["trio"])  # httpx serves the route there
async def test_calls_in_flight_spread_over_the_pools_and_one_at_a_time_use_the_first(
    provider: LocalProvider,
) -> None:
    """Issue 9: one pool's bookkeeping walks all its connections at every request and answer."""
    from orchestrator._models.remote import POOLS

    async with remote(provider) as model:

        async def call() -> None:
            assert (await model.complete(REQUEST)).text == "ok"

        async def wait_for(requests: int) -> Any:
            while len(provider.requests) < requests:
                await anyio.sleep(0.01)
            return model._client.client._transport  # type: ignore[union-attr]

        count = 3 * POOLS
        provider.push(*(Reply.hang(then=Reply.remote("ok")) for _ in range(count)))
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(call)
                pools = await wait_for(count)
                assert pools.busy == [3] * POOLS
                provider.release()
            assert pools.busy == [0] * POOLS
            provider._released = False
            for done in range(count, count + 3):  # one at a time: always the first pool
                provider.push(Reply.hang(then=Reply.remote("ok")))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    assert (await wait_for(done + 1)).busy == [1] + [0] * (POOLS - 1)
                    provider.release()
                provider._released = False
        client = model._client
    assert client is not None
    assert client.is_closed
    assert all(pool._pool.connections == [] for pool in pools.pools)


async def test_on_asyncio_the_http1_client_serves_the_route_on_trio_httpx(
    provider: LocalProvider, anyio_backend: object
) -> None:
    """Issue 9: the route's own client costs a third of aiohttp's CPU per request (aiohttp a
    third of httpx's); it runs on asyncio only."""
    provider.push(Reply.remote("ok"))
    async with remote(provider) as model:
        assert (await model.complete(REQUEST)).text == "ok"
        library = type(model._client).__name__
    assert library == ("_HttpxClient" if anyio_backend == "trio" else "_Http1Route")
    (sent,) = provider.requests
    # The same bytes either way: httpx's compact JSON, non-ASCII as UTF-8.
    assert (
        sent.raw == b'{"systemPrompt":"You summarise.","prompt":"<conversation>...</conversation>"}'
    )


# asyncio warns about open transports (uvloop too)
@pytest.mark.parametrize("anyio_backend", ["asyncio", UVLOOP], ids=["asyncio", "uvloop"])
async def test_a_route_dropped_without_closing_closes_its_connections_quietly(
    provider: LocalProvider,
) -> None:
    provider.push(Reply.remote("ok"))
    model = remote(provider)
    assert (await model.complete(REQUEST)).text == "ok"
    client = model._client.client  # type: ignore[union-attr]
    assert not client.closed
    assert len(client._open) == 1  # the idle connection, kept for the next call
    del model
    gc.collect()  # a warning from a finalizer would fail the test (filterwarnings = error)
    assert client.closed
    await anyio.sleep(0.05)
    assert client._open == set()  # every connection lost its socket


async def test_a_read_timeout_is_transient(provider: LocalProvider) -> None:
    provider.push(Reply(body={"summary": "late"}, delay=5))
    model = RemoteSummaryModel(provider.url + "/summary", timeout=0.2)
    with pytest.raises(ModelError) as caught:
        await model.complete(REQUEST)
    assert caught.value.kind == "transient"
    await model.aclose()


async def test_the_route_ignores_the_proxy_variables(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading them cost aiohttp two worker-thread hops per request (issue 9); httpx over the
    route's pools never read them."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    provider.push(Reply.remote("direct"))
    async with remote(provider) as model:
        assert (await model.complete(REQUEST)).text == "direct"
    assert provider.requests[0].path == "/summary"


async def test_the_body_is_compact_utf8_json_as_the_standard_library_writes_it(
    provider: LocalProvider,
) -> None:
    """Encoded with msgspec since issue 9: the same bytes as ``json.dumps`` compact, UTF-8."""
    import json

    text = 'é\u2028\x00\x1f\x7f"\\/ 😀\n\t'
    request = ModelRequest(
        purpose="history",
        system=text,
        messages=({"role": "user", "content": text},),
        max_tokens=100,
    )
    provider.push(Reply.remote("ok"))
    async with remote(provider) as model:
        assert (await model.complete(request)).text == "ok"
        body = {"systemPrompt": request.system, "prompt": request.prompt}
        expected = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        assert provider.requests[0].raw == expected
        lone = ModelRequest(
            purpose="history",
            system="\ud800",
            messages=({"role": "user", "content": "x"},),
            max_tokens=100,
        )
        with pytest.raises(UnicodeEncodeError):  # as json.dumps(...).encode() refused it
            await model.complete(lone)
    assert len(provider.requests) == 1


class _Flood:
    """A raw HTTP server (a thread) answering every request with ``mode``'s oversized body.

    ``endless``: a chunked body that never ends; ``bomb``: 16 KiB of gzip that unpacks to
    64 MiB; ``declared``: a Content-Length of 1 GiB (the body never comes).
    """

    def __init__(self, mode: str) -> None:
        import socket
        import threading

        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/summary"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import gzip

        bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                try:
                    if self.mode == "endless":
                        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                        piece = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
                        while True:
                            conn.sendall(piece)
                    elif self.mode == "bomb":
                        head = "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                        head += f"Content-Length: {len(bomb)}\r\n\r\n"
                        conn.sendall(head.encode() + bomb)
                    else:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n{")
                        conn.recv(1)  # until the client goes
                except OSError:
                    continue

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("mode", ["endless", "bomb", "declared"])
# On trio, httpx's generators left mid-way are finalized by the collector, which trio reports.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_answer_too_large_to_be_a_summary_is_refused_not_read_whole(mode: str) -> None:
    # An endpoint streaming without end kept every read timeout happy and filled the memory.
    flood = _Flood(mode)
    try:
        async with RemoteSummaryModel(flood.url, timeout=30) as model:
            with pytest.raises(ModelError) as refused:
                await model.complete(REQUEST)
    finally:
        flood.close()
    assert refused.value.kind == "fatal", str(refused.value)
    assert str(refused.value).startswith("Remote compaction response too large (")
    assert str(refused.value).endswith("; at most 16777216 bytes are read)")


def test_an_endpoint_answering_a_summary_far_over_budget_applies_nothing(
    tmp_path: Path,
) -> None:
    # It was committed: a 3 MB summary made the compacted context 1.5 million tokens.
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    before = path.read_bytes()
    huge = Reply(body={"summary": "x" * 3_000_000})
    with LocalProvider((huge,) * 4) as provider:

        async def go() -> str:
            route = RemoteSummaryModel(provider.url + "/summary", timeout=30)
            runtime = AgentSession.open(
                path, owner="test", summarizer=SummaryRoutes(candidates=(route,))
            )
            try:
                with pytest.raises(ModelError) as caught:
                    await runtime.compact()
                return str(caught.value)
            finally:
                runtime.close()
                await route.aclose()

        message = anyio.run(go)
    assert message.startswith("Summarization failed: the summary is about 750000 tokens")
    assert path.read_bytes() == before
