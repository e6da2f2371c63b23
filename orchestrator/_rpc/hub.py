"""The JSON-RPC methods over the sessions of a host, written once for both hosts.

Theory of operation. An :class:`RpcHub` provides the method table (``session.open``,
``session.compress``, ``session.tree``, ..., and the host's further methods, such as the
``summary.*`` methods of :mod:`~orchestrator._rpc.hosted` for sessions pi owns) for a
:class:`~orchestrator._rpc.protocol.Dispatcher`, over a
:class:`~orchestrator._rpc.host.SessionHost`: this process's sessions
(:class:`SessionHub`, :class:`~orchestrator._rpc.local_host.LocalHost`) or the cluster's
(:class:`~orchestrator._rpc.cluster_hub.ClusterHub`). The hub checks each method's parameters,
asks the host, and shapes the answer, so a client cannot tell which host it talks to.

Every session's events are forwarded to the hub's listeners as ``session.event``
notifications. A listener registered with a :class:`~orchestrator._rpc.protocol.Peer` (a
connection) receives only the events of the sessions that peer opened or forked (its
``topics``); a listener without one (an embedding application in the same process) receives
every event. Several connections may follow one session; when it closes, each gets a last
``session_closed`` event and no more. A listener that raises is skipped, never allowed to break
the session that emitted the event.

``session.compress`` and ``session.tree.navigate`` are operations
(:mod:`~orchestrator._rpc.operations`): each has an id the caller gets at once (``"wait":
false``) or in its answer and errors, and ``session.operation`` returns how it stands, or its
outcome, from the hub's book (or the host's ``recall``: the cluster's workflow update).

Which requests may run together on one session (one manual compaction at a time, nothing but a
fork during a navigation, no close while anything runs: ``-32001``) is the session machine's
decision (``machines/session.toml``), taken by each host where its sessions run.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from orchestrator._core.errors import OutcomeUnknownError
from orchestrator._process.preload import load_on_start
from orchestrator._rpc.errors import INVALID_PARAMS, RpcError, error_for
from orchestrator._rpc.fair import Fairness
from orchestrator._rpc.host import SessionHost, compress_answer, navigation_options
from orchestrator._rpc.local_host import NO_AGENT, SHUTTING_DOWN, LocalHost, RuntimeOptions, Slot
from orchestrator._rpc.operations import (
    OPERATION_ID,
    REFUSED_BEFORE_START,
    RUNNING,
    Background,
    Operation,
    OperationBook,
    asked_of,
    new_id,
    requested_id,
    unknown,
    with_id,
)
from orchestrator._rpc.protocol import Method, Params, Peer, encode, notification
from orchestrator._runtime.session import AgentSession

__all__ = [
    "EVENT_METHOD",
    "NO_AGENT",
    "SESSION_CLOSED",
    "SHUTTING_DOWN",
    "RpcHub",
    "RuntimeOptions",
    "SessionHub",
]

EVENT_METHOD = "session.event"
SESSION_CLOSED = "session_closed"
"""The last event of a session, sent to every connection receiving its events when it closes."""

Listener = Callable[[dict[str, Any]], None]
Work = Callable[[str], Awaitable[dict[str, Any]]]
"""An operation's work, given its id: the method's answer."""
LineListener = Callable[[str], None]
"""Receives each notification already encoded as one line of JSON (no newline)."""


class RpcHub:
    """The ``session.*`` methods over a host, and the listeners of its sessions' events.

    Args:
        host: Where the sessions run.
    """

    def __init__(self, host: SessionHost) -> None:
        load_on_start()  # not in the middle of a request, where a descriptor shortage fails it
        self.host = host
        # (listener, peer, whether it takes the encoded line)
        self._listeners: list[tuple[Callable[[Any], None], Peer | None, bool]] = []
        self.fair = Fairness()
        """The bounds of the work that grows with a session (open, context, tree)."""
        self.book = OperationBook()
        """The operations asked for here and their outcomes (``session.operation``)."""
        self.background = Background()
        """The operations asked for with ``"wait": false``, running."""
        host.attach(self)

    # -- listeners -----------------------------------------------------------------------------

    def listen(self, listener: Listener, peer: Peer | None = None) -> Callable[[], None]:
        """Receive forwarded events as ``session.event`` notifications; returns unlisten.

        Args:
            listener: Called with each notification; it must not block.
            peer: The connection listening: it then receives only the events of the sessions in
                its ``topics``. ``None``: every event (an in-process listener).
        """
        return self._listen(listener, peer, encoded=False)

    def listen_lines(self, listener: LineListener, peer: Peer | None = None) -> Callable[[], None]:
        """Like :meth:`listen`, each notification encoded (:func:`encode`) as one line.

        The line is encoded once per event, however many connections receive it.
        """
        return self._listen(listener, peer, encoded=True)

    def _listen(
        self, listener: Callable[[Any], None], peer: Peer | None, *, encoded: bool
    ) -> Callable[[], None]:
        entry = (listener, peer, encoded)
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry)

    def listened(self, session_id: str) -> bool:
        """Whether any listener receives the events of this session."""
        return any(peer is None or session_id in peer.topics for _, peer, _ in self._listeners)

    def tell(self, session_id: str, event: Mapping[str, Any]) -> None:
        """Send one event of ``session_id`` to the listeners that follow it."""
        message: dict[str, Any] | None = None  # built for the first listener that follows it
        line: str | None = None
        for listener, peer, encoded in list(self._listeners):
            if peer is not None and session_id not in peer.topics:
                continue
            if message is None:
                message = notification(EVENT_METHOD, {"session_id": session_id, "event": event})
            try:
                if not encoded:
                    listener(message)
                    continue
                if line is None:
                    line = encode(message)
                listener(line)
            except Exception as exc:  # noqa: BLE001 - one bad listener must not break a session
                print(f"orchestrator: event listener failed: {exc!r}", file=sys.stderr)

    def ended(self, session_id: str) -> None:
        """Tell everyone receiving a closed session's events that it closed; send no more.

        Every connection that opened the session follows it, not only the one that closes
        it: without a word, the others would wait for events that never come, and learn only
        at their next request that the session is gone.
        """
        if self.listened(session_id):
            self.tell(session_id, {"type": SESSION_CLOSED})
        for _, peer, _ in self._listeners:
            if peer is not None:
                peer.topics.discard(session_id)

    # -- the host's lifetime -------------------------------------------------------------------

    def session_ids(self) -> set[str]:
        """The ids of the open sessions."""
        return self.host.session_ids()

    def shutdown_error(self) -> RpcError:
        """The answer to each request still running when the server stops (``-32003``)."""
        return self.host.shutdown_error()

    def abort_all(self) -> None:
        """Stop the work running in every session (shutdown)."""
        self.host.abort_all()
        self.background.cancel_all()

    def close_all(self) -> None:
        """Close (or forget) every session."""
        self.host.close_all()

    # -- methods -------------------------------------------------------------------------------

    def methods(self) -> dict[str, Method]:
        """The method table for a :class:`Dispatcher`."""
        sid = frozenset({"session_id"})
        operation = frozenset({OPERATION_ID, "wait"})
        return {
            "session.open": Method(
                handler=self._open, params=frozenset({"path", "create"}), heavy=True
            ),
            "session.list": Method(handler=self._list),
            "session.close": Method(handler=self._close, params=sid),
            "session.compress": Method(handler=self._compress, params=sid | operation | {"focus"}),
            "session.tree": Method(handler=self._tree, params=sid, heavy=True),
            "session.tree.navigate": Method(
                handler=self._navigate,
                params=sid
                | operation
                | {"target_id", "summarize", "focus", "replace_instructions", "label"},
            ),
            "session.operation": Method(handler=self._operation, params=sid | {OPERATION_ID}),
            "session.fork": Method(handler=self._fork, params=sid | {"entry_id", "path"}),
            "session.prompt": Method(handler=self._prompt, params=sid | {"text"}),
            "session.abort": Method(handler=self._abort, params=sid),
            "session.context": Method(handler=self._context, params=sid, heavy=True),
            **self.host.more_methods(),
        }

    @staticmethod
    def _follow(peer: Peer | None, session_id: str) -> None:
        if peer is not None:
            peer.topics.add(session_id)

    async def _open(self, p: Params) -> dict[str, Any]:
        opened = await self.host.open(p.text("path"), create=p.flag("create"), peer=p.peer)
        self._follow(p.peer, opened.described.session_id)
        return {
            **opened.described.as_json(),
            "problems": opened.problems,
            "settled": opened.settled,
        }

    async def _list(self, p: Params) -> dict[str, Any]:
        return {"sessions": [d.as_json() for d in await self.host.sessions()]}

    async def _close(self, p: Params) -> dict[str, Any]:
        await self.host.close(p.text("session_id"))
        return {"closed": True}

    async def _compress(self, p: Params) -> dict[str, Any]:
        def checked() -> Work:
            session_id, focus = p.text("session_id"), p.optional_text("focus")

            async def work(operation_id: str) -> dict[str, Any]:
                done = await self.host.compress(session_id, focus, operation_id=operation_id)
                return compress_answer(done)

            return work

        return await self._operate(p, checked)

    async def _tree(self, p: Params) -> Any:
        return await self.host.tree(p.text("session_id"), p.peer)

    async def _context(self, p: Params) -> Any:
        return await self.host.context(p.text("session_id"), p.peer)

    async def _navigate(self, p: Params) -> dict[str, Any]:
        def checked() -> Work:
            session_id, options = p.text("session_id"), navigation_options(p)
            return lambda operation_id: self.host.navigate(
                session_id, options, operation_id=operation_id
            )

        return await self._operate(p, checked)

    # -- operations (operations.py) ------------------------------------------------------------

    async def _operate(self, p: Params, checked: Callable[[], Work]) -> dict[str, Any]:
        """Run an operation: its answer, or ``{operationId, state}`` at once with ``wait: false``.

        The id (the client's ``operationId``, else a new one) is in the answer and in every
        error's ``data``, a bad parameter's too (``checked`` reads the method's parameters and
        returns its work). The same id with the same parameters is the same operation again.

        Raises:
            RpcError: The operation's error, with ``data.operationId``.
        """
        operation_id = new_id()
        try:
            operation_id = requested_id(p) or operation_id
            wait = p.flag("wait", default=True)
            work = checked()
            session_id = p.text("session_id")
            operation = self.book.find(session_id, operation_id)
            again = operation is not None and (operation.method, operation.asked) == (
                p.method,
                asked_of(p),
            )
            if operation is None or not again or _refused_before_start(operation):
                operation = self.book.begin(session_id, operation_id, p.method, asked_of(p))
                if not wait:
                    ran = operation
                    self.background.start(lambda: self._quietly(ran, work))
                    return operation.as_json()
                await self._run(operation, work)
        except RpcError as error:
            raise with_id(error, operation_id) from None
        if not wait:
            return operation.as_json()
        await operation.wait()  # asked again while it runs: its outcome, when it comes
        if operation.error is not None:
            raise operation.error
        answer: dict[str, Any] = operation.result
        return answer

    async def _run(self, operation: Operation, work: Work) -> None:
        """Run ``work`` and record how it ended in the book.

        Raises:
            RpcError: The server stopping cancelled it: its shutdown error.
        """
        operation_id = operation.operation_id
        try:
            result = await work(operation_id)
        except anyio.get_cancelled_exc_class():
            # Answered as the dispatcher would, with the id: the cancellation ends here.
            error = with_id(self.host.shutdown_error(), operation_id)
            self._ended(operation, error=error)
            raise error from None
        except Exception as exc:  # noqa: BLE001 - recorded, then answered as the error it is
            operation.unsure = isinstance(exc, OutcomeUnknownError)
            self._ended(operation, error=with_id(error_for(exc, operation.method), operation_id))
        else:
            self._ended(operation, result={**result, OPERATION_ID: operation_id})

    async def _quietly(self, operation: Operation, work: Work) -> None:
        """:meth:`_run` in the background: how it ended is in the book, raised to no one."""
        try:
            await self._run(operation, work)
        except RpcError:
            pass

    def _ended(
        self, operation: Operation, result: Any = None, error: RpcError | None = None
    ) -> None:
        operation.end(result, error)
        self.book.ended(operation)

    async def _operation(self, p: Params) -> dict[str, Any]:
        """``session.operation``: how an operation of the session stands, or its outcome.

        Raises:
            RpcError: No such operation (``-32010``), or a missing or malformed id (``-32602``).
        """
        session_id = p.text("session_id")
        operation_id = requested_id(p)
        if operation_id is None:
            raise RpcError(INVALID_PARAMS, f"{p.method}: missing parameter '{OPERATION_ID}'")
        operation = self.book.find(session_id, operation_id)
        if operation is None or operation.unsure:
            # The cluster may know what this server does not (another server asked, or the
            # answer was lost with the connection to Temporal).
            method = None if operation is None else operation.method
            try:
                recalled = await self.host.recall(session_id, operation_id, method)
            except Exception as exc:  # noqa: BLE001 - answered as the error it is, with the id
                raise with_id(error_for(exc, p.method), operation_id) from None
            if recalled is not None:
                return recalled
        if operation is None:
            raise unknown(p.method, session_id, operation_id)
        return operation.as_json()

    async def _fork(self, p: Params) -> dict[str, Any]:
        session_id, entry_id = p.text("session_id"), p.text("entry_id")
        done = await self.host.fork(session_id, entry_id, p.optional_text("path"))
        if done.described is None:
            return {
                "session_id": None,
                "path": None,
                "editorText": done.editor_text,
                "cancelled": True,
            }
        self._follow(p.peer, done.described.session_id)
        return {**done.described.as_json(), "editorText": done.editor_text, "cancelled": False}

    async def _prompt(self, p: Params) -> dict[str, Any]:
        session_id, text = p.text("session_id"), p.text("text")
        done = await self.host.prompt(session_id, text)
        reply = None if done.reply is None else dict(done.reply)
        return {"state": done.state, "reply": reply, "queued": done.queued}

    async def _abort(self, p: Params) -> dict[str, Any]:
        return {"aborted": await self.host.abort(p.text("session_id"))}


def _refused_before_start(operation: Operation) -> bool:
    """Whether an operation ended refused before its work started (its id is free again)."""
    error = operation.error
    return operation.state != RUNNING and error is not None and error.code in REFUSED_BEFORE_START


class SessionHub(RpcHub):
    """The JSON-RPC methods over the sessions of this process.

    Args:
        options: How runtimes are built.
    """

    host: LocalHost

    def __init__(self, options: RuntimeOptions | None = None) -> None:
        super().__init__(LocalHost(options))

    @property
    def options(self) -> RuntimeOptions:
        """How runtimes are built."""
        return self.host.options

    @property
    def _slots(self) -> dict[str, Slot]:
        return self.host.slots

    def add(self, runtime: AgentSession, path: str | None = None) -> str:
        """Register an open runtime; returns its session id (``-32602`` when open already)."""
        return self.host.add(runtime, path)

    def runtime(self, session_id: str) -> AgentSession:
        """The runtime of an open session (``RpcError -32602`` when unknown)."""
        return self.host.slot(session_id).runtime

    def open(self, path: str, *, create: bool = False) -> Slot:
        """Open a session file (or return it when already open)."""
        return self.host.open_now(path, create=create)
