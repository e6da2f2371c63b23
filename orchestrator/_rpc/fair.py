"""Heavy requests: work that grows with a session, run off the event loop and shared fairly.

Theory of operation. Opening a session, its context and its tree cost time and memory in
proportion to the session (two seconds and a hundred megabytes of JSON for 200,000 entries).
Run on the event loop, one client's 64 ``session.context`` requests stopped every other
client's answers for minutes (issue 35). Such work goes through :meth:`Fairness.run`, which
waits for three things, in this order (always the same order, so no two requests can wait for
each other):

1. the connection's turn (:attr:`Peer.turn`): one heavy request per connection runs at a
   time, the others wait in the order they came; before it starts, the client must have taken
   the answers it was sent (:attr:`Peer.room`), so a client asking for sixty-four contexts gets
   them one after the other;
2. the session's lock: work on one session is serialized (a session is not thread-safe);
3. a place among the ``total`` heavy jobs of the server (a capacity limiter).

Then the work runs in a worker thread. The event loop keeps running: Python switches threads
every few milliseconds, so a ``session.list`` is answered meanwhile. Work in a thread must only
read what the loop does not change: it gets a snapshot taken on the loop (a copy of the path,
the context of the active leaf, which is immutable), never the live session while a turn could
append to it. The one exception is opening a session: the session does not exist for anyone
else until the thread returns it.

Answers stream (:meth:`Fairness.stream`). The answer of ``session.context`` or
``session.tree`` grows with the session (100 MB of JSON for 200,000 entries): it is never made
whole. In the connection's turn and under the session's lock, the request only takes its
snapshot and returns the generator of its pieces, nothing of it run yet
(:class:`~orchestrator._rpc.work.Streamed`). When the connection's writer reaches the answer,
it runs the generator a step at a time (:meth:`Fairness.step`: a worker thread, one of the
``total`` places, about a mebibyte of JSON per step), one piece made ahead of the one being
written: the answer holds a few pieces of memory whatever its size, and a client that reads
slowly holds no place while it does not read. Since the client's room includes the answer being
written, its next heavy request starts once the last byte of this one is sent. An answer of at
most ``answers.KEPT_BYTES`` (8 MiB) made from the runtime's context is kept with the session
until its next entry (the pieces are collected while they stay under the bound), so sixty-four
requests for a small context encode it once; a larger answer is encoded again for each request:
CPU time instead of memory. What a stream's work holds between its steps lives until its last
piece is written: little for a context (the report's lists of references), but a tree's own
index and nodes (about 100 MiB at 200,000 entries, built in its first step). It is bounded per
connection (one stream at a time), not server-wide: the places bound the steps running, not the
streams open.

A client that leaves (:meth:`Peer.leave`: its connection broke, or it was dropped for not
reading) cancels its heavy requests that have not started, and asks the running one to stop
(:class:`~orchestrator._rpc.protocol.Stop`, which the work checks between its steps: a thread
cannot be cancelled from outside). A cancelled request's answer goes nowhere. An answer being
streamed stops at its next piece: the writer stops asking for pieces and closes the generator.

Processes instead of threads: the work needs the session, and copying 200,000 entries to
another process costs what building their context costs. Threads keep the loop answering as
long as no single step of the work holds the interpreter for long; the encoder (``work.py``) cuts
its work into steps of a few milliseconds for that reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

import anyio

from orchestrator._rpc.errors import CANCELLED, RpcError
from orchestrator._rpc.protocol import Peer
from orchestrator._rpc.work import Encoded, Pieces, Stop, Streamed

T = TypeVar("T")

TOTAL = 2
"""Heavy jobs running at once in the server, by default (the machine it was measured on had two
cores; more threads than cores only share the same interpreter)."""
LEFT = "Cancelled: the client left before the request started"


class Fairness:
    """The bounds of the server's heavy work (see the module comment).

    Args:
        total: Most heavy jobs running at once, server-wide.

    Attributes:
        started: How many heavy jobs have started (for tests and monitoring).
        running: How many run now.
        peak: The most that ran at once.
    """

    def __init__(self, total: int = TOTAL) -> None:
        self.limiter = anyio.CapacityLimiter(total)
        self.started = 0
        self.running = 0
        self.peak = 0
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @property
    def total(self) -> int:
        """Most heavy jobs running at once."""
        return int(self.limiter.total_tokens)

    @total.setter
    def total(self, value: int) -> None:
        self.limiter.total_tokens = value

    async def run(
        self, peer: Peer | None, key: str, prepare: Callable[[], Callable[[Stop], T]]
    ) -> T:
        """Run heavy work in a worker thread once the connection, ``key`` and the server allow.

        Args:
            peer: The connection asking (``None``: in process, bound by the total only).
            key: What the work touches (a session id or path): work on one key is serialized.
            prepare: Called on the event loop once the work may start (so what it takes from
                the session is current and held by one request at a time); returns the work,
                called in a thread with a stop flag it should check between steps.

        Returns:
            What the work returned.

        Raises:
            RpcError: ``-32003`` when the client left before the work started.
            Cancelled: the client left while it ran (from ``work``'s checks).
        """
        stop = Stop()
        async with self._turn(peer, key) as admitted, self.limiter:
            admitted.stops.add(stop)
            try:
                work = prepare()
                self.started += 1
                return await self._thread(lambda: work(stop))
            finally:
                admitted.stops.discard(stop)

    async def stream(
        self, peer: Peer | None, key: str, prepare: Callable[[], Encoded | Pieces]
    ) -> Encoded | Streamed:
        """A heavy answer, prepared in the connection's turn and encoded as it is written.

        ``prepare`` runs on the loop as :meth:`run`'s does, and returns the answer kept for
        the session, or the generator of its pieces (nothing of it run yet). The pieces are
        made when the writer reaches the answer, each a step among the server's ``total``
        heavy jobs (:meth:`step`), so a client that reads slowly holds no place while it is
        not reading.

        Raises:
            RpcError: ``-32003`` when the client left before it was prepared.
        """
        async with self._turn(peer, key):
            prepared = prepare()
            self.started += 1
        return prepared if isinstance(prepared, Encoded) else Streamed(prepared, self.step)

    async def step(self, pull: Callable[[], T]) -> T:
        """Run one step of a streamed answer in a worker thread, as one of the heavy jobs."""
        async with self.limiter:
            return await self._thread(pull)

    @asynccontextmanager
    async def _turn(self, peer: Peer | None, key: str) -> AsyncIterator[Peer]:
        """Wait for the connection's turn, its room and ``key``'s lock (see the module comment).

        Raises:
            RpcError: ``-32003`` when the client left first.
        """
        peer = peer or Peer()
        with anyio.CancelScope() as waiting:
            peer.waiting.add(waiting)
            if peer.left:
                waiting.cancel()
            try:
                async with peer.turn:
                    await peer.room()
                    with self._lock(key) as lock:
                        async with lock:
                            peer.waiting.discard(waiting)
                            yield peer
                            return
            finally:
                peer.waiting.discard(waiting)
        raise RpcError(CANCELLED, LEFT, {"kind": "cancelled", "applied": False})

    async def _thread(self, work: Callable[[], T]) -> T:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            # Not abandoned when cancelled (the server stopping): the locks stay held until
            # the thread is done with the session, and its result is returned all the same
            # (anyio shields the wait), so nothing it made (an opened session) is lost.
            return await anyio.to_thread.run_sync(work)
        finally:
            self.running -= 1

    @contextmanager
    def _lock(self, key: str) -> Iterator[anyio.Lock]:
        """The lock of ``key``, kept while someone holds or waits for it."""
        lock, users = self._locks.get(key) or (anyio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            yield lock
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
