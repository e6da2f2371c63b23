"""The remote summary endpoint (oh-my-pi's ``compaction.remoteEndpoint``).

Theory of operation: some deployments summarise on a server of their own. The protocol is one
``POST <url>`` with ``{"systemPrompt", "prompt"}`` as JSON, answered by ``{"summary": "..."}``
(any other keys, such as ``shortSummary``, are ignored). I keep oh-my-pi's two error messages
word for word, and add a ``kind`` so the retry layer knows a 429 or a 5xx is worth another try.
Like every adapter this makes one attempt per call, and cancelling the caller's scope closes
the connection.

One HTTP client per route. Building a client costs tens of milliseconds (TLS context, pool) and
a fresh one per call also throws away the open connection, so the route keeps one client and
reuses its pool. A client belongs to the event loop it first ran on; a call from another loop (a
second ``anyio.run``) gets a client of its own. :meth:`RemoteSummaryModel.aclose` (or ``async
with``) closes it. The HTTP library is imported when the route is made, so a program that never
makes a remote route never loads it, and a server that makes its routes at start does not import
it (0.2 to 0.5 s) on its event loop in the middle of its first requests (issue 9).

Two HTTP clients, one per kind of event loop. On asyncio the route uses its own small HTTP/1.1
client (:mod:`orchestrator._models.http1`): with a thousand sessions compacting at once (two
thousand summaries in flight) httpx and httpcore cost about 2.5 ms of CPU per request (their
anyio timeouts, pool bookkeeping and h11 state machine), aiohttp about 0.35 ms, this client
about 0.13 ms (issue 9), and that CPU is time the event loop cannot give the sessions. It runs
on asyncio only, so on trio the route keeps httpx. Both send the same bytes (httpx's compact
JSON), give up after ``timeout`` seconds of connecting or of silence while reading, and map a
transport failure to a :class:`ModelError` (transient for connection failures and timeouts);
cancelling the caller closes the connection.
"""

from __future__ import annotations

import contextlib
import json
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from orchestrator._core.classify import classify_exception, retry_after_from_headers
from orchestrator._core.errors import FatalModelError, ModelError, TransientModelError
from orchestrator._core.model import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import httpx

MISSING_SUMMARY = "Remote compaction response missing summary"

MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The most of an answer's body a route reads. A summary is tens of kilobytes; an endpoint that
sends more (a bug, or a hostile one streaming without end, which no read timeout catches while
bytes keep coming) is refused at this size, before it takes the server's memory."""


def _too_large(size: int | None) -> ModelError:
    sent = f"{size} bytes" if size is not None else "more"
    return FatalModelError(
        f"Remote compaction response too large ({sent}; at most {MAX_ANSWER_BYTES} bytes are read)"
    )


class RemoteSummaryModel:
    """A :class:`~orchestrator.Model` that asks a remote summary endpoint.

    Args:
        url: The endpoint; the request is a ``POST`` to exactly this URL.
        timeout: Seconds before the HTTP call gives up.
        context_window: The window to report (0: unknown; the server decides).
    """

    def __init__(self, url: str, *, timeout: float = 120.0, context_window: int = 0) -> None:
        self._url = url
        self._timeout = timeout
        self._context_window = context_window
        self._client: _Client | None = None
        self._client_loop: object = None
        _import_http_library()

    @property
    def name(self) -> str:
        """``remote/<url>``."""
        return f"remote/{self._url}"

    @property
    def context_window(self) -> int:
        """The configured context window (0 when unknown)."""
        return self._context_window

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """POST the system prompt and the assembled prompt; return the summary.

        Returns:
            A reply whose text is the endpoint's ``summary``.

        Raises:
            ModelError: ``Remote compaction failed (<status> <reason>)`` on a non-2xx answer
                (a :class:`TransientModelError` for 429 and 5xx, else a
                :class:`FatalModelError`), ``Remote compaction response
                missing summary`` when the body has no string ``summary``, or the classified
                transport error.
        """
        client = self._shared_client()
        body = {"systemPrompt": request.system, "prompt": request.prompt}
        answer = await client.post(self._url, client.encode(body))
        status = answer.status
        if not 200 <= status < 300:
            transient = status == 429 or status >= 500
            failure = TransientModelError if transient else FatalModelError
            raise failure(
                f"Remote compaction failed ({status} {_reason(status)})",
                retry_after=retry_after_from_headers(answer.headers) if transient else None,
                status=status,
            )
        summary = _summary_of(answer)
        return ModelResponse(text=summary, stop_reason="stop", model=self._url, provider="remote")

    def _shared_client(self) -> _Client:
        import asyncio

        # The running asyncio loop is one C call away; anyio's token (trio's) costs a lookup of
        # the running library at every call.
        loop: object
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            import anyio.lowlevel

            loop = anyio.lowlevel.current_token()
        if self._client is None or self._client_loop != loop:
            # The old client's connections belong to another (usually finished) event loop and
            # cannot be closed from this one; dropping it lets the garbage collector close them.
            # No cap on connections: a cap of 100 (httpx's default) made the 101st concurrent
            # summary wait for a free connection (1,000 sessions compacting at once through one
            # route took minutes, issue 9). How many calls run at once is the callers' business
            # (one per compacting session).
            if isinstance(loop, asyncio.AbstractEventLoop):
                self._client = _Http1Route(self._timeout)
            else:
                self._client = _HttpxClient(self._timeout)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the shared HTTP client (its open connections). The route stays usable."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> RemoteSummaryModel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Answer(NamedTuple):
    """What the route reads of an HTTP answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Client(Protocol):
    """One HTTP library behind the route: POST a JSON body, read the whole answer."""

    @property
    def is_closed(self) -> bool: ...

    def encode(self, body: dict[str, str]) -> bytes: ...

    async def post(self, url: str, body: bytes) -> _Answer: ...

    async def aclose(self) -> None: ...


_HEADERS = {"content-type": "application/json"}


def _import_http_library() -> None:
    """Import now what the route's first call would.

    That is the body's encoder, and the HTTP library of the event loop the route is made on
    (asyncio's when made outside one: the common case).
    """
    import msgspec.json  # noqa: F401

    try:
        import sniffio

        library = sniffio.current_async_library()
    except (ImportError, RuntimeError):  # outside an event loop, or no sniffio: asyncio's
        library = "asyncio"
    if library == "asyncio":
        import orchestrator._models.http1  # noqa: F401
    else:
        import httpx  # noqa: F401


def _json_encoder() -> Callable[[dict[str, str]], bytes]:
    """The request body's encoder, at half the standard library's cost per body (issue 9).

    It writes httpx's encoding of ``json=`` byte for byte: compact, UTF-8, a lone surrogate
    refused with ``UnicodeEncodeError``.
    """
    import msgspec

    return msgspec.json.Encoder().encode


class _Http1Route:
    """The route on asyncio: :class:`~orchestrator._models.http1.Http1Client`, no cap on calls."""

    def __init__(self, timeout: float) -> None:
        from orchestrator._models.http1 import Http1Client

        self.encode = _json_encoder()
        self.client = Http1Client(timeout, MAX_ANSWER_BYTES)

    @property
    def is_closed(self) -> bool:
        return self.client.closed

    async def post(self, url: str, body: bytes) -> _Answer:
        from orchestrator._models.http1 import BadAnswerError, TooLargeError, TransportError

        try:
            status, headers, content = await self.client.post(url, body)
        except TooLargeError as exc:
            raise _too_large(exc.size) from exc
        except (TransportError, TimeoutError) as exc:  # httpx's NetworkError, TimeoutException
            raise TransientModelError(str(exc)) from exc
        except BadAnswerError as exc:
            raise FatalModelError(f"Remote compaction failed: {exc}") from exc
        return _Answer(status, headers, content)

    async def aclose(self) -> None:
        self.client.close()

    def __del__(self) -> None:
        # A route dropped without aclose() (httpx allowed it silently): its connections are
        # closed now, not left for the collector to find (asyncio warns of each).
        client = getattr(self, "client", None)
        if client is not None:
            with contextlib.suppress(RuntimeError):  # its event loop is closed already
                client.close()


class _HttpxClient:
    """The route on trio: httpx (anyio-native) over :func:`_pools`."""

    def __init__(self, timeout: float) -> None:
        import httpx

        self.encode = _json_encoder()
        self.client = httpx.AsyncClient(timeout=timeout, transport=_pools())

    @property
    def is_closed(self) -> bool:
        return self.client.is_closed

    async def post(self, url: str, body: bytes) -> _Answer:
        import httpx

        try:
            request = self.client.build_request("POST", url, content=body, headers=_HEADERS)
            response = await self.client.send(request, stream=True)
            try:
                length = response.headers.get("content-length", "")
                if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
                    raise _too_large(int(length))
                pieces, size = [], 0
                async for piece in response.aiter_bytes():  # unpacked, bounded as it comes
                    size += len(piece)
                    if size > MAX_ANSWER_BYTES:
                        raise _too_large(None)
                    pieces.append(piece)
            finally:
                # Closes the connection; on trio, httpx's own generators left mid-way when the
                # bound is passed are finalized later (trio warns of each: nothing stays open).
                await response.aclose()
        except httpx.HTTPError as exc:
            raise classify_exception(exc) from exc
        return _Answer(response.status_code, response.headers, b"".join(pieces))

    async def aclose(self) -> None:
        await self.client.aclose()


def _reason(status: int) -> str:
    """The standard reason phrase (as httpx gives it: the server's own wording is not used)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


POOLS = 25
"""Connection pools per route (see :func:`_pools`)."""


def _pools() -> httpx.AsyncBaseTransport:
    """The route's transport: :data:`POOLS` connection pools, each request to the least busy.

    httpcore's pool walks all its connections (and, for each idle one, all of them again) each
    time a request arrives or a response closes: with a couple of thousand summaries in flight
    through one pool, that bookkeeping took a sixth of the benchmark's CPU (issue 9). Split over
    25 pools, each walk is a 25th as long. The pools share one TLS context (building one reads
    the CA bundle) and keep at most 100 idle connections in all, as the one pool did; sequential
    calls all go to the first pool, so they reuse one connection.
    """
    import httpx

    class Pools(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            context = httpx.create_ssl_context()
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=100 // POOLS)
            self.pools = [
                httpx.AsyncHTTPTransport(verify=context, limits=limits) for _ in range(POOLS)
            ]
            self.busy = [0] * POOLS

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            busy = self.busy
            index = busy.index(min(busy))
            busy[index] += 1
            try:
                return await self.pools[index].handle_async_request(request)
            finally:
                busy[index] -= 1  # answered (its body is read next) or failed

        async def aclose(self) -> None:
            for pool in self.pools:
                await pool.aclose()

    return Pools()


def _summary_of(answer: _Answer) -> str:
    try:
        payload = _read_json(answer.body)
    except ValueError as exc:
        raise FatalModelError(MISSING_SUMMARY, status=answer.status) from exc
    summary = payload.get("summary") if isinstance(payload, dict) else None
    if not isinstance(summary, str):
        raise FatalModelError(MISSING_SUMMARY, status=answer.status)
    return summary


def _read_json(body: bytes) -> Any:
    """The answer's JSON value, as the standard library reads it.

    msgspec reads a summary's answer in a seventh of the time (0.6 µs against 4.5 for a short
    one; issue 37), and what it reads, it reads as ``json.loads`` does. What it refuses and the
    standard library reads (``NaN``, a byte-order mark, UTF-16, a lone surrogate) goes to
    ``json.loads``, so every answer reads as it did.
    """
    import msgspec.json

    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return json.loads(body)
