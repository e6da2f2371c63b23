"""The remote summary endpoint (oh-my-pi's ``compaction.remoteEndpoint``).

Theory of operation: some deployments summarise on a server of their own. The protocol is one
``POST <url>`` with ``{"systemPrompt", "prompt"}`` as JSON, answered by ``{"summary": "..."}``
(any other keys, such as ``shortSummary``, are ignored). I keep oh-my-pi's two error messages
word for word, and add a ``kind`` so the retry layer knows a 429 or a 5xx is worth another try.
Like every adapter this makes one attempt per call, and cancelling the caller's scope closes
the connection (httpx is anyio-native, so this route also runs on trio).

One HTTP client per route. Building an ``httpx.AsyncClient`` costs tens of milliseconds (TLS
context, pool) and a fresh one per call also throws away the open connection, so the route keeps
one client and reuses its pool. A client belongs to the event loop it first ran on; a call from
another loop (a second ``anyio.run``) gets a client of its own. :meth:`RemoteSummaryModel.aclose`
(or ``async with``) closes it; httpx itself is imported at the first call, so a program that
never calls a remote route never loads it.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from orchestrator._core.classify import classify_exception, retry_after_from_headers
from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelRequest, ModelResponse

if TYPE_CHECKING:
    import httpx

MISSING_SUMMARY = "Remote compaction response missing summary"


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
        self._client: httpx.AsyncClient | None = None
        self._client_loop: object = None

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
                (``transient`` for 429 and 5xx, else ``fatal``), ``Remote compaction response
                missing summary`` when the body has no string ``summary``, or the classified
                transport error.
        """
        import httpx

        body = {"systemPrompt": request.system, "prompt": request.prompt}
        client = self._shared_client()
        try:
            response = await client.post(
                self._url, json=body, headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            raise classify_exception(exc) from exc
        if not response.is_success:
            status = response.status_code
            transient = status == 429 or status >= 500
            raise ModelError(
                f"Remote compaction failed ({status} {response.reason_phrase})",
                kind="transient" if transient else "fatal",
                retry_after=retry_after_from_headers(response.headers) if transient else None,
                status=status,
            )
        summary = _summary_of(response)
        return ModelResponse(text=summary, stop_reason="stop", model=self._url, provider="remote")

    def _shared_client(self) -> httpx.AsyncClient:
        import anyio.lowlevel
        import httpx

        loop = anyio.lowlevel.current_token()
        if self._client is None or self._client_loop != loop:
            # The old client's connections belong to another (usually finished) event loop and
            # cannot be closed from this one; dropping it lets the garbage collector close them.
            # No cap on connections: httpx's default of 100 made the 101st concurrent summary
            # wait for a free connection, and its pool's bookkeeping grows with the waiters (1,000
            # sessions compacting at once through one route took minutes, issue 9). How many
            # calls run at once is the callers' business (one per compacting session).
            self._client = httpx.AsyncClient(timeout=self._timeout, transport=_pools())
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


POOLS = 25
"""Connection pools per route (see :func:`_pools`)."""


def _pools() -> httpx.AsyncBaseTransport:
    """The route's transport: :data:`POOLS` connection pools, each request to the least busy.

    httpcore's pool walks all its connections (and, for each idle one, all of them again) each
    time a request arrives or a response closes: with a couple of thousand summaries in flight
    through one pool, that bookkeeping took a sixth of the benchmark's CPU (issue 9). Split over
    25 pools, each walk is a 25th as long. The pools share one TLS context (building one reads
    the CA bundle) and keep at most 100 idle connections in all, as the one pool did; sequential
    calls all go to the first pool, so they reuse one connection. A proxy from the environment
    still gets the client's own proxy transport, as before.
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


def _summary_of(response: httpx.Response) -> str:
    try:
        payload: Any = response.json()
    except ValueError as exc:
        raise ModelError(MISSING_SUMMARY, status=response.status_code) from exc
    summary = payload.get("summary") if isinstance(payload, dict) else None
    if not isinstance(summary, str):
        raise ModelError(MISSING_SUMMARY, status=response.status_code)
    return summary
