"""The HTTP client's own TCP connections on asyncio's selector loop (the route's CPU, issue 37).

For plain ``http`` to an address, :mod:`orchestrator._models.tcp` replaces asyncio's
``create_connection`` and transport. Every test of the client in test_http1.py runs through it on
asyncio (and through asyncio's own on uvloop); here, what it must do as asyncio did: the same
failures worded the same, a connect timeout, cancellation, writes the kernel does not take at
once, a protocol that fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import selectors
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from orchestrator._models import tcp
from orchestrator._models.http1 import Http1Client, TransportError, _Connection, _target
from orchestrator.testing import LocalProvider, Reply

pytestmark = pytest.mark.anyio

LIMIT = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the path runs on asyncio's selector loop only


async def test_plain_http_to_an_address_takes_the_clients_own_connection() -> None:
    with LocalProvider() as provider:
        provider.push(Reply.remote("ok"), Reply.remote("again"))
        client = Http1Client(5, LIMIT)
        url = provider.url + "/summary"
        assert (await client.post(url, b"{}")).body == b'{"summary": "ok"}'
        (connection,) = client._open
        assert isinstance(connection._transport, tcp.SocketTransport)
        assert (await client.post(url, b"{}")).body == b'{"summary": "again"}'
        assert client._open == {connection}  # kept and reused
        client.close()
        await anyio.sleep(0)  # connection_lost comes soon after, as asyncio's transport calls it
        assert client._open == set()
        (first, second) = provider.requests
        assert first.raw == second.raw == b"{}"


async def test_a_closed_connection_is_freed_at_once_not_left_to_the_collector() -> None:
    # Two thousand connections of a burst would otherwise be cycles (connection and parser,
    # connection and transport) for the garbage collector to find.
    with LocalProvider() as provider:
        provider.push(Reply.remote("ok"))
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage
        try:
            client = Http1Client(5, LIMIT)
            await client.post(provider.url + "/summary", b"{}")
            client.close()
            await anyio.sleep(0)  # connection_lost
            del client
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, (_Connection, tcp.SocketTransport))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert left == []


def test_only_plain_http_to_an_address_is_connected_directly() -> None:
    assert _target("http://127.0.0.1:8/s").family == socket.AF_INET
    assert _target("http://[::1]:8/s").family == socket.AF_INET6
    assert _target("http://localhost:8/s").family is None  # a name: asyncio looks it up
    assert _target("https://127.0.0.1:8/s").family is None  # TLS: asyncio's
    assert _target("http://[fe80::1%25eth0]:8/s").family is None  # a zone: asyncio reads it
    assert _target("http://localhost:8/s").eyeballs == 0.25  # only a name races its addresses
    assert _target("http://[fe80::1%25eth0]:8/s").eyeballs is None


async def failures(client: Http1Client, url: str) -> tuple[BaseException, BaseException]:
    """What connecting to ``url`` raises through the client's own path, then asyncio's: alike."""
    caught = []
    for target in (_target(url), _target(url)._replace(family=None)):
        with pytest.raises((TransportError, TimeoutError)) as failure:
            await client._connect(target)
        caught.append(failure.value)
    ours, asyncios = caught
    assert type(ours) is type(asyncios)
    assert str(ours) == str(asyncios)
    return ours, asyncios


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "224.0.0.1"])
async def test_a_failed_connection_is_worded_as_asyncio_words_it(host: str) -> None:
    # Refused after the attempt ("Connect call failed (address)"), or at once by the kernel
    # (a multicast address: "Network is unreachable"), as asyncio raises either.
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    client = Http1Client(5, LIMIT)
    url = f"http://{host}:{port}/"
    ours, asyncios = await failures(client, url)
    assert type(ours) is TransportError
    assert str(ours).startswith(f"cannot connect to {host.strip('[]')}:{port}: ")
    assert isinstance(ours.__cause__, OSError)
    assert ours.__cause__.errno == asyncios.__cause__.errno  # type: ignore[union-attr]
    assert client._open == set()


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose listener accepts nothing more: a new connection waits (its SYN dropped)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    waiting = []
    for _ in range(4):  # the queue holds one or two, depending on the kernel
        held = socket.socket()
        held.setblocking(False)
        held.connect_ex(("127.0.0.1", port))
        waiting.append(held)
    yield port
    for held in waiting:
        held.close()
    listener.close()


async def test_connecting_longer_than_the_timeout_fails_as_asyncios_did(full_listener: int) -> None:
    client = Http1Client(0.2, LIMIT)
    url = f"http://127.0.0.1:{full_listener}/"
    ours, _ = await failures(client, url)
    assert type(ours) is TimeoutError
    assert str(ours) == f"cannot connect to 127.0.0.1:{full_listener} within 0.2 s"


async def test_cancelling_a_connection_in_progress_closes_its_socket(full_listener: int) -> None:
    loop = asyncio.get_running_loop()
    sockets: list[socket.socket] = []
    made = socket.socket

    def recorded(*args: Any) -> socket.socket:
        sockets.append(made(*args))
        return sockets[-1]

    selector = loop._selector  # type: ignore[attr-defined]
    before = set(selector.get_map())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket, "socket", recorded)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(tcp.connect, loop, socket.AF_INET, "127.0.0.1", full_listener, 30)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
    assert scope.cancelled_caught
    (sock,) = sockets
    assert sock.fileno() == -1  # closed
    assert set(selector.get_map()) == before  # no writer left behind
    gc.collect()  # an unclosed socket would warn here (filterwarnings = error)


async def test_a_socket_connected_at_once_is_used_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux answers EINPROGRESS even on loopback; another kernel may connect at once.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    connect = socket.socket.connect

    def at_once(sock: socket.socket, address: Any) -> None:
        sock.setblocking(True)
        try:
            connect(sock, address)
        finally:
            sock.setblocking(False)

    monkeypatch.setattr(socket.socket, "connect", at_once)
    sock = await tcp.connect(asyncio.get_running_loop(), socket.AF_INET, "127.0.0.1", port, 5)
    assert sock.getpeername() == ("127.0.0.1", port)
    assert not sock.getblocking()
    sock.close()
    listener.close()


async def test_a_connection_not_made_at_once_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As to another machine: the handshake is not over when connect returns.
    monkeypatch.setattr(tcp, "_connected", lambda _: False)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sock = await tcp.connect(asyncio.get_running_loop(), socket.AF_INET, "127.0.0.1", port, 5)
    assert sock.getpeername() == ("127.0.0.1", port)
    sock.close()
    listener.close()


class Recorder(asyncio.Protocol):
    """A protocol that keeps what it is told."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.lost: list[BaseException | None] = []
        self.fail = False

    def data_received(self, data: bytes) -> None:
        if self.fail:
            raise RuntimeError("a bug")
        self.data += data

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


def read_all(sock: socket.socket, size: int, into: bytearray) -> threading.Thread:
    def read() -> None:
        while len(into) < size:
            into.extend(sock.recv(1 << 20))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


async def test_bytes_the_kernel_does_not_take_at_once_follow_in_order() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = pair()
    protocol = Recorder()
    transport = tcp.SocketTransport(loop, ours, protocol)
    first, second = bytes(range(256)) * 16384, b"and then this" * 1000  # 4 MB: more than a buffer
    transport.write(first)
    assert transport._unsent  # the kernel took part of it
    transport._write_more()  # woken while the buffer is still full: nothing is lost
    transport.write(second)  # queued behind the rest, not sent before it
    received = bytearray()
    reader = read_all(theirs, len(first) + len(second), received)
    while transport._unsent:
        await anyio.sleep(0.01)
    await anyio.to_thread.run_sync(reader.join)
    assert received == first + second
    key = loop._selector.get_key(ours.fileno())  # type: ignore[attr-defined]
    assert key.events == selectors.EVENT_READ  # the writer is gone, the reader stays
    theirs.sendall(b"answer")
    while not protocol.data:
        await anyio.sleep(0.01)
    assert protocol.data == b"answer"
    transport._read()  # woken with nothing to read: nothing happens
    assert not transport.is_closing()
    theirs.close()
    while not protocol.lost:
        await anyio.sleep(0.01)
    assert protocol.eof
    assert protocol.lost == [None]
    assert ours.fileno() == -1
    transport.write(b"late")  # after the end: dropped, as asyncio drops it
    transport.abort()  # twice is nothing


async def test_a_write_to_a_connection_the_peer_reset_loses_it_with_the_error() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = pair()
    protocol = Recorder()
    transport = tcp.SocketTransport(loop, ours, protocol)
    theirs.close()
    transport.write(b"to nobody")
    await anyio.sleep(0)
    (lost,) = protocol.lost
    assert isinstance(lost, OSError)
    assert lost.errno == errno.EPIPE


async def test_a_write_into_a_full_buffer_waits_then_fails_with_the_connection() -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = pair()
    with contextlib.suppress(BlockingIOError):
        while True:
            ours.send(b"x" * 65536)  # the kernel's buffer, full before the transport writes
    protocol = Recorder()
    transport = tcp.SocketTransport(loop, ours, protocol)
    transport.write(b"queued")
    assert bytes(transport._unsent) == b"queued"
    theirs.close()
    transport._write_more()  # the peer is gone: the rest cannot be sent
    await anyio.sleep(0)
    (lost,) = protocol.lost
    assert isinstance(lost, OSError)
    assert ours.fileno() == -1


def test_a_connect_settled_twice_keeps_the_first_outcome() -> None:
    # The socket became writable and the timer fired in the same turn of the loop.
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[None] = loop.create_future()
    tcp._settle(ready, None)
    tcp._settle(ready, TimeoutError())
    assert ready.result() is None
    loop.close()


async def test_a_reset_while_reading_loses_the_connection_with_the_error() -> None:
    loop = asyncio.get_running_loop()
    ours = socket.socket()
    listener = socket.create_server(("127.0.0.1", 0))
    ours.connect(listener.getsockname())
    theirs, _ = listener.accept()
    ours.setblocking(False)
    protocol = Recorder()
    tcp.SocketTransport(loop, ours, protocol)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    theirs.close()  # linger 0: a reset
    while not protocol.lost:
        await anyio.sleep(0.01)
    (lost,) = protocol.lost
    assert isinstance(lost, ConnectionResetError)
    listener.close()


async def test_a_protocol_that_fails_is_reported_and_its_connection_closed() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        ours, theirs = pair()
        protocol = Recorder()
        protocol.fail = True
        tcp.SocketTransport(loop, ours, protocol)
        theirs.sendall(b"bytes")
        while not protocol.lost:
            await anyio.sleep(0.01)
    finally:
        loop.set_exception_handler(None)
    (context,) = reported
    assert isinstance(context["exception"], RuntimeError)
    assert protocol.lost == [context["exception"]]
    assert ours.fileno() == -1
    theirs.close()
