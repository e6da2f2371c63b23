import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from orchestrator.testing._provider import MAX_DELAY, LocalProvider, Reply


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as running:
        yield running


def post(url: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, lower_case(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, lower_case(error.headers), error.read()


def lower_case(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def test_answers_in_order_and_records_requests(provider: LocalProvider) -> None:
    provider.push(Reply.summary("one", cached_tokens=2), Reply.remote("two", shortSummary="s"))
    status, _, raw = post(provider.url + "/v1/chat/completions", b'{"model": "m"}')
    assert status == 200
    body = json.loads(raw)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "one"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    status, _, raw = post(provider.url + "/summary", b"not json")
    assert (status, json.loads(raw)) == (200, {"summary": "two", "shortSummary": "s"})
    first, second = provider.requests
    assert (first.path, first.body, first.raw) == (
        "/v1/chat/completions",
        {"model": "m"},
        b'{"model": "m"}',
    )
    assert (second.path, second.body, second.raw) == ("/summary", None, b"not json")
    assert first.headers["content-type"] == "application/json"


def test_empty_queue_answers_a_fatal_400(provider: LocalProvider) -> None:
    status, _, raw = post(provider.url + "/v1/chat/completions", b"{}")
    assert status == 400
    assert json.loads(raw)["error"]["message"] == "LocalProvider has no scripted reply left"


def test_error_replies(provider: LocalProvider) -> None:
    provider.push(
        Reply.rate_limited(retry_after=2.5),
        Reply.rate_limited(),
        Reply.error(503, "busy", retry_after_ms="700"),
        Reply.overflow_openai(),
        Reply.overflow_anthropic(),
        Reply.overflow_llamacpp(),
        Reply.malformed(),
    )
    url = provider.url + "/v1/chat/completions"
    status, headers, _ = post(url, b"{}")
    assert (status, headers["retry-after"]) == (429, "2.5")
    status, headers, _ = post(url, b"{}")
    assert status == 429
    assert "retry-after" not in headers
    status, headers, _ = post(url, b"{}")
    assert (status, headers["retry-after-ms"]) == (503, "700")
    status, _, raw = post(url, b"{}")
    error = json.loads(raw)["error"]
    assert (status, error["code"]) == (400, "context_length_exceeded")
    assert error["message"].startswith("This model's maximum context length is 8192 tokens.")
    assert "prompt is too long: 210000 tokens > 200000 maximum" in post(url, b"{}")[2].decode()
    assert b"exceeds the available context size" in post(url, b"{}")[2]
    status, _, raw = post(url, b"{}")
    assert (status, raw) == (200, b"{this is not json")


def test_url_needs_a_running_server() -> None:
    provider = LocalProvider()
    with pytest.raises(RuntimeError, match="not running"):
        _ = provider.url
    provider.release()  # releasing before the start is remembered
    provider.stop()  # stopping a provider that never started is harmless
    provider.push(Reply.hang(then=Reply.remote("at once")))
    with provider:
        status, _, raw = post(provider.url + "/summary", b"{}")
    assert (status, json.loads(raw)) == (200, {"summary": "at once"})


def test_delay_is_clamped() -> None:
    assert Reply.summary("x", delay=10_000).delay == MAX_DELAY
    assert Reply.summary("x", delay=-1).delay == 0.0


@pytest.mark.anyio
async def test_hang_holds_until_released(provider: LocalProvider) -> None:
    provider.push(Reply.hang())
    result: list[httpx.Response] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            result.append(await client.post(provider.url + "/v1/chat/completions", json={}))

        tg.start_soon(call)
        while not provider.requests:
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        assert result == []
        provider.release()
    assert result[0].json()["choices"][0]["message"]["content"] == "released"


@pytest.mark.anyio
async def test_delay_ends_early_when_the_provider_stops() -> None:
    provider = LocalProvider((Reply.summary("slow", delay=MAX_DELAY),)).start()
    result: list[httpx.Response] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            result.append(await client.post(provider.url + "/v1/chat/completions", json={}))

        tg.start_soon(call)
        while not provider.requests:
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
        assert result == []
        provider.stop()
    assert result[0].json()["choices"][0]["message"]["content"] == "slow"


def raw_exchange(provider: LocalProvider, data: bytes, *, cut: bool = False) -> bytes:
    """Send ``data`` on a fresh connection and read the answer until the server closes it.

    The last request asks ``connection: close`` (or the server would wait for another). With
    ``cut``, the client closes its side once ``data`` is sent: a request cut short.
    """
    import socket

    port = int(provider.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if cut:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


CLOSING = b"POST /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"


def test_a_chunked_body_is_read_and_recorded(provider: LocalProvider) -> None:
    provider.push(Reply.remote("chunked"))
    answer = raw_exchange(
        provider,
        b"POST /summary HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n"
        b'5\r\n{"a":\r\n2;ext=1\r\n1}\r\n0\r\nTrailer: t\r\n\r\n',
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(body) == {"summary": "chunked"}
    assert provider.requests[0].raw == b'{"a":1}'
    assert provider.requests[0].body == {"a": 1}


def exchanges(provider: LocalProvider, *requests: bytes) -> list[tuple[int, str] | None]:
    """Send ``requests`` one after the other on one connection, each once the last is answered.

    Each answer is its status and its ``connection`` header (lower case, ``""`` without one);
    ``None`` once the server has closed the connection, and nothing after that.
    """
    import http.client
    import socket

    port = int(provider.url.rsplit(":", 1)[1])
    answers: list[tuple[int, str] | None] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for request in requests:
            try:
                sock.sendall(request)
                response = http.client.HTTPResponse(sock)
                response.begin()
            except (http.client.RemoteDisconnected, ConnectionError):
                answers.append(None)
                break
            response.read()
            answers.append((response.status, (response.getheader("connection") or "").lower()))
    return answers


def test_a_connection_serves_request_after_request_until_the_client_closes_it(
    provider: LocalProvider,
) -> None:
    """Issue 9: as real providers do; a client that reuses connections connects once."""
    provider.push(Reply.remote("one"), Reply.remote("two"), Reply.remote("three"))
    request = b"POST /summary HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    answers = exchanges(provider, request, request, CLOSING, request)
    # The request after "connection: close" is not read: the connection is closed.
    assert answers == [(200, ""), (200, ""), (200, "close"), None]
    assert [r.body for r in provider.requests] == [{}, {}, {}]


@pytest.mark.parametrize(
    ("version", "connection", "kept", "said"),
    [
        (b"HTTP/1.1", b"", True, ""),  # kept by default, nothing to say
        (b"HTTP/1.1", b"Connection: Keep-Alive, Close\r\n", False, "close"),
        (b"HTTP/1.0", b"", False, ""),  # closed by default
        (b"HTTP/1.0", b"Connection: keep-alive\r\n", True, "keep-alive"),
    ],
)
def test_keep_alive_follows_the_request(
    provider: LocalProvider, version: bytes, connection: bytes, kept: bool, said: str
) -> None:
    provider.push(Reply.remote("one"), Reply.remote("two"))
    request = b"POST /s " + version + b"\r\nHost: x\r\n" + connection
    answers = exchanges(provider, request + b"Content-Length: 2\r\n\r\n{}", CLOSING)
    assert len(answers) == 2
    first, second = answers
    assert first is not None
    assert first == (200, said)
    assert (second is not None) is kept


def test_an_idle_connection_is_closed_when_the_provider_stops() -> None:
    import socket

    with LocalProvider((Reply.remote("one"),)) as provider:
        port = int(provider.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK")
    with sock:
        assert sock.recv(65536) == b""  # closed by the provider, not by the client


def test_only_post_is_answered(provider: LocalProvider) -> None:
    provider.push(Reply.remote("unused"))
    answer = raw_exchange(
        provider, b"GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 501 Not Implemented")
    assert provider.requests == ()


def test_a_broken_request_only_drops_its_connection(provider: LocalProvider) -> None:
    assert raw_exchange(provider, b"POST /summary HTTP/1.1\r\n", cut=True) == b""  # mid-head
    garbage = raw_exchange(provider, b"garbage\r\n\r\n")  # no method, path and version
    assert garbage.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    no_host = raw_exchange(provider, b"POST /s HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert no_host.startswith(b"HTTP/1.0 400 Bad Request\r\n")  # HTTP/1.1 requires one
    assert [r.path for r in provider.requests] == []  # none of them reached the script
    provider.push(Reply(status=299, body={"summary": "odd"}))
    answer = raw_exchange(provider, b"POST /s HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
    assert answer.startswith(b"HTTP/1.0 299 \r\n")  # a status without a standard phrase
    assert [request.path for request in provider.requests] == ["/s"]


def test_a_thousand_requests_wait_at_once_without_a_thread_each() -> None:
    """Issue 9: the benchmark holds a couple of thousand requests; one event loop serves them."""
    import threading

    count = 300
    with LocalProvider(
        tuple(Reply(body={"summary": "ok"}, delay=0.2) for _ in range(count))
    ) as provider:
        before = threading.active_count()

        async def main() -> list[int]:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
                statuses: list[int] = []

                async def call() -> None:
                    response = await client.post(provider.url + "/summary", json={})
                    statuses.append(response.status_code)

                async with anyio.create_task_group() as tg:
                    for _ in range(count):
                        tg.start_soon(call)
                    while len(provider.requests) < count:
                        await anyio.sleep(0.01)
                    # At most as many: an idle worker thread an earlier test left may exit
                    # meanwhile (anyio's idle out), never one more per request.
                    assert threading.active_count() <= before
                return statuses

        assert anyio.run(main) == [200] * count


@pytest.mark.anyio
async def test_release_answers_held_requests_and_stop_the_delayed_ones() -> None:
    provider = LocalProvider(
        (Reply.hang(then=Reply.remote("held")), Reply(body={"summary": "slow"}, delay=MAX_DELAY))
    ).start()
    provider.push(Reply(body={"summary": "quick"}, delay=0.01))
    texts: list[str] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            response = await client.post(provider.url + "/summary", json={})
            texts.append(response.json()["summary"])

        for _ in range(2):
            tg.start_soon(call)
        while len(provider.requests) < 2:
            await anyio.sleep(0.01)
        provider.release()
        while not texts:
            await anyio.sleep(0.01)
        assert texts == ["held"]  # the delayed one still waits
        await call()  # a short delay ends on its own
        assert texts == ["held", "quick"]
        provider.stop()
    assert texts == ["held", "quick", "slow"]


def events_of(raw: bytes) -> list[Any]:
    """The server-sent events of a streamed answer: each ``data:`` line, JSON but the last."""
    lines = [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line.strip()]
    assert lines[-1] == b"[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_streamed_reply_sends_a_token_per_event_then_its_finish_and_usage(
    provider: LocalProvider,
) -> None:
    provider.push(Reply.stream("one two  three", finish_reason="length", prompt_tokens=4))
    status, headers, raw = post(provider.url + "/v1/chat/completions", b'{"stream": true}')
    assert (status, headers["content-type"]) == (200, "text/event-stream")
    events = events_of(raw)
    deltas = [event["choices"][0]["delta"] for event in events[:-1]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "one "},
        {"content": "two  "},
        {"content": "three"},
        {},
    ]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert Reply.stream("x", chunk_delay=10_000).chunk_delay == MAX_DELAY


def test_a_completion_asked_to_stream_is_streamed_and_otherwise_sent_whole(
    provider: LocalProvider,
) -> None:
    provider.push(Reply.summary("whole", cached_tokens=2), Reply.summary("whole"))
    status, _, raw = post(provider.url + "/v1/chat/completions", b'{"stream": true}')
    events = events_of(raw)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "whole"}
    assert events[1]["choices"][0]["finish_reason"] == "stop"
    assert events[2]["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    status, _, raw = post(provider.url + "/v1/chat/completions", b'{"stream": false}')
    assert json.loads(raw)["choices"][0]["message"]["content"] == "whole"
    # An error is an error, streamed or not, as providers answer before a stream starts.
    provider.push(Reply.rate_limited())
    status, _, raw = post(provider.url + "/v1/chat/completions", b'{"stream": true}')
    assert (status, json.loads(raw)["error"]["message"]) == (429, "Rate limit reached")


@pytest.mark.anyio
async def test_a_stream_stalls_after_its_chunks_until_released(provider: LocalProvider) -> None:
    provider.push(Reply.stream("a b c", stall_after=2))
    received: list[bytes] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            url = provider.url + "/v1/chat/completions"
            async with client.stream("POST", url, json={"stream": True}) as response:
                async for piece in response.aiter_bytes():
                    received.append(piece)

        tg.start_soon(call)
        while b"".join(received).count(b"data: ") < 2:
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        assert b"".join(received).count(b"data: ") == 2  # the role and "a ", then nothing
        provider.release()
    assert [e["choices"][0]["delta"] for e in events_of(b"".join(received))[1:4]] == [
        {"content": "a "},
        {"content": "b "},
        {"content": "c"},
    ]


def test_only_a_chat_completion_is_streamed_and_its_tool_calls_are_indexed(
    provider: LocalProvider,
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    with_calls = json.loads(json.dumps(Reply.summary("").body))
    with_calls["choices"][0]["message"]["tool_calls"] = [call]
    provider.push(Reply(body=with_calls), Reply.remote("whole"))
    _, _, raw = post(provider.url + "/v1/chat/completions", b'{"stream": true}')
    [first, *_] = events_of(raw)
    assert first["choices"][0]["delta"]["tool_calls"] == [{**call, "index": 0}]
    assert "index" not in with_calls["choices"][0]["message"]["tool_calls"][0]  # not changed
    _, _, raw = post(provider.url + "/summary", b'{"stream": true}')
    assert json.loads(raw) == {"summary": "whole"}


def test_a_client_gone_mid_stream_leaves_the_provider_serving(provider: LocalProvider) -> None:
    """A stalled stream whose client hung up ends quietly when released; others are answered."""
    import socket
    import struct

    provider.push(Reply.stream("a b c", stall_after=1), Reply.remote("next"), Reply.remote("last"))
    port = int(provider.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = b'{"stream": true}'
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    received = b""
    while b"data: " not in received:  # the role's event, then the stall
        received += sock.recv(65536)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, at once
    # Answered after the reset on the provider's one event loop: the reset is seen by now.
    assert exchanges(provider, CLOSING) == [(200, "close")]
    provider.release()  # the stalled stream writes to a connection that is gone
    assert exchanges(provider, CLOSING) == [(200, "close")]
    assert [request.path for request in provider.requests][1:] == ["/summary", "/summary"]


def test_a_body_past_a_mebibyte_is_read_whole(provider: LocalProvider) -> None:
    """aiohttp refuses such a body by default (413); a long session's prompt is larger."""
    provider.push(Reply.remote("big"))
    prompt = "x" * (3 * 1024 * 1024)
    status, _, raw = post(provider.url + "/summary", json.dumps({"prompt": prompt}).encode())
    assert (status, json.loads(raw)) == (200, {"summary": "big"})
    assert provider.requests[0].body == {"prompt": prompt}
