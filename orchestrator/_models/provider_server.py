"""A real, scriptable HTTP model provider on 127.0.0.1, for tests and demos.

Theory of operation: the adapters (litellm, the remote summary endpoint) are only honest when
they talk to a real socket, because that is where their retry, header and error-mapping
behaviour lives. :class:`LocalProvider` runs a stdlib ``ThreadingHTTPServer`` in a background
thread, so the client side can be any event loop (litellm calls it from asyncio). It speaks
just enough of the OpenAI chat-completions protocol (``POST .../chat/completions``) and the
remote-summary protocol (``POST /summary``), and answers each request with the next
:class:`Reply` from a queue the test filled. Every request body is recorded, so a test can count
HTTP attempts.

A reply may "hold": the handler thread waits until :meth:`LocalProvider.release` or
:meth:`LocalProvider.stop`. That is how a test gets a call that hangs without sleeping.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

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
    """

    status: int = 200
    body: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    hold: bool = False

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
    """A threaded HTTP server answering from a queue of :class:`Reply` specs.

    Use as a context manager (or call :meth:`start` / :meth:`stop`)::

        with LocalProvider() as provider:
            provider.push(Reply.summary("ok"))
            model = LiteLLMModel("openai/test-model", api_base=provider.url + "/v1", api_key="k")
    """

    def __init__(self, replies: tuple[Reply, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque(replies)
        self._requests: list[RecordedRequest] = []
        self._released = threading.Event()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (only while running)."""
        if self._server is None:
            raise RuntimeError("LocalProvider is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

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
        self._released.set()

    def start(self) -> LocalProvider:
        """Bind a random port on 127.0.0.1 and serve in a daemon thread."""
        server = _Server(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        # A short poll interval: stop() waits for serve_forever to notice, once per test.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release held requests, stop serving and close the socket."""
        self._stopping.set()
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
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

    def _wait(self, reply: Reply) -> None:
        if reply.hold:
            self._released.wait()
        elif reply.delay > 0:
            self._stopping.wait(min(reply.delay, MAX_DELAY))


class _Server(ThreadingHTTPServer):
    # Many clients may connect at once (the concurrency benchmark, the pool test): the stdlib's
    # listen backlog of 5 would drop their connection attempts and delay them by seconds.
    request_queue_size = 1024


def _make_handler(provider: LocalProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no keep-alive thread outlives a test.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = provider._record_and_pop(
                RecordedRequest(path=self.path, headers=headers, body=body, raw=raw)
            )
            provider._wait(reply)
            payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body)
            data = payload if isinstance(payload, bytes) else payload.encode()
            try:
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                # The client gave up (a cancelled call): nothing to answer.
                pass

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            # Silence the per-request stderr log; tests read provider.requests instead.
            pass

    return Handler
