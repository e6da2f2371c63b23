"""Byte transports and line framing: the wire under the JSON-RPC server.

A transport is a byte pipe in both directions: a socket stream (TCP or Unix) or two file
descriptors (``--stdio``). :class:`LineReader` cuts what it reads into lines, holding at most
``limit`` bytes of an unfinished line: a longer line is reported once as :class:`Overlong` and
skipped, without being kept, up to its newline. The limit can change between lines (the server
reads the first line of an unauthenticated connection with a small one).
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc


class Transport(Protocol):
    """A byte pipe in both directions (a socket, or stdin/stdout)."""

    async def read(self) -> bytes:
        """The next bytes; ``b""`` at the end."""
        ...

    async def write(self, data: bytes) -> None:
        """Write all of ``data``."""
        ...

    async def close(self) -> None:
        """Stop the connection now (the server has nothing more to say to this client)."""
        ...


class StreamTransport:
    """A transport over an anyio byte stream (a TCP or Unix socket connection)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream

    async def read(self) -> bytes:
        """The next bytes; ``b""`` when the peer closed or the connection broke."""
        try:
            return await self.stream.receive()
        except (
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            OSError,
        ):
            return b""

    async def write(self, data: bytes) -> None:
        """Send ``data``."""
        await self.stream.send(data)

    async def close(self) -> None:
        """Close the connection."""
        await self.stream.aclose()

    def hung_up(self) -> bool:
        """Whether the peer has closed its end for good, asked without reading anything.

        A Unix socket tells (``POLLHUP`` once both directions are shut); a TCP one does not
        until something is written to it (the peer's FIN reads as a half-close, which is also
        how a client says "no more requests" and waits for its answers).
        """
        sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if sock is None:
            return False
        poller = select.poll()
        try:
            poller.register(sock.fileno(), select.POLLHUP)
            events = poller.poll(0)
        except (OSError, ValueError):  # closed meanwhile
            return True
        return any(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, mask in events)


class FdTransport:
    """A transport over two file descriptors (``0`` and ``1`` for ``--stdio``).

    I wait for readiness with anyio (so reading never blocks the event loop and stays
    cancellable) and fall back to plain calls for descriptors the OS cannot poll (regular
    files: ``serve --stdio < requests.jsonl``). Writes go in pipe-buffer-sized pieces, so a
    write after readiness never blocks.
    """

    CHUNK = 4096

    def __init__(self, fd_in: int = 0, fd_out: int = 1) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self._poll_in = True
        self._poll_out = True

    async def read(self) -> bytes:
        """The next bytes; ``b""`` at end of input."""
        if self._poll_in:
            try:
                await anyio.wait_readable(self.fd_in)
            except OSError:
                self._poll_in = False
        return os.read(self.fd_in, 65536)

    async def write(self, data: bytes) -> None:
        """Write all of ``data``."""
        view = memoryview(data)
        while view:
            if self._poll_out:
                try:
                    await anyio.wait_writable(self.fd_out)
                except OSError:
                    self._poll_out = False
            view = view[os.write(self.fd_out, view[: self.CHUNK]) :]

    async def close(self) -> None:
        """Nothing to do: the descriptors belong to the process, which ends with its input."""


@dataclass(frozen=True, slots=True)
class Overlong:
    """Stands for a line longer than the reader's limit (its bytes were dropped).

    Attributes:
        limit: The limit it broke.
    """

    limit: int


class LineReader:
    """The lines of a transport, without their newline, holding a bounded amount of each.

    Args:
        transport: Where the bytes come from.
        limit: The longest line accepted, in bytes (changeable between lines).
    """

    def __init__(self, transport: Transport, limit: int) -> None:
        self.transport = transport
        self.limit = limit
        self._buffer = bytearray()
        self._searched = 0  # the buffer before this offset holds no newline
        self._skipping = False  # dropping an overlong line's bytes up to its newline
        self._ended = False

    async def next(self) -> bytes | Overlong | None:
        """The next line, :class:`Overlong` for a line over the limit, ``None`` at the end."""
        while True:
            line = self.held()
            if line is not None:
                return line
            if len(self._buffer) > self.limit:
                # Over the limit and no newline yet: drop what I hold and keep dropping up to
                # the newline, so that a client cannot make me hold more than the limit.
                self._skipping = True
                self._buffer.clear()
                self._searched = 0
            if self._ended:
                break
            chunk = await self.transport.read()
            if not chunk:
                self._ended = True
            self._buffer += chunk
        if self._skipping:
            self._skipping = False
            return Overlong(self.limit)
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            return line
        return None

    def held(self) -> bytes | Overlong | None:
        """The next whole line already read, as :meth:`next` gives it, without reading more.

        ``None`` when no whole line is held (the bytes after the last newline wait for more).
        """
        end = self._buffer.find(b"\n", self._searched)
        if end < 0:
            self._searched = len(self._buffer)
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._searched = 0
        if self._skipping or len(line) > self.limit:
            self._skipping = False
            return Overlong(self.limit)
        return line
