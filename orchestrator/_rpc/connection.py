"""One JSON-RPC connection: its reader, its requests, its bounded output queue, its first line.

Theory of operation. A connection is a reader that cuts the input into lines and starts one task
per request, and a writer that sends the answers and event notifications from one queue, in the
order they were posted (a client sees ``compaction_update`` before the compress result). Each
request runs in its own task, so a ``session.compress`` can arrive while the same client's
``session.prompt`` is still waiting: the runtime stops the turn, compacts, and both requests get
their answers. When the client stops sending, the requests already running still finish; the
connection ends after the last. When the server stops (:meth:`Connection.stop`), I stop reading,
the dispatcher ends the running requests with an error answer each, the requests read but not
started get the same answer, and the connection closes once those are sent.

Every resource a client can make me hold is bounded (:class:`Limits`):

- a line holds at most ``max_line_bytes`` (a longer one is answered ``-32700`` and skipped
  without being kept);
- a batch holds at most ``max_batch`` requests, and at most ``max_in_flight`` requests run at
  once (a batch counts as the requests it holds): further lines wait (those already read are
  answered with the shutdown error if the server stops);
- a heavy request (``fair.py``: work that grows with a session) runs in a worker thread, one per
  connection at a time and ``max_heavy`` in the server, and starts only once nothing waits for
  the client; its answer is streamed (:class:`Streamed`: encoded a piece at a time as I write
  it, one piece ahead, never whole) or is a small one kept with its session, and is not counted
  against ``max_queued_bytes``; an encoding that fails once its line began cannot be answered
  any more: it is logged and the connection closed; a client that is gone (a failed write, a
  drop, or a Unix socket it hung up, looked at every ``HANGUP_POLL`` seconds while it has heavy
  work) cancels its heavy requests that have not started;
- while more than half of ``max_queued_bytes`` of output waits for the client, I stop reading
  its requests (a client that does not read stops being served); if events or running requests
  still push the waiting output over ``max_queued_bytes``, the queue is discarded, the client
  gets one ``-32005`` line (within ``drop_timeout``) and the connection is closed. When the
  deadline cuts a line the client was not taking (a large answer), the ``-32005`` line gets a
  drop timeout of its own, after a newline that ends the cut line.

The first line decides whether the connection goes on (``first_line.py``): an HTTP request is
refused, and on a connection that must authenticate (TCP, D30) the line, read with a small limit
and a deadline, must be an ``auth`` request with the server's token.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from orchestrator._rpc.errors import (
    INTERNAL_ERROR,
    LIMIT,
    PARSE_ERROR,
    RpcError,
    error_for,
    one_line,
)
from orchestrator._rpc.first_line import HTTP_REFUSAL, authenticate, is_http_request
from orchestrator._rpc.hub import RpcHub
from orchestrator._rpc.protocol import (
    MAX_BATCH,
    Dispatcher,
    Part,
    Peer,
    decode,
    encode,
    error_line,
    failure,
)
from orchestrator._rpc.transport import LineReader, Overlong, Transport
from orchestrator._rpc.work import Encoded, Streamed

MiB = 1024 * 1024
WRITE_BYTES = 64 * 1024
"""Most bytes of waiting lines joined into one write (a longer line goes alone)."""
AHEAD = 1
"""Pieces of a streamed answer made ahead of the one being written (encoding and writing
overlap; the answer's memory is the pieces in hand, a few MiB, see ``work.PIECE_BYTES``)."""
HANGUP_POLL = 0.25
"""Seconds between two looks at whether a client with heavy work waiting hung up."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The bounds of a server (see the module comment for what happens when one is hit).

    Attributes:
        max_line_bytes: Longest request line.
        max_batch: Most requests in one batch.
        max_in_flight: Most requests of one connection running at once.
        max_queued_bytes: Most output waiting for one client before it is dropped.
        max_connections: Most connections at once (stdio is one).
        auth_line_bytes: Longest first line of a connection that must authenticate.
        auth_timeout: Seconds a connection that must authenticate has to send its first line.
        drop_timeout: Seconds given to a dropped client to take its last line before it is
            closed regardless.
        max_heavy: Most heavy requests (work that grows with a session: ``session.open``,
            ``session.context``, ``session.tree``) running at once in the server; each
            connection runs one at a time (``fair.py``).
    """

    max_line_bytes: int = 4 * MiB
    max_batch: int = MAX_BATCH
    max_in_flight: int = 64
    max_queued_bytes: int = 16 * MiB
    max_connections: int = 32
    auth_line_bytes: int = 4096
    auth_timeout: float = 10.0
    drop_timeout: float = 5.0
    max_heavy: int = 2


async def send_quietly(transport: Transport, data: bytes) -> bool:
    """Write ``data``; ``False`` when the client is gone."""
    try:
        await transport.write(data)
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return False
    return True


class Connection:
    """One client: its reader, its request tasks, its output queue and writer.

    Args:
        hub: Where its events come from.
        dispatcher: What answers its requests.
        limits: Its bounds.
        transport: Its bytes.
        token: When set, the first line must present it.
        log: Where a streamed answer that failed midway is reported.

    Attributes:
        peer: The connection as the handlers see it (its subscribed sessions).
        peak_queued_bytes: The most output that waited for this client at once.
    """

    def __init__(
        self,
        hub: RpcHub,
        dispatcher: Dispatcher,
        limits: Limits,
        transport: Transport,
        token: str | None,
        log: Callable[[str], None],
    ) -> None:
        self.hub = hub
        self.log = log
        self.dispatcher = dispatcher
        self.limits = limits
        self.transport = transport
        self.token = token
        self.proven = token is None  # it presented the token (or none is asked for)
        self.peer = Peer()
        self.peer.room = self._drained
        self.peer.takes_encoded = True
        limit = self.limits.auth_line_bytes if token is not None else self.limits.max_line_bytes
        self.reader = LineReader(transport, limit)
        self.waiting: deque[bytes | memoryview | Streamed] = deque()
        self.waiting_bytes = 0
        self.heavy_bytes = 0  # of the bytes waiting, those of heavy answers (not bounded)
        self.writing_bytes = 0
        self.streaming = False  # a streamed answer is being written
        self.in_flight = 0
        self.reading_done = False
        self.stopping = False  # the server is shutting down (stop)
        self.final = False  # the queue holds the last thing this client will be sent
        self.gone = False  # nothing more can be written to the client
        self.open_line = False  # what was written last ends inside a line (a large answer's)
        self.deadline = math.inf  # for the writes of a client being closed
        self.read_scope = anyio.CancelScope()
        self.watch_scope = anyio.CancelScope()
        self.write_scope: anyio.CancelScope | None = None
        self.peak_queued_bytes = 0
        self._changed: anyio.Event | None = None  # made when someone waits (most notes find none)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _next_change(self) -> None:
        """Wait for the next :meth:`_notify`."""
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    async def run(self) -> None:
        """Serve the client until it ends and its last request is answered."""
        stop = self.hub.listen_lines(self.post, self.peer)
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._write_all)
            outer.start_soon(self._watch)
            try:
                async with anyio.create_task_group() as requests:
                    with self.read_scope:
                        await self._read(requests)
                    if self.stopping and self.proven:
                        self._refuse_held(requests)
            finally:
                stop()
                self.reading_done = True
                self._notify()

    async def _write_all(self) -> None:
        try:
            await self._write()
        finally:
            self.watch_scope.cancel()

    async def _watch(self) -> None:
        """Notice a client that hung up while its heavy requests wait or run (``fair.py``).

        Its reader may not be reading (64 requests in flight), and its answers may be minutes
        away: without a look at the socket, the server would build them all for nobody. Only a
        transport that can tell without reading (a Unix socket) is watched.
        """
        hung_up = getattr(self.transport, "hung_up", None)
        with self.watch_scope:
            while hung_up is not None and not self.peer.left:
                await anyio.sleep(HANGUP_POLL)
                if (self.peer.waiting or self.peer.stops) and hung_up():
                    self.peer.leave()

    def stop(self) -> None:
        """Read no more; close once the running requests are answered (server shutdown).

        The dispatcher ends the running requests (:meth:`Dispatcher.stop`); their answers are
        sent within the drop timeout, so a client that does not read cannot hold the server
        open. The requests read but not started (waiting behind ``max_in_flight``) are
        answered with the same error; lines the client sent that I have not read yet get no
        answer.
        """
        self.stopping = True
        self.read_scope.cancel()
        self.deadline = min(self.deadline, anyio.current_time() + self.limits.drop_timeout)
        if self.write_scope is not None:
            self.write_scope.deadline = self.deadline

    # -- output ------------------------------------------------------------------------------

    def post(self, text: str) -> None:
        """Queue one line for the client; never blocks, never raises."""
        self.post_parts([(text + "\n").encode("utf-8")])

    def post_parts(self, parts: list[Part], *, heavy: bool = False) -> None:
        """Queue one line given in pieces (the last ends with its newline); never raises.

        The pieces are queued as they are: a small answer kept with its session, shared by the
        answers to every request for it, is never copied into one line, and a streamed one
        (:class:`Streamed`) is encoded only when the writer reaches it. A ``heavy`` answer
        (one that heavy work built, see ``fair.py``) is not counted against
        ``max_queued_bytes``: that work started only once nothing waited for the client, so one
        such answer at most waits at a time (a batch's, all of them), and the bound stays for
        the rest.
        """
        if self.final or self.gone:
            _close_streams(parts)
            return
        size = sum(len(part) for part in parts if isinstance(part, bytes))
        # One message may always wait, however large (it exists in memory anyway); more than
        # the bound waiting means the client is not reading.
        bounded = self.waiting_bytes - self.heavy_bytes + (0 if heavy else size)
        if self.waiting and bounded > self.limits.max_queued_bytes:
            message = (
                f"Client not reading: over {self.limits.max_queued_bytes} bytes of output "
                "waiting; closing the connection"
            )
            _close_streams(parts)
            self._close_with(error_line(LIMIT, message))
            return
        if heavy:
            # Marked as memoryviews: see _next_output.
            self.waiting.extend(p if isinstance(p, Streamed) else memoryview(p) for p in parts)
            self.heavy_bytes += size
        else:
            self.waiting.extend(parts)
        self.waiting_bytes += size
        self.peak_queued_bytes = max(self.peak_queued_bytes, self.waiting_bytes)
        self._notify()

    def _discard(self) -> None:
        """Empty the queue; the streamed answers in it are never encoded."""
        _close_streams(self.waiting)
        self.waiting.clear()

    def _close_with(self, data: bytes) -> None:
        """Send ``data`` as the last thing (within the drop timeout), then close."""
        self.final = True
        self.peer.leave()
        self._discard()
        self.waiting.append(data)
        self.waiting_bytes, self.heavy_bytes = len(data), 0
        self.read_scope.cancel()
        self.deadline = anyio.current_time() + self.limits.drop_timeout
        if self.write_scope is not None:
            self.write_scope.deadline = self.deadline
        self._notify()

    async def _write(self) -> None:
        while await self._output():
            data = self._next_output()
            if isinstance(data, Streamed):
                sent = await self._stream(data)
            else:
                self.waiting_bytes -= len(data)
                if self.final and self.open_line:
                    # The last line, after a large answer's pieces were cut short: end that
                    # line first, so the client can read this one.
                    data = b"\n" + data
                sent = await self._send(data)
                self.open_line = not data.endswith(b"\n") if sent else self.open_line
            if sent:
                continue
            if self.final and self.waiting and not self.gone:
                # The deadline cut a write (a large answer the client does not read) while
                # the -32005 line waited behind it: that line gets its own drop timeout, after
                # a newline that ends whatever part of the cut line went out.
                self.deadline = anyio.current_time() + self.limits.drop_timeout
                line = self.waiting.popleft()
                assert not isinstance(line, Streamed)  # _close_with queued one line
                await self._send(b"\n" + line)
            self.gone = True
            break
        if self.final or self.gone:
            # After a failed write, the last line of a dropped client, or its deadline: nothing
            # more is sent, and I close at once. The requests still running finish; their
            # answers are discarded; its heavy requests not started never start.
            self.gone = True
            self.peer.leave()
            self._discard()
            self.waiting_bytes = self.heavy_bytes = 0
            with anyio.CancelScope(shield=True):
                await self.transport.close()

    async def _stream(self, streamed: Streamed) -> bool:
        """Write a streamed answer as it is encoded; ``False`` when cut, as :meth:`_send`.

        A thread encodes the next piece while this one is written (:data:`AHEAD`). The
        answer's envelope goes out with its first piece. When the encoding fails before that
        piece, nothing of the answer is out: an error answer (``-32603``) takes its place and
        the connection goes on. When it fails later, the line cannot be completed (its first
        bytes are out): the failure is logged and the connection closed, the client's only
        sign that the answer is lost.
        """
        self.streaming = True
        send, receive = anyio.create_memory_object_stream[bytes](AHEAD)
        failed: list[Exception] = []
        written = 0
        try:
            # The producer ends (cancelled, or done) before its receiver closes: it never
            # finds the stream broken.
            with receive:
                async with anyio.create_task_group() as group:
                    group.start_soon(_produce, streamed, send, failed)
                    async for piece in receive:
                        data = piece if written else streamed.head + piece
                        if self.final or not await self._send(data):
                            group.cancel_scope.cancel()
                            return False
                        written += len(piece)
                        self.open_line = True
        finally:
            send.close()  # the producer's, should it never have started
            streamed.close()
            self.streaming = False
            self._notify()
        if not written:  # nothing of the answer is out: an error answer instead
            return await self._send(self._unencodable(streamed, failed))
        if not failed:
            return self.final or await self._send(streamed.tail)
        self.gone = True
        self.log(
            f"the answer to request {encode(streamed.request_id)} failed after {written} bytes "
            f"of its result were sent ({type(failed[0]).__name__}: "
            f"{one_line(str(failed[0]))}); closing the connection, as the line cannot be ended"
        )
        return False

    def _unencodable(self, streamed: Streamed, failed: list[Exception]) -> bytes:
        """The error answer sent for a streamed result that failed before its first piece."""
        cause = failed[0] if failed else ValueError("the result had no text")
        reason = f"{type(cause).__name__}: {one_line(str(cause))}"
        self.log(
            f"the answer to request {encode(streamed.request_id)} failed before any of it was "
            f"sent ({reason}); answered {INTERNAL_ERROR}"
        )
        error = RpcError(INTERNAL_ERROR, f"Internal error: result not encodable: {reason}")
        return encode(failure(streamed.request_id, error)).encode("utf-8")

    async def _send(self, data: bytes) -> bool:
        """Write ``data`` before the deadline; ``False`` when it was cut or the client is gone."""
        self.writing_bytes = len(data)
        sent = False  # stays so when the deadline cancels the write (send_quietly never returns)
        with anyio.CancelScope(deadline=self.deadline) as scope:
            self.write_scope = scope
            sent = await send_quietly(self.transport, data)
        self.write_scope = None
        self.writing_bytes = 0
        self._notify()
        if not sent and not scope.cancelled_caught:
            self.gone = True  # the client went away: nothing more can be written
        return sent and not scope.cancelled_caught

    def _next_output(self) -> bytes | Streamed:
        """The lines waiting, up to :data:`WRITE_BYTES` (at least one), or the streamed answer.

        One write for the lines that came while the last was sent: with a thousand sessions
        compacting, answers and events of many requests wait together (issue 9).
        """
        first = self.waiting.popleft()
        if isinstance(first, Streamed):
            return first
        lines = [first]
        size = len(first)
        while self.waiting and size < WRITE_BYTES:
            line = self.waiting[0]
            if isinstance(line, Streamed) or size + len(line) > WRITE_BYTES:
                break
            lines.append(line)
            self.waiting.popleft()
            size += len(line)
        # A heavy answer's pieces are queued as memoryviews: that is how I know which of the
        # bytes sent were not counted against the bound.
        self.heavy_bytes -= sum(len(line) for line in lines if isinstance(line, memoryview))
        return first if len(lines) == 1 and isinstance(first, bytes) else b"".join(lines)

    async def _output(self) -> bool:
        """Wait for output to send; ``False`` when there will be no more."""
        while not self.waiting:
            if self.final or (self.reading_done and self.in_flight == 0):
                return False
            await self._next_change()
        return True

    # -- input -------------------------------------------------------------------------------

    async def _read(self, requests: anyio.abc.TaskGroup) -> None:
        if not await self._first_line(requests):
            return
        while True:
            await self._room()
            line = await self.reader.next()
            if line is None:
                return
            self._take(line, requests)

    async def _first_line(self, requests: anyio.abc.TaskGroup) -> bool:
        """Handle the first line (HTTP refusal, authentication); ``False``: stop reading."""
        line: bytes | Overlong | None = None
        if self.token is None:
            line = await self.reader.next()
        else:
            with anyio.move_on_after(self.limits.auth_timeout):
                line = await self.reader.next()
        if is_http_request(line):
            self._close_with(HTTP_REFUSAL)
            return False
        if self.token is None:
            if line is not None:
                self._take(line, requests)
            return line is not None
        return self._authenticate(self.token, line)

    def _authenticate(self, token: str, line: bytes | Overlong | None) -> bool:
        proven, reply = authenticate(token, line)
        if not proven:
            self._close_with(reply)
            return False
        self.reader.limit = self.limits.max_line_bytes
        self.proven = True
        self.post_parts([reply])
        return True

    def _take(self, line: bytes | Overlong, requests: anyio.abc.TaskGroup) -> None:
        """Start answering one line."""
        if isinstance(line, Overlong):
            error = RpcError(PARSE_ERROR, f"Parse error: line over {line.limit} bytes")
            self.post(encode(failure(None, error)))
            return
        if not line.strip():
            return
        try:
            message = decode(line)
        except RpcError as error:
            self.post(encode(failure(None, error)))
            return
        # A batch counts as the requests it holds (a refused one, over max_batch, as one).
        weight = len(message) if isinstance(message, list) and message else 1
        weight = weight if weight <= self.limits.max_batch else 1
        self.in_flight += weight
        requests.start_soon(self._answer, message, weight)

    def _refuse_held(self, requests: anyio.abc.TaskGroup) -> None:
        """Answer the whole lines read but not taken, the server stopping.

        The dispatcher is stopped: each request among them is answered with its error at once,
        without running (a notification gets nothing, a line that is not JSON its parse error).
        What the reader holds is bounded (a line and a read), so no bound on requests is kept.
        """
        while (line := self.reader.held()) is not None:
            self._take(line, requests)

    async def _drained(self) -> None:
        """Wait until nothing waits for the client (before heavy work starts, ``fair.py``)."""
        while self.waiting or self.writing_bytes > 0 or self.streaming:
            await self._next_change()

    async def _room(self) -> None:
        """Wait until another line may be read: few enough requests running, output drained."""
        high_water = self.limits.max_queued_bytes // 2
        while (
            self.in_flight >= self.limits.max_in_flight
            or self.waiting_bytes + self.writing_bytes > high_water
        ):
            await self._next_change()

    async def _answer(self, message: Any, weight: int) -> None:
        try:
            answer = await self.dispatcher.handle(message, self.peer)
            heavy = _holds_encoded(answer)
            reply = Dispatcher.encode_parts(answer)
        except Exception as exc:  # noqa: BLE001 - the dispatcher catches per request; a bug here
            heavy, reply = False, [encode(failure(None, error_for(exc))).encode("utf-8")]
        try:
            if reply is not None:
                self.post_parts([*reply, b"\n"], heavy=heavy)
        finally:
            self.in_flight -= weight
            self._notify()


def _holds_encoded(answer: Any) -> bool:
    """Whether an answer (or a batch's) holds a result heavy work encoded or streams."""
    answers = answer if isinstance(answer, list) else [answer]
    return any(
        isinstance(a, dict) and isinstance(a.get("result"), Encoded | Streamed) for a in answers
    )


async def _produce(
    streamed: Streamed, send: MemoryObjectSendStream[bytes], failed: list[Exception]
) -> None:
    """Hand ``streamed``'s pieces to the writer as they are made; a failure goes in ``failed``."""
    with send:
        while True:
            try:
                piece = await streamed.next()
            except Exception as exc:  # noqa: BLE001 - reported by the writer, which closes
                failed.append(exc)
                return
            if piece is None:
                return
            await send.send(piece)


def _close_streams(parts: Iterable[object]) -> None:
    """Close the streamed answers among ``parts`` (discarded before they were written)."""
    for part in parts:
        if isinstance(part, Streamed):
            part.close()
