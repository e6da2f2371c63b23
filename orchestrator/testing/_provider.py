"""A real, scriptable HTTP model provider on 127.0.0.1, for tests, demos and benchmarks.

Theory of operation: the adapters (litellm, the remote summary endpoint) are only honest when
they talk to a real socket, because that is where their retry, header and error-mapping
behaviour lives. :class:`LocalProvider` runs an HTTP/1.1 server on its own event loop in a
background thread, so the client side can be any event loop (litellm calls it from asyncio).
It speaks just enough of the OpenAI chat-completions protocol (``POST .../chat/completions``) and
the remote-summary protocol (``POST /summary``), and answers each request with the next
:class:`Reply` from a queue the test filled. Every request body is recorded, so a test can count
HTTP attempts.

The HTTP is aiohttp's (its low-level :class:`aiohttp.web.Server`, parser in C): reading requests
(``Content-Length`` or chunked bodies), framing answers, keep-alive as the request asks
(HTTP/1.1 by default, HTTP/1.0 only with ``keep-alive``, never after ``connection: close``),
answering a request it cannot read with a 400 and closing that connection. aiohttp is already
installed with litellm; this module only decides what each request is answered, and when.

One event loop, not a thread per request: the concurrency benchmark sends a couple of thousand
summaries at once, and a thousand threads on two cores took CPU from the process under test
(issue 9). Connections stay open between requests, as real providers keep them: a client that
reuses its connections pays for one connect per connection, not one per request. Stopping the
provider answers the requests it is delaying or holding (with ``connection: close``), then
closes every connection, idle ones included.

A reply may "hold": the request waits until :meth:`LocalProvider.release` or
:meth:`LocalProvider.stop`. That is how a test gets a call that hangs without sleeping.

Streaming, as OpenAI-compatible providers stream: a request with ``"stream": true`` is answered
with server-sent events (``data: {chunk}`` each, then ``data: [DONE]``), chunked. A
:meth:`Reply.stream` sends its text a token at a time, ``chunk_delay`` seconds apart, and may
stall (hold) after a number of chunks; a :meth:`Reply.summary` asked to stream is sent as one
content chunk, its finish reason, and its usage (the ``stream_options.include_usage`` chunk),
so a streaming client reads the same answer either way. Errors stay plain JSON answers, as
providers send them before any stream starts.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

MAX_DELAY = 30.0
"""Upper bound, in seconds, on a scripted server-side delay (a typo must not hang a suite)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """One scripted HTTP answer.

    Attributes:
        status: HTTP status code.
        body: A JSON-able value, or raw bytes sent as they are (for malformed bodies).
        headers: Extra response headers.
        delay: Seconds the server waits before answering (clamped to ``MAX_DELAY``); the wait
            ends early when the provider stops.
        hold: Wait until :meth:`LocalProvider.release` (or stop) before answering.
        events: Server-sent events (JSON-able chunks) to stream instead of ``body``.
        chunk_delay: Seconds before each event (clamped to ``MAX_DELAY``).
        stall_after: After this many events, hold (as ``hold`` does) before the rest.
    """

    status: int = 200
    body: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    hold: bool = False
    events: tuple[Any, ...] | None = None
    chunk_delay: float = 0.0
    stall_after: int | None = None

    @classmethod
    def summary(
        cls,
        text: str,
        *,
        finish_reason: str = "stop",
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        cached_tokens: int = 0,
        delay: float = 0.0,
    ) -> Reply:
        """A successful chat completion whose message content is ``text``."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        body = {
            "id": "chatcmpl-local",
            "object": "chat.completion",
            "created": 0,
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
        }
        return cls(body=body, delay=min(max(delay, 0.0), MAX_DELAY))

    @classmethod
    def stream(
        cls,
        text: str,
        *,
        chunk_delay: float = 0.0,
        finish_reason: str = "stop",
        prompt_tokens: int = 10,
        completion_tokens: int | None = None,
        stall_after: int | None = None,
    ) -> Reply:
        """A streamed chat completion: ``text`` a token (a word) per event, ``chunk_delay`` apart.

        The events are the role, one per token, the finish reason, then the usage
        (``completion_tokens`` defaults to the number of tokens). With ``stall_after``, the
        stream stops after that many events until :meth:`LocalProvider.release` (or stop).
        """
        tokens = re.findall(r"\s*\S+\s*", text) or [text]
        output = len(tokens) if completion_tokens is None else completion_tokens
        events = (
            _chunk({"role": "assistant", "content": ""}),
            *(_chunk({"content": token}) for token in tokens),
            _chunk({}, finish_reason),
            _usage_chunk(prompt_tokens, output),
        )
        delay = min(max(chunk_delay, 0.0), MAX_DELAY)
        return cls(events=events, chunk_delay=delay, stall_after=stall_after)

    @classmethod
    def error(cls, status: int, message: str, *, code: str | None = None, **headers: str) -> Reply:
        """An OpenAI-style error body (``{"error": {"message", "type", "code"}}``)."""
        err = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
        pairs = tuple((k.replace("_", "-"), v) for k, v in headers.items())
        return cls(status=status, body={"error": err}, headers=pairs)

    @classmethod
    def rate_limited(cls, retry_after: float | None = None) -> Reply:
        """A 429, with a ``retry-after`` header when given."""
        headers = () if retry_after is None else (("retry-after", f"{retry_after:g}"),)
        err = {"message": "Rate limit reached", "type": "rate_limit_error", "code": None}
        return cls(status=429, body={"error": err}, headers=headers)

    @classmethod
    def overflow_openai(cls) -> Reply:
        """OpenAI's wording of a context overflow (400, ``context_length_exceeded``)."""
        return cls.error(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
        )

    @classmethod
    def overflow_anthropic(cls) -> Reply:
        """Anthropic's wording of a context overflow."""
        return cls.error(400, "prompt is too long: 210000 tokens > 200000 maximum")

    @classmethod
    def overflow_llamacpp(cls) -> Reply:
        """llama.cpp's wording of a context overflow."""
        return cls.error(400, "the request exceeds the available context size, try increasing it")

    @classmethod
    def malformed(cls) -> Reply:
        """A 200 whose body is not JSON."""
        return cls(body=b"{this is not json")

    @classmethod
    def hang(cls, then: Reply | None = None) -> Reply:
        """Hold the request until released, then answer like ``then`` (a summary by default)."""
        base = then if then is not None else cls.summary("released")
        return cls(status=base.status, body=base.body, headers=base.headers, hold=True)

    @classmethod
    def remote(cls, summary: Any = "summary", **extra: Any) -> Reply:
        """A remote-summary endpoint answer: ``{"summary": ..., **extra}``."""
        return cls(body={"summary": summary, **extra})


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRequest:
    """A request the provider received.

    Attributes:
        path: The request path.
        headers: Request headers, names lower-cased.
        body: The parsed JSON body, or ``None`` when it was not JSON.
        raw: The raw body bytes.
    """

    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    raw: bytes = b""


_NO_REPLY = Reply.error(400, "LocalProvider has no scripted reply left")


class LocalProvider:
    """An HTTP server answering from a queue of :class:`Reply` specs.

    Use as a context manager (or call :meth:`start` / :meth:`stop`)::

        with LocalProvider() as provider:
            provider.push(Reply.summary("ok"))
            model = LiteLLMModel("openai/test-model", api_base=provider.url + "/v1", api_key="k")
    """

    def __init__(self, replies: tuple[Reply, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque(replies)
        self._requests: list[RecordedRequest] = []
        self._released = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (only while running)."""
        if self._server is None:
            raise RuntimeError("LocalProvider is not running")
        return f"http://127.0.0.1:{self._port}"

    @property
    def requests(self) -> tuple[RecordedRequest, ...]:
        """Every request received so far, in arrival order."""
        with self._lock:
            return tuple(self._requests)

    def push(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        with self._lock:
            self._queue.extend(replies)

    def release(self) -> None:
        """Let every held request (and any later one) answer."""
        self._released = True
        loop, server = self._loop, self._server
        if loop is not None and server is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(server.wake, True)
            except RuntimeError:  # pragma: no cover - the loop closed meanwhile
                pass

    def start(self) -> LocalProvider:
        """Bind a random port on 127.0.0.1 and serve on an event loop in a daemon thread."""
        self._stopping = False
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        server = _Server(self)
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._port = loop.run_until_complete(server.open())
            except BaseException as error:  # pragma: no cover - binding 127.0.0.1:0 failed
                failure.append(error)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(server.close())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="LocalProvider", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:  # pragma: no cover - see above
            raise failure[0]
        self._server = server
        return self

    def stop(self) -> None:
        """Answer delayed and held requests, stop serving and close every connection."""
        self._stopping = True
        self._released = True
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        self._server = None
        self._loop = None
        self._thread = None

    def __enter__(self) -> LocalProvider:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _record_and_pop(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self._requests.append(request)
            return self._queue.popleft() if self._queue else _NO_REPLY


_REQUEST_QUEUE = 1024
"""Listen backlog: many clients connect at once (the concurrency benchmark, the pool test); a
backlog of 5 would drop their connection attempts and delay them by seconds."""

_SHUTDOWN_WAIT = 5.0
"""Seconds stopping waits for the requests being answered (woken, they answer at once)."""


class _Server:
    """The provider's side of the event loop: aiohttp's server, the answers and their waits."""

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider
        self.runner: web.ServerRunner | None = None
        self.waits: dict[asyncio.Future[None], bool] = {}  # future -> held (not a delay)

    async def open(self) -> int:
        # Imported here: ``import orchestrator.testing`` should not cost aiohttp.web's import
        # (a quarter of a second) to a test that never starts a provider.
        from aiohttp import web

        # No access log: the benchmark's thousands of requests would each write a line.
        handler = web.Server(self.answer, access_log=None)
        self.runner = web.ServerRunner(handler, shutdown_timeout=_SHUTDOWN_WAIT)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=_REQUEST_QUEUE)
        await site.start()
        port: int = self.runner.addresses[0][1]
        return port

    async def close(self) -> None:
        # Stopping answers what waits (as the delay or hold ends early); aiohttp then waits for
        # those answers and closes every connection, idle ones included.
        self.provider._stopping = True
        self.wake(False)
        assert self.runner is not None, "closed before it opened"
        await self.runner.cleanup()

    def wake(self, held_only: bool) -> None:
        for future, held in list(self.waits.items()):
            if (held or not held_only) and not future.done():
                future.set_result(None)

    async def wait(self, delay: float, *, hold: bool) -> None:
        """Wait ``delay`` seconds, or until released when ``hold``; stopping ends either."""
        provider = self.provider
        if provider._stopping or (hold and provider._released):
            return
        if not hold and delay <= 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.waits[future] = hold
        timer = None
        if not hold:
            timer = loop.call_later(min(delay, MAX_DELAY), _settle, future)
        try:
            await future
        finally:
            del self.waits[future]
            if timer is not None:
                timer.cancel()

    async def answer(self, request: web.BaseRequest) -> web.StreamResponse:
        """Record ``request``, wait as its reply says, and answer it."""
        if request.method != "POST":
            return self.response(_NOT_POST)
        # The body's stream, not request.read(): that one refuses bodies past 1 MiB (aiohttp's
        # client_max_size), and a prompt carrying a long session is larger.
        raw = await request.content.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in request.headers.items()}
        reply = self.provider._record_and_pop(
            RecordedRequest(path=request.raw_path, headers=headers, body=body, raw=raw)
        )
        await self.wait(reply.delay, hold=reply.hold)
        events = _events_of(reply, asked=isinstance(body, dict) and body.get("stream") is True)
        if events is None:
            return self.response(reply)
        return await self.stream(request, reply, events)

    def response(self, reply: Reply) -> web.Response:
        from aiohttp import web

        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        response = web.Response(status=reply.status, body=payload, headers=reply.headers)
        response.content_type = "application/json"
        self.closing(response)
        return response

    def closing(self, response: web.StreamResponse) -> None:
        # aiohttp closes every connection once these answers are out, but only a response told
        # so says ``connection: close`` (a client then does not try the connection again).
        if self.provider._stopping:
            response.force_close()

    async def stream(
        self, request: web.BaseRequest, reply: Reply, events: tuple[Any, ...]
    ) -> web.StreamResponse:
        """Send ``events`` as server-sent events, each after the reply's ``chunk_delay``."""
        from aiohttp import web

        response = web.StreamResponse(headers=reply.headers)
        self.closing(response)
        response.content_type = "text/event-stream"
        try:
            await response.prepare(request)
            for number, event in enumerate((*events, "[DONE]")):
                if number == reply.stall_after:
                    await self.wait(0.0, hold=True)
                await self.wait(reply.chunk_delay, hold=False)
                data = event if isinstance(event, str) else json.dumps(event)
                await response.write(f"data: {data}\n\n".encode())
        except ConnectionError:
            pass  # the client went away (a cancelled call): aiohttp closes the connection
        return response


_NOT_POST = Reply.error(501, "LocalProvider answers POST only")


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` event."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {**_CHUNK_HEAD, "choices": [choice]}


def _usage_chunk(prompt_tokens: int, completion_tokens: int, **more: Any) -> dict[str, Any]:
    """The last event of a stream asked for its usage: no choice, the usage."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        **more,
    }
    return {**_CHUNK_HEAD, "choices": [], "usage": usage}


_CHUNK_HEAD = {
    "id": "chatcmpl-local",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "test-model",
}


def _events_of(reply: Reply, *, asked: bool) -> tuple[Any, ...] | None:
    """The events to stream for ``reply`` (``None``: answer in one piece).

    A streamed reply streams; a chat completion streams when the request asked for it (its
    message as one chunk); anything else (an error, a malformed body) is sent as it is.
    """
    if reply.events is not None:
        return reply.events
    body = reply.body
    if not asked or reply.status != 200 or not isinstance(body, dict):
        return None
    if body.get("object") != "chat.completion" or not body.get("choices"):
        return None
    choice = body["choices"][0]
    message = dict(choice.get("message") or {})
    if message.get("tool_calls"):
        calls = message["tool_calls"]
        message["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls)]
    usage = dict(body.get("usage") or {})
    prompt, output = usage.pop("prompt_tokens", 0), usage.pop("completion_tokens", 0)
    usage.pop("total_tokens", None)
    return (
        _chunk(message),
        _chunk({}, choice.get("finish_reason")),
        _usage_chunk(prompt, output, **usage),
    )


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
