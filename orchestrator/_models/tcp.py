"""A plain TCP connection on asyncio's selector event loop, without asyncio's own transport.

Theory of operation: with a thousand sessions compacting at once, the remote summary route
opens two thousand connections in the same moment (a session's two summaries go out together),
and asyncio's ``loop.create_connection`` spent more of the event loop's CPU on each than the
rest of the call: the address look-up's coroutine, a timeout context, ``sock_connect``'s future
and callbacks, then a transport whose constructor asks the kernel for both addresses (two
system calls), registers itself in a weak dictionary and schedules three callbacks before the
connection is handed over. The HTTP client asks two things of a transport: write the request,
and abort. So for a plain ``http`` URL whose host is an address (no name to look up, no TLS),
on asyncio's selector loop, :func:`connect` opens the socket itself and :class:`SocketTransport`
reads and writes it through the loop's ``add_reader`` and ``add_writer``. Measured on 2,000
connections opened at once to the local provider (AMD EPYC, Python 3.11): about 40 µs of the
loop's CPU each against about 110 µs.

It behaves as asyncio's transport does where the client can tell: ``TCP_NODELAY`` set, the
connection's failure the :class:`OSError` asyncio raises, worded as asyncio words it, bytes the
kernel does not take at once kept and sent in order when the socket can take them,
``connection_lost`` called soon after the connection ends (not from inside a call), a protocol
that raises reported to the loop's exception handler and its connection closed. It does not
flush unsent bytes before closing (the client only aborts), keep a half-closed connection open,
or pause reading or writing (the client reads every answer whole, bounded, and writes one
request at a time).
"""

from __future__ import annotations

import asyncio
import socket

READ_SIZE = 256 * 1024
"""Bytes asked of the kernel per read (asyncio's transports ask as many)."""


async def connect(
    loop: asyncio.AbstractEventLoop, family: int, host: str, port: int, timeout: float
) -> socket.socket:
    """A socket connected to ``host`` (an address of ``family``) and ``port``, non-blocking.

    Raises:
        TimeoutError: Not connected within ``timeout`` seconds.
        OSError: The connection failed, as asyncio's ``sock_connect`` raises it: the kernel's
            error when ``connect`` fails at once, else ``Connect call failed ('127.0.0.1', 9)``.
    """
    # asyncio's address: a four-tuple for IPv6, as its look-up gives one.
    address = (host, port) if family == socket.AF_INET else (host, port, 0, 0)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's transports
        try:
            sock.connect(address)
        except (BlockingIOError, InterruptedError):  # under way (EINPROGRESS, or EINTR)
            if not _connected(sock):
                await _writable(loop, sock, timeout)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, f"Connect call failed {address}") from None
    except BaseException:  # cancelled too: the socket is ours to close
        sock.close()
        raise
    return sock


def _connected(sock: socket.socket) -> bool:
    """Whether a socket said to be connecting is connected already.

    To an address of this machine (a summary server beside the sessions), Linux completes the
    handshake inside ``connect`` though it answers ``EINPROGRESS``: asking for the peer (one
    system call) saves waiting a turn of the loop for writability (a future, a timer and two
    changes of the selector, about 20 µs). Elsewhere the peer is not known yet (``ENOTCONN``).
    """
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: float) -> None:
    """Wait until the connecting socket is writable (connected or failed), or time out."""
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, _settle, ready, None)
    timer = loop.call_later(timeout, _settle, ready, TimeoutError())
    try:
        await ready
    finally:
        timer.cancel()
        loop.remove_writer(fd)


def _settle(ready: asyncio.Future[None], error: BaseException | None) -> None:
    if not ready.done():
        if error is None:
            ready.set_result(None)
        else:
            ready.set_exception(error)


class SocketTransport(asyncio.Transport):
    """A connected socket, its protocol fed by the loop's reader callback.

    Args:
        loop: The running selector event loop.
        sock: A connected, non-blocking socket; the transport closes it.
        protocol: Told ``connection_made`` at once, then as asyncio tells its protocols.
    """

    __slots__ = ("_closing", "_fd", "_loop", "_protocol", "_sock", "_unsent")  # as _Connection's

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._unsent = memoryview(b"")  # what the kernel did not take yet
        self._closing = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read)

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:  # asyncio drops a lost connection's writes too
            return
        if self._unsent:  # still sending: after the rest, in order
            self._unsent = memoryview(bytes(self._unsent) + bytes(data))
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lose(exc)
            return
        if sent < len(data):
            self._unsent = memoryview(bytes(data))[sent:]
            self._loop.add_writer(self._fd, self._write_more)

    def abort(self) -> None:
        self._lose(None)

    def _write_more(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        self._unsent = self._unsent[sent:]
        if not self._unsent:
            self._loop.remove_writer(self._fd)

    def _read(self) -> None:
        try:
            data = self._sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):  # woken for nothing
            return
        except OSError as exc:  # reset by the server
            self._lose(exc)
            return
        try:
            if data:
                self._protocol.data_received(data)
            else:  # the server's end: the connection closes (no half-closed connection kept)
                self._protocol.eof_received()
                self._lose(None)
        except Exception as exc:  # a bug in the protocol: reported, as asyncio does
            self._loop.call_exception_handler(
                {"message": "the protocol failed", "exception": exc, "protocol": self._protocol}
            )
            self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._unsent = memoryview(b"")
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._loop.call_soon(self._gone, exc)

    def _gone(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()
            # As asyncio's transports drop theirs: the protocol holds its transport, and the
            # pair would otherwise be a cycle left for the garbage collector.
            del self._protocol
