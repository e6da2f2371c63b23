"""A small HTTP/1.1 client for the remote summary route on asyncio (issue 9).

Theory of operation: the route makes one kind of call, ``POST`` a JSON body and read a JSON
answer, and with a thousand sessions compacting at once it makes two thousand of them at the
same moment, each on a connection of its own. aiohttp spent about 0.35 ms of the event loop's
CPU on each (its connector, timeouts, request and response objects, stream readers); this client
spends about 0.13 ms: one :class:`asyncio.Protocol` per connection, the answer parsed by
httptools (llhttp, the parser of Node.js, in C) as the bytes come, the body kept in a list.
Measured on 2,000 concurrent calls to the local provider: 0.27 s of CPU against 0.71 s.
The HTTP parsing is httptools'; what is ours is the connection handling below. Checked again
for issue 34 (should a library's client replace it?): aiohttp's ``ClientSession`` still spends
about twice the CPU (1.0 s against 0.5 s for 2,000 concurrent 20 kB calls), so it stays.
For issue 37, a plain ``http`` URL whose host is an address connects on asyncio's own loop
without asyncio's ``create_connection`` and transport (:mod:`orchestrator._models.tcp`), which
cost more than the rest of a call: the route's CPU per call, connection included, went from
about 0.25 ms to 0.12 ms (``tests/bench/bench_remote.py``, AMD EPYC).

What it does, and what it does not:

* ``http`` and ``https`` (the standard library's default TLS context: the system's CAs, the
  host name checked); the URL's user and password as Basic authorization; no proxy (the route
  never read the proxy variables), no redirect followed (httpx's default, which the trio route
  keeps), no cookies;
* idle connections are kept per host and reused, most recent first, each for
  :data:`KEEP_IDLE` seconds, then closed by one timer (as aiohttp did: a burst of two thousand
  calls leaves two thousand sockets open for that long, not for good, and none is closed while
  the burst's answers come); one the server
  closed while idle is dropped, and a call whose reused connection closes before any byte of
  the answer comes is made once more on a new one (a server may close an idle connection just
  as a request goes out on it);
* a host name with several addresses is tried as asyncio's happy eyeballs do (the next address
  a quarter of a second after the last, not after its timeout); an address is connected to
  directly (over plain ``http`` by :mod:`~orchestrator._models.tcp`); on uvloop's event loop
  (an embedder may run the runtime there) uvloop looks the name up and tries its addresses in
  turn, having no such race;
* ``timeout`` bounds the connection (with TLS) and each silence while waiting for or reading the
  answer, as the other routes do: one timer per call, moved on lazily (checked when it fires)
  rather than rescheduled at every read;
* the answer's body is read up to ``limit`` bytes, ``gzip`` and ``deflate`` unpacked as they
  come (a server may compress without being asked), and refused past it, however it is framed
  (``Content-Length``, chunked, or until the connection closes);
* cancelling the caller closes the connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
import ssl
import zlib
from asyncio.selector_events import BaseSelectorEventLoop
from collections.abc import Callable
from typing import Any, NamedTuple, cast
from urllib.parse import unquote, urlsplit

import httptools

from orchestrator._models import tcp

KEEP_IDLE = 15.0
"""Seconds an idle connection is kept for reuse (aiohttp's keep-alive time)."""


class Answer(NamedTuple):
    """An HTTP answer: its status, its headers (names in lower case) and its whole body."""

    status: int
    headers: dict[str, str]
    body: bytes


class TransportError(ConnectionError):
    """The connection failed or closed before the answer was whole (worth another try)."""


class BadAnswerError(Exception):
    """The server's bytes are not an HTTP answer this client reads."""


class TooLargeError(Exception):
    """The answer's body is larger than the client reads."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


class _Target(NamedTuple):
    key: tuple[bool, str, int]  # secure, host, port: the connections' pool
    head: bytes  # the request line and every header but the body's length
    eyeballs: float | None  # happy eyeballs' delay: for a name, not an address
    family: int | None  # for plain http to an address: its family (the client connects itself)


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url}: not an http or https URL")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = parts.netloc.rpartition("@")[2]
    lines = [f"POST {path} HTTP/1.1", f"Host: {authority}", "Content-Type: application/json"]
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append(f"Authorization: Basic {base64.b64encode(user.encode()).decode()}")
    head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
    host = parts.hostname
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:  # a name
        # asyncio's race of a single address still makes its tasks: with 2,000 connections at
        # once, about 0.2 s more of the event loop's CPU. So only a name races.
        return _Target((secure, host, port), head, 0.25, None)
    # An IPv6 address with a zone (fe80::1%eth0) is left to asyncio, which reads the zone.
    direct = not secure and "%" not in host
    family = (socket.AF_INET if version == 4 else socket.AF_INET6) if direct else None
    return _Target((secure, host, port), head, None, family)


def _races(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's ``create_connection`` takes ``happy_eyeballs_delay``.

    asyncio's own loops do; uvloop's does not (it raises TypeError on the keyword), and an
    embedder may run the runtime on it.
    """
    return isinstance(loop, asyncio.BaseEventLoop)


class Http1Client:
    """POST to HTTP/1.1 servers from one asyncio event loop, keeping connections for reuse.

    Args:
        timeout: Seconds for connecting, and for each silence while waiting for the answer.
        limit: The most bytes of an answer's body read (unpacked).
    """

    def __init__(self, timeout: float, limit: int, *, keep_idle: float = KEEP_IDLE) -> None:
        self._timeout = timeout
        self._limit = limit
        self._keep_idle = keep_idle
        self._sweeper: asyncio.TimerHandle | None = None
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple[bool, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None
        self.closed = False

    async def post(self, url: str, body: bytes) -> Answer:
        """POST ``body`` (JSON) to ``url`` and read the whole answer.

        Raises:
            ValueError: ``url`` is not an http or https URL.
            TransportError: The connection failed or closed before the answer was whole.
            TimeoutError: Connecting, or a silence of the server, took ``timeout`` seconds.
            BadAnswerError: The server's bytes are not an HTTP answer.
            TooLargeError: The body is larger than ``limit``.
            RuntimeError: The client is closed.
        """
        if self.closed:
            raise RuntimeError("the HTTP client is closed")
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        request = b"".join((target.head, b"%d\r\n\r\n" % len(body), body))  # one copy of the body
        idle = self._idle.setdefault(target.key, [])
        while idle:
            connection = idle.pop()
            if connection.usable:
                try:
                    return await self._exchange(connection, idle, request)
                except TransportError:
                    if connection.heard:
                        raise
                    # Closed by the server as the request went out: once more, on a new one.
        connection = await self._connect(target)
        return await self._exchange(connection, idle, request)

    async def _exchange(
        self, connection: _Connection, idle: list[_Connection], request: bytes
    ) -> Answer:
        try:
            answer = await connection.send(request)
        except BaseException:
            connection.close()
            raise
        if connection.usable and not self.closed:
            connection.idle_since = connection.loop_time()
            idle.append(connection)
            if self._sweeper is None:
                self._sweeper = connection.later(self._keep_idle, self._sweep)
        else:
            connection.close()
        return answer

    def _sweep(self) -> None:
        """Close the connections idle for ``keep_idle`` seconds; come back for the others."""
        self._sweeper = None
        oldest, now, later = None, 0.0, None
        for idle in self._idle.values():
            if not idle:
                continue
            now = idle[-1].loop_time()
            # Oldest first (calls take the newest): the expired ones are at the front.
            while idle and (idle[0].idle_since <= now - self._keep_idle or not idle[0].usable):
                idle.pop(0).close()
            if idle and (oldest is None or idle[0].idle_since < oldest):
                oldest, later = idle[0].idle_since, idle[0]
        if later is not None and oldest is not None:
            self._sweeper = later.later(oldest + self._keep_idle - now, self._sweep)

    async def _connect(self, target: _Target) -> _Connection:
        secure, host, port = target.key
        loop = asyncio.get_running_loop()
        try:
            if target.family is not None and isinstance(loop, BaseSelectorEventLoop):
                sock = await tcp.connect(loop, target.family, host, port, self._timeout)
                connection = self._new_connection(loop)
                tcp.SocketTransport(loop, sock, connection)
            else:
                connection = await self._connect_by_asyncio(loop, target)
        except TimeoutError:
            raise TimeoutError(
                f"cannot connect to {host}:{port} within {self._timeout:g} s"
            ) from None
        except OSError as exc:
            raise TransportError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        self._open.add(connection)
        return connection

    async def _connect_by_asyncio(
        self, loop: asyncio.AbstractEventLoop, target: _Target
    ) -> _Connection:
        """Connect with the loop's ``create_connection``: a name to look up, TLS, or uvloop."""
        secure, host, port = target.key
        if secure and self._tls is None:
            self._tls = ssl.create_default_context()
        options: dict[str, Any] = {"ssl": self._tls if secure else None}
        if target.eyeballs is not None and _races(loop):
            options["happy_eyeballs_delay"] = target.eyeballs
        async with asyncio.timeout(self._timeout):
            _, connection = await loop.create_connection(
                lambda: self._new_connection(loop), host, port, **options
            )
        return connection

    def _new_connection(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        return _Connection(loop, self._timeout, self._limit, self._open.discard)

    def close(self) -> None:
        """Close every connection, idle or busy (a busy call fails). Idempotent."""
        self.closed = True
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self._open):
            connection.close()


class _Connection(asyncio.Protocol):
    """One connection: one call at a time, its answer parsed as the bytes come."""

    # Slots, not a dict per connection: two thousand are alive at once in a burst, and each
    # young collection of the garbage collector walks what is alive.
    __slots__ = (
        "_complete",
        "_done",
        "_gone",
        "_headers",
        "_keep_alive",
        "_last",
        "_limit",
        "_loop",
        "_lost",
        "_parser",
        "_pieces",
        "_refusal",
        "_size",
        "_status",
        "_timeout",
        "_timer",
        "_transport",
        "_unpack",
        "heard",
        "idle_since",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        limit: int,
        gone: Callable[[_Connection], None],
    ) -> None:
        self._loop = loop
        self._timeout = timeout
        self._limit = limit
        self._gone = gone
        self._transport: asyncio.Transport | None = None
        self._done: asyncio.Future[Answer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._lost = False
        self.heard = False  # a byte of the current answer came
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._pieces: list[bytes] = []
        self._size = 0
        self._unpack: zlib._Decompress | None = None
        self._status = 0
        self._complete = False
        self._keep_alive = False
        self._refusal: BaseException | None = None

    def loop_time(self) -> float:
        return self._loop.time()

    def later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._loop.call_later(delay, callback)

    @property
    def usable(self) -> bool:
        """Open, and its last answer complete with keep-alive."""
        return not self._lost and self._transport is not None and self._done is None

    # -- the call ---------------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self._transport is not None, "connected"
        assert self._done is None, "one call at a time"
        self._reset()
        self.heard = False
        done = self._done = self._loop.create_future()
        self._last = self._loop.time()
        self._timer = self._loop.call_at(self._last + self._timeout, self._on_timer)
        self._transport.write(request)
        return done

    def _on_timer(self) -> None:
        # Moved on lazily: a read only notes its time, and the timer, when it fires early,
        # sets itself again for the rest of the silence allowed.
        self._timer = None
        if self._done is None or self._done.done():
            return
        due = self._last + self._timeout
        if self._loop.time() >= due:
            self._fail(TimeoutError(f"no answer for {self._timeout:g} s"))
        else:
            self._timer = self._loop.call_at(due, self._on_timer)

    def _finish(self) -> None:
        done, self._done = self._done, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if done is not None and not done.done():
            done.set_result(Answer(self._status, self._headers, b"".join(self._pieces)))

    def _fail(self, error: BaseException) -> None:
        done, self._done = self._done, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if done is not None and not done.done():
            done.set_exception(error)
        self.close()

    def close(self) -> None:
        self._lost = True
        if self._transport is not None:
            # Aborted, not closed: nothing is left to send (a call's bytes went out before its
            # answer), and a TLS connection's close waits on the server's reply to its shutdown,
            # which an event loop ending now would never see (its socket then left open).
            self._transport.abort()

    # -- asyncio's side -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always an asyncio.Transport subclass (uvloop's is not).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._done is None:  # nothing asked: a server talking out of turn
            self.close()
            return
        self.heard = True
        self._last = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self._fail(self._refusal or BadAnswerError("the answer could not be read"))
            return
        except httptools.HttpParserError as exc:
            self._fail(BadAnswerError(f"not an HTTP answer ({exc})"))
            return
        if self._complete:
            self._finish()
            if not self._keep_alive:
                self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        # The parser holds this connection (its callbacks): dropped, the two are freed when the
        # client lets the connection go, not left as a cycle for the garbage collector.
        del self._parser
        self._gone(self)
        if self._done is None or self._done.done():
            return
        framed = "content-length" in self._headers or "chunked" in self._headers.get(
            "transfer-encoding", ""
        )
        if self._status and not framed:  # a body that ends with the connection: whole now
            with contextlib.suppress(TooLargeError, BadAnswerError):
                self._flush()  # a refusal is kept in _refusal
            if self._refusal is None:
                self._finish()
                return
        if self._refusal is not None:
            self._fail(self._refusal)
        else:
            self._fail(TransportError("the server closed the connection before answering"))

    # -- httptools' callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > self._limit:
            self._refuse(TooLargeError(int(length)))
        coding = self._headers.get("content-encoding", "identity").strip().lower()
        if coding in ("gzip", "x-gzip"):
            self._unpack = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._unpack = zlib.decompressobj()
        elif coding not in ("identity", ""):
            self._refuse(BadAnswerError(f"an answer encoded as {coding!r}, which is not read"))

    def on_body(self, body: bytes) -> None:
        if self._unpack is not None:
            try:
                # Never more than the room left plus one byte: a small body that unpacks to
                # gigabytes is refused after the limit, not unpacked whole.
                body = self._unpack.decompress(body, self._limit - self._size + 1)
            except zlib.error as exc:
                self._refuse(BadAnswerError(f"a compressed answer that does not unpack ({exc})"))
        self._take(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer (103 Early Hints): the real one follows
            self._headers, self._pieces, self._size, self._status = {}, [], 0, 0
            return
        self._flush()
        # Asked here: llhttp answers False once feed_data has returned.
        self._keep_alive = self._parser.should_keep_alive()
        self._complete = True

    def _flush(self) -> None:
        if self._unpack is not None and self._refusal is None:
            self._take(self._unpack.flush())
            self._unpack = None

    def _take(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._limit or (self._unpack is not None and self._unpack.unconsumed_tail):
            self._refuse(TooLargeError(None))
        self._pieces.append(piece)

    def _refuse(self, error: BaseException) -> None:
        self._refusal = error
        raise error  # stops the parser: feed_data raises HttpParserCallbackError
