"""The remote route's HTTP/1.1 client on asyncio, against real sockets (issue 9).

The route's contract (timeouts, cancellation, size bounds, the bytes sent) is tested through
``RemoteSummaryModel`` in test_remote_model.py; here, what HTTP servers do that the local
provider does not: close idle connections, end a body by closing, chunk, compress, speak TLS.
"""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelRequest
from orchestrator._models.http1 import BadAnswerError, Http1Client, TransportError
from orchestrator._models.remote import RemoteSummaryModel
from orchestrator.testing import LocalProvider, Reply
from tests.runtime_kit import UVLOOP

pytestmark = pytest.mark.anyio

REQUEST = ModelRequest(
    purpose="history",
    system="You summarise.",
    messages=({"role": "user", "content": "<conversation>...</conversation>"},),
    max_tokens=100,
)
LIMIT = 1 << 20


@pytest.fixture(params=["asyncio", UVLOOP], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    # The client runs on asyncio's loops only (trio's route is httpx): the standard one, and
    # uvloop's, which an embedder may run the runtime on.
    return request.param


Handler = Callable[[socket.socket, bytes], None]


class RawServer:
    """A thread accepting connections; ``handler(conn, request)`` answers each request read."""

    def __init__(self, handler: Handler, wrap: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.wrap = wrap
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        try:
            if self.wrap is not None:
                conn = self.wrap.wrap_socket(conn, server_side=True)
            with conn:
                data = b""
                while True:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + rest[:length])
                    data = rest[length:]
                    self.handler(conn, head)
        except (OSError, ssl.SSLError):
            return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler, wrap: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(handler, wrap))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_a_kept_connection_serves_the_next_call(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda conn, _: conn.sendall(answer(b"{}", "Content-Length: 2")))
    client = Http1Client(5, LIMIT)
    url = f"http://127.0.0.1:{server.port}/summary"
    for _ in range(3):
        assert (await client.post(url, b"{}")).body == b"{}"
    assert server.connections == 1
    client.close()


async def test_a_host_name_is_looked_up_then_connected_to(serve: Callable[..., RawServer]) -> None:
    # A name takes the loop's look-up, and asyncio's race of its addresses (happy eyeballs).
    # uvloop has no race: its connect refuses the race's delay, which failed every call there.
    server = serve(lambda conn, _: conn.sendall(answer(b"{}", "Content-Length: 2")))
    client = Http1Client(5, LIMIT)
    assert (await client.post(f"http://localhost:{server.port}/s", b"{}")).body == b"{}"
    assert server.connections == 1
    client.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced_unseen(
    serve: Callable[..., RawServer],
) -> None:
    # The server answers with keep-alive, then closes the connection: the next call goes out
    # on it (or finds it closed) and is made again on a new one, once.
    def once(conn: socket.socket, _: bytes) -> None:
        conn.sendall(answer(b"ok", "Content-Length: 2"))
        conn.shutdown(socket.SHUT_RDWR)

    server = serve(once)
    client = Http1Client(5, LIMIT)
    url = f"http://127.0.0.1:{server.port}/"
    assert (await client.post(url, b"{}")).body == b"ok"
    assert (await client.post(url, b"{}")).body == b"ok"
    assert server.connections == 2
    client.close()


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        (answer(b"until the end", "Connection: close"), b"until the end"),
        (
            answer(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
            b"hello world",
        ),
        (
            answer(gzip.compress(b"packed"), "Content-Encoding: gzip", "Content-Length: 26"),
            b"packed",
        ),
        (
            answer(zlib.compress(b"deflated"), "Content-Encoding: deflate", "Content-Length: 16"),
            b"deflated",
        ),
        (
            answer(b"", "Link: </style.css>", status="103 Early Hints")
            + answer(b"after the hints", "Content-Length: 15"),
            b"after the hints",
        ),
    ],
    ids=["closed", "chunked", "gzip", "deflate", "early-hints"],
)
async def test_every_framing_and_encoding_a_server_may_use_is_read_whole(
    serve: Callable[..., RawServer], reply: bytes, body: bytes
) -> None:
    def send(conn: socket.socket, _: bytes) -> None:
        conn.sendall(reply)
        if b"Connection: close" in reply:
            conn.shutdown(socket.SHUT_RDWR)

    server = serve(send)
    client = Http1Client(5, LIMIT)
    got = await client.post(f"http://127.0.0.1:{server.port}/", b"{}")
    assert (got.status, got.body) == (200, body)
    client.close()


async def test_headers_are_read_in_lower_case(serve: Callable[..., RawServer]) -> None:
    reply = answer(b"", "Retry-After: 7", "Content-Length: 0", status="429 Too Many Requests")
    server = serve(lambda conn, _: conn.sendall(reply))
    client = Http1Client(5, LIMIT)
    got = await client.post(f"http://127.0.0.1:{server.port}/", b"{}")
    assert (got.status, got.headers["retry-after"]) == (429, "7")
    client.close()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP answer"),
        (answer(b"x", "Content-Encoding: br", "Content-Length: 1"), "encoded as 'br'"),
        (answer(b"not gzip", "Content-Encoding: gzip", "Content-Length: 8"), "does not unpack"),
    ],
    ids=["not-http", "brotli", "bad-gzip"],
)
async def test_an_answer_that_cannot_be_read_is_a_fatal_failure(
    serve: Callable[..., RawServer], reply: bytes, message: str
) -> None:
    server = serve(lambda conn, _: conn.sendall(reply))
    client = Http1Client(5, LIMIT)
    with pytest.raises(BadAnswerError, match=message):
        await client.post(f"http://127.0.0.1:{server.port}/", b"{}")
    assert client._open == set() or all(not c.usable for c in client._open)
    async with RemoteSummaryModel(f"http://127.0.0.1:{server.port}/") as model:
        with pytest.raises(ModelError) as caught:
            await model.complete(REQUEST)
    assert caught.value.kind == "fatal"
    client.close()


async def test_a_server_that_closes_without_answering_is_a_transient_failure(
    serve: Callable[..., RawServer],
) -> None:
    server = serve(lambda conn, _: conn.shutdown(socket.SHUT_RDWR))
    client = Http1Client(5, LIMIT)
    with pytest.raises(TransportError, match="closed the connection before answering"):
        await client.post(f"http://127.0.0.1:{server.port}/", b"{}")
    client.close()


async def test_the_urls_user_and_password_are_sent_as_basic_authorization() -> None:
    with LocalProvider() as provider:
        provider.push(Reply.remote("ok"))
        authority = provider.url.removeprefix("http://")
        async with RemoteSummaryModel(f"http://me:s%40cret@{authority}/summary") as model:
            assert (await model.complete(REQUEST)).text == "ok"
        (sent,) = provider.requests
    assert sent.headers["authorization"] == "Basic bWU6c0BjcmV0"  # me:s@cret
    assert sent.headers["host"] == authority


async def test_a_closed_client_refuses_calls() -> None:
    client = Http1Client(5, LIMIT)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.post("http://127.0.0.1:9/", b"{}")
    with pytest.raises(ValueError, match="not an http or https URL"):
        await Http1Client(5, LIMIT).post("ftp://example.com/", b"{}")


CERTIFICATE = Path(__file__).parent / "data" / "tls" / "localhost.pem"
"""A self-signed certificate and its key for localhost and 127.0.0.1, valid until 2126 (made once
with ``openssl req -x509 -newkey rsa:2048 -nodes -days 36500 -subj /CN=localhost -addext
subjectAltName=DNS:localhost,IP:127.0.0.1``); for these tests only."""


async def test_https_checks_the_servers_certificate_and_then_speaks_tls(
    serve: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(CERTIFICATE)
    server = serve(lambda conn, _: conn.sendall(answer(b"secret", "Content-Length: 6")), context)
    url = f"https://127.0.0.1:{server.port}/"
    # Not trusted: refused at the handshake, a transient failure like any failed connection.
    with pytest.raises(TransportError, match="certificate verify failed"):
        await Http1Client(5, LIMIT).post(url, b"{}")
    # Trusted (the standard variable the default context reads): the answer comes over TLS.
    monkeypatch.setenv("SSL_CERT_FILE", str(CERTIFICATE))
    client = Http1Client(5, LIMIT)
    assert (await client.post(url, b"{}")).body == b"secret"
    assert (await client.post(url, b"{}")).body == b"secret"  # the same TLS connection
    assert server.connections == 2  # the refused one and this one
    client.close()
    await anyio.sleep(0)


async def test_idle_connections_are_kept_a_while_then_closed(
    serve: Callable[..., RawServer],
) -> None:
    # A burst left every connection open for good: two thousand sockets after two thousand
    # calls at once (aiohttp closed idle ones after 15 s).
    hold = threading.Event()

    def slow(conn: socket.socket, _: bytes) -> None:
        hold.wait(10)
        conn.sendall(answer(b"ok", "Content-Length: 2"))

    server = serve(slow)
    client = Http1Client(5, LIMIT, keep_idle=60)
    url = f"http://127.0.0.1:{server.port}/"
    count = 120
    async with anyio.create_task_group() as group:
        for _ in range(count):
            group.start_soon(client.post, url, b"{}")
        while len(server.requests) < count:
            await anyio.sleep(0.01)
        hold.set()
    assert server.connections == count
    assert len(client._open) == count  # kept for the next calls, a sweep timer set
    assert client._sweeper is not None
    assert (await client.post(url, b"{}")).body == b"ok"
    assert server.connections == count  # a kept one served it
    # Every connection but the one just used made idle longer ago than keep_idle: the sweep
    # closes those, keeps that one, and comes back for it later.
    (idle,) = client._idle.values()
    for connection in idle[:-1]:
        connection.idle_since -= 61
    client._sweeper.cancel()
    client._sweep()
    with anyio.fail_after(10):  # a safety net against a hang, not a measure of speed
        while len(client._open) > 1:
            await anyio.sleep(0.01)
    assert client._sweeper is not None
    idle[-1].idle_since -= 61
    client._sweeper.cancel()
    client._sweep()
    with anyio.fail_after(10):
        while client._open:
            await anyio.sleep(0.01)
    assert client._sweeper is None  # nothing left to come back for
    assert (await client.post(url, b"{}")).body == b"ok"
    assert server.connections == count + 1
    client.close()
    assert client._sweeper is None


async def test_the_sweep_runs_by_itself(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda conn, _: conn.sendall(answer(b"ok", "Content-Length: 2")))
    client = Http1Client(5, LIMIT, keep_idle=0.05)
    assert (await client.post(f"http://127.0.0.1:{server.port}/", b"{}")).body == b"ok"
    with anyio.fail_after(10):  # a safety net against a hang, not a measure of speed
        while client._open:
            await anyio.sleep(0.01)
    client.close()
