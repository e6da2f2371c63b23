"""The JSON-RPC server: the stdio, Unix socket and TCP listeners over a :class:`SessionHub`.

Theory of operation. The server accepts connections and runs each as a
:class:`~orchestrator._rpc.connection.Connection` (which holds the per-client bounds). Nothing a
client does can end the server or another client's connection: every request runs inside a
handler that turns any exception into an error answer, and every connection inside one that
logs an unexpected exception and closes only that connection. At most ``max_connections`` run at
once; one more gets a ``-32005`` line and is closed.

Stopping (:meth:`RpcServer.stop`) answers before it closes: every request still running is
cancelled (the runtime settles it, nothing partial applied) and answered ``-32003`` with
``data.kind`` ``shutdown``, the answers are sent (within the drop timeout, for clients that do
not read), and only then are the connections closed. Cancelling the server's task group
instead would end the requests with no answer at all. The answer is the hub's
(``shutdown_error``): a cluster front end owns no work, so its answer says that the work it
forwarded goes on in the cluster.

Who may connect (D30, see :mod:`orchestrator._rpc.access`): a Unix socket is created with mode
0600, so only its owner can connect; a TCP listener binds to loopback only and every connection
must first present the server's token; stdio belongs to the process that started the server.
"""

from __future__ import annotations

import errno
import math
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from orchestrator._rpc import access
from orchestrator._rpc.connection import Connection, Limits, send_quietly
from orchestrator._rpc.errors import LIMIT, RpcError, one_line
from orchestrator._rpc.hub import RpcHub, RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Dispatcher, encode, failure
from orchestrator._rpc.transport import FdTransport, StreamTransport, Transport

__all__ = ("Limits", "RpcServer", "RuntimeOptions", "SessionHub")
"""The server's names; the hub's are re-exported because callers build both together."""


def _stderr(text: str) -> None:
    print(f"orchestrator serve: {text}", file=sys.stderr, flush=True)


class RpcServer:
    """Serves a hub's methods over connections.

    Args:
        hub: The sessions and their methods.
        limits: The bounds (default: :class:`Limits`).
        log: Where a connection's unexpected failure is reported (default: stderr).

    Attributes:
        connections: Connections open now.
        peak_queued_bytes: The most output that ever waited for one client (for monitoring;
            never more than ``limits.max_queued_bytes`` plus one message).
    """

    def __init__(
        self,
        hub: RpcHub,
        *,
        limits: Limits | None = None,
        log: Callable[[str], None] = _stderr,
    ) -> None:
        self.hub = hub
        self.limits = limits or Limits()
        hub.fair.total = self.limits.max_heavy
        self.dispatcher = Dispatcher(hub.methods(), max_batch=self.limits.max_batch)
        self.log = log
        self.connections = 0
        self.peak_queued_bytes = 0
        # Every running connection with the scope that ends it, oldest first.
        self._running: dict[Connection, anyio.CancelScope] = {}
        self._stopping = False
        self._all_closed: anyio.Event | None = None  # made by stop() while connections run

    async def stop(self) -> None:
        """Answer every running request with the shutdown error, then close every connection.

        A request still running is cancelled and answered with the hub's
        :meth:`~SessionHub.shutdown_error` (``-32003``; one process: nothing partial is
        applied, ``data`` ``{"kind": "shutdown", "applied": false}``); a connection closes
        once its answers are sent, or after ``limits.drop_timeout`` when its client does not
        read them. New connections are closed at once. Returns when every connection is
        closed; the listeners keep running until their task is cancelled.
        """
        self._stopping = True
        # First, so that no session starts what was queued behind the work cancelled here (a
        # prompt asked for during a compaction would start as the compaction ends).
        self.hub.abort_all()
        self.dispatcher.stop(self.hub.shutdown_error())
        for connection in self._running:
            connection.stop()
        if self._running:
            self._all_closed = anyio.Event()
            await self._all_closed.wait()

    async def serve_connection(
        self, transport: Transport, *, token: str | None = None, topics: set[str] | None = None
    ) -> None:
        """Answer one connection until it ends and its last request is answered.

        Never raises for anything the client does; an unexpected failure is logged and ends
        this connection only.

        Args:
            transport: The connection's bytes.
            token: When set, the first line must present it (``auth``).
            topics: Session ids whose events the connection receives from the start.
        """
        connection = Connection(self.hub, self.dispatcher, self.limits, transport, token, self.log)
        connection.peer.topics.update(topics or ())
        if self._stopping:
            connection.stop()  # nothing is read; it closes at once
        self.connections += 1
        scope = self._running[connection] = anyio.CancelScope()
        try:
            with scope:
                await connection.run()
        except Exception as exc:  # noqa: BLE001 - one connection's failure must not spread
            self.log(f"connection closed after an internal error: {_describe(exc)}")
        finally:
            del self._running[connection]
            self.connections -= 1
            self.peak_queued_bytes = max(self.peak_queued_bytes, connection.peak_queued_bytes)
            if not self._running and self._all_closed is not None:
                self._all_closed.set()

    def _leaving(self) -> int:
        """Connections ended to make room that have not finished closing yet."""
        return sum(scope.cancel_called for scope in self._running.values())

    def _make_room(self) -> bool:
        """End the oldest connection that has not presented the token yet; ``False``: none.

        Connections waiting to authenticate count towards the bound like any other: any local
        user could hold all of them, reopening each as it timed out, and the owner's own
        connection was then refused for good. A new connection takes the place of the oldest
        one still waiting instead; an owner's authenticates in a moment and is not waiting
        long enough to be the oldest.
        """
        for connection, scope in self._running.items():
            if not connection.proven and not scope.cancel_called:
                scope.cancel()
                return True
        return False

    async def _accept(self, stream: anyio.abc.SocketStream, token: str | None) -> None:
        async with stream:
            full = self.connections - self._leaving() >= self.limits.max_connections
            if full and not self._make_room():
                message = f"Too many connections (at most {self.limits.max_connections})"
                line = encode(failure(None, RpcError(LIMIT, message))) + "\n"
                with anyio.move_on_after(self.limits.drop_timeout):
                    await send_quietly(StreamTransport(stream), line.encode())
                return
            await self.serve_connection(StreamTransport(stream), token=token)

    async def serve_listener(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], *, token: str | None = None
    ) -> None:
        """Serve every connection ``listener`` accepts, until cancelled.

        Out of file descriptors (each open session holds two, each connection one), ``accept``
        fails with ``EMFILE``: that used to end the whole server with a traceback, every
        client disconnected. The connection waits in the kernel's backlog instead, and the
        server tries again a moment later, saying so on stderr once per shortage.
        """
        async with listener, anyio.create_task_group() as connections:
            said = -math.inf  # when the last shortage was said
            while True:
                try:
                    # The connections live in this task group, not the listener's: a failed
                    # accept ends `serve`, never the connections it started.
                    await listener.serve(
                        lambda stream: self._accept(stream, token), task_group=connections
                    )
                    return
                except (OSError, anyio.BrokenResourceError, BaseExceptionGroup) as exc:
                    reason = _shortage(exc)
                    if reason is None:
                        raise
                    if anyio.current_time() - said > 1.0:  # a new shortage, not the same one
                        _stderr(f"cannot accept a connection now: {reason}; trying again")
                    said = anyio.current_time()
                await anyio.sleep(0.1)

    async def serve_tcp(
        self,
        port: int = 0,
        *,
        token: str,
        host: str = "127.0.0.1",
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on loopback ``host:port``; every connection must first send ``token``.

        Args:
            port: The port (``0``: any free port, reported through ``task_status``).
            token: The token a connection must present.
            host: A loopback address.
            task_status: Receives the port once listening.

        Raises:
            ValueError: ``host`` is not a loopback address, or ``token`` is empty.
            OSError: the port cannot be bound (in use, not permitted).
        """
        if not token:
            raise ValueError("a TCP listener needs a token")
        listener = await anyio.create_tcp_listener(
            local_host=access.loopback_host(host), local_port=port
        )
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await self.serve_listener(listener, token=token)

    async def serve_unix(
        self, path: Path, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on a Unix socket at ``path`` with mode 0600; removed again when stopped.

        Raises:
            OSError: ``path`` is in use by a live server, is not a socket, or cannot be made.
        """
        listener = await access.unix_listener(path)
        identity = access.file_identity(path)
        try:
            task_status.started()
            await self.serve_listener(listener)
        finally:
            access.remove_socket(path, identity)

    async def serve_stdio(self, fd_in: int = 0, fd_out: int = 1) -> None:
        """Serve one connection on stdin/stdout until stdin ends.

        The sessions open when it starts (those named on the command line) count as opened by
        this client: it receives their events.
        """
        await self.serve_connection(FdTransport(fd_in, fd_out), topics=self.hub.session_ids())


def _describe(exc: BaseException) -> str:
    """An exception as one line; for a task group's, its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return one_line(f"{type(exc).__name__}: {exc}")


_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _shortage(exc: BaseException) -> str | None:
    """Why ``exc`` says the process ran short of descriptors (or memory), else ``None``.

    An exception group counts when every exception in it is such a shortage.
    """
    if isinstance(exc, BaseExceptionGroup):
        reasons = [_shortage(inner) for inner in exc.exceptions]
        return reasons[0] if reasons and all(reasons) else None
    for error in (exc, exc.__cause__):
        if isinstance(error, OSError) and error.errno in _SHORTAGES:
            return error.strerror or str(error)
    return None
