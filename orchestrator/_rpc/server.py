"""The JSON-RPC server: open sessions, their methods, and the stdio and TCP transports.

Theory of operation. A :class:`SessionHub` holds the open sessions (one
:class:`~orchestrator._runtime.session.AgentSession` each, keyed by the header's session id) and
provides the method table (``session.open``, ``session.compress``, ``session.tree``, ...)
for a :class:`~orchestrator._rpc.protocol.Dispatcher`. Every session's events are forwarded to the
hub's listeners as ``session.event`` notifications; each connection is one listener.

A connection reads newline-delimited JSON and runs each request in its own task, so a
``session.compress`` can arrive while the same client's ``session.prompt`` is still waiting:
the runtime stops the turn, compacts, and both requests get their answers. Responses and
notifications go through one queue per connection, so an event emitted before a response is
written before it (a client sees ``compaction_update`` before the compress result). When the
client stops sending, the requests already running still finish and are answered; the
connection ends after the last one.

The session-level rules that the runtime does not enforce itself live here: one compaction at
a time per session, no navigation, compaction or prompt while a navigation's branch summary
runs, no close while anything runs (``-32001``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from orchestrator._rpc.protocol import (
    BUSY,
    INVALID_PARAMS,
    MAX_LINE_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Dispatcher,
    FdTransport,
    Method,
    Params,
    RpcError,
    StreamTransport,
    Transport,
    encode,
    failure,
    notification,
    read_lines,
)
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import Event
from orchestrator._runtime.navigate import BUSY as NAVIGATION_BUSY
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.summarize import SummaryRoutes
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.reports import context_report, tree_rows

EVENT_METHOD = "session.event"
QUIET_EVENTS = frozenset({"transition"})
"""Event types not forwarded: every machine step is one, and the journal already has them."""
NO_AGENT = "session.prompt: no agent configured (start the server with --model)"

Listener = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeOptions:
    """How the hub builds the runtime of each session it opens or forks.

    Attributes:
        agent_factory: Makes the agent of a new session (``None``: no ``session.prompt``).
        summarizer: Summary routes (``None``: the runtime's offline default).
        settings: Runtime settings (``None``: the runtime's defaults).
        root: Relative paths resolve here; when set, paths outside it are refused.
        runtime_kwargs: Further keyword arguments for ``AgentSession`` (tests pass a clock).
    """

    agent_factory: Callable[[], Agent] | None = None
    summarizer: SummaryRoutes | None = None
    settings: RuntimeSettings | None = None
    root: Path | None = None
    runtime_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments for a new :class:`AgentSession`."""
        agent = self.agent_factory() if self.agent_factory is not None else None
        return {
            "agent": agent,
            "summarizer": self.summarizer,
            "settings": self.settings,
            **self.runtime_kwargs,
        }


@dataclass(slots=True)
class _Slot:
    """One open session and what the hub knows is running in it."""

    runtime: AgentSession
    path: str
    unsubscribe: Callable[[], None]
    navigating: bool = False
    compacting: bool = False

    def describe(self) -> dict[str, Any]:
        session = self.runtime.session
        return {
            "session_id": session.session_id,
            "path": self.path,
            "entries": len(session.tree),
            "leafId": session.leaf_id,
            "state": self.runtime.state,
            "busy": self.runtime.is_busy or self.navigating,
        }


class SessionHub:
    """The open sessions and the RPC methods over them.

    Args:
        options: How runtimes are built.
    """

    def __init__(self, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        self._slots: dict[str, _Slot] = {}
        self._listeners: list[Listener] = []

    # -- registry ------------------------------------------------------------------------------

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Receive every forwarded event as a ``session.event`` notification; returns unlisten."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def add(self, runtime: AgentSession, path: str | None = None) -> str:
        """Register an open runtime; returns its session id.

        Raises:
            RpcError: another open session has the same id (``-32602``).
        """
        session_id = runtime.session.session_id
        if session_id in self._slots:
            raise RpcError(
                INVALID_PARAMS,
                f"Session {session_id} is already open from {self._slots[session_id].path}",
            )

        def forward(event: Event) -> None:
            if event.type not in QUIET_EVENTS:
                message = notification(
                    EVENT_METHOD, {"session_id": session_id, "event": event.as_json()}
                )
                for listener in list(self._listeners):
                    listener(message)

        self._slots[session_id] = _Slot(
            runtime, path or runtime.session.store.location, runtime.events.subscribe(forward)
        )
        return session_id

    def runtime(self, session_id: str) -> AgentSession:
        """The runtime of an open session (``RpcError -32602`` when unknown)."""
        return self._slot(session_id).runtime

    def _slot(self, session_id: str) -> _Slot:
        slot = self._slots.get(session_id)
        if slot is None:
            raise RpcError(INVALID_PARAMS, f"Unknown session: {session_id}")
        return slot

    def open(self, path: str, *, create: bool = False) -> _Slot:
        """Open a session file (or return it when already open).

        Raises:
            RpcError: the path is outside the served directory or the file does not exist.
            SessionError: the file is not a session.
        """
        resolved = self._resolve(path)
        for slot in self._slots.values():
            if slot.path == str(resolved):
                return slot
        if not create and not resolved.is_file():
            raise RpcError(INVALID_PARAMS, f"{path}: no such session file")
        runtime = AgentSession.open(resolved, **self.options.arguments())
        try:
            return self._slots[self.add(runtime, str(resolved))]
        except RpcError:
            runtime.close()
            raise

    def _resolve(self, path: str) -> Path:
        root = self.options.root
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = (root or Path.cwd()) / candidate
        candidate = candidate.resolve()
        if root is not None and not candidate.is_relative_to(root.resolve()):
            raise RpcError(INVALID_PARAMS, f"{path}: outside the served directory")
        return candidate

    def abort_all(self) -> None:
        """Stop the work running in every session (shutdown)."""
        for slot in self._slots.values():
            slot.runtime.abort()
            slot.runtime.abort_branch_summary()

    def close_all(self) -> None:
        """Close every session (releases the file locks)."""
        for session_id in list(self._slots):
            self._close(session_id)

    def _close(self, session_id: str) -> None:
        slot = self._slots.pop(session_id)
        slot.unsubscribe()
        slot.runtime.close()

    # -- methods -------------------------------------------------------------------------------

    def methods(self) -> dict[str, Method]:
        """The method table for a :class:`Dispatcher`."""
        sid = frozenset({"session_id"})
        return {
            "session.open": Method(handler=self._m_open, params=frozenset({"path", "create"})),
            "session.list": Method(handler=self._m_list),
            "session.close": Method(handler=self._m_close, params=sid),
            "session.compress": Method(handler=self._m_compress, params=sid | {"focus"}),
            "session.tree": Method(handler=self._m_tree, params=sid),
            "session.tree.navigate": Method(
                handler=self._m_navigate,
                params=sid | {"target_id", "summarize", "focus", "replace_instructions", "label"},
            ),
            "session.fork": Method(handler=self._m_fork, params=sid | {"entry_id", "path"}),
            "session.prompt": Method(handler=self._m_prompt, params=sid | {"text"}),
            "session.abort": Method(handler=self._m_abort, params=sid),
            "session.context": Method(handler=self._m_context, params=sid),
        }

    async def _m_open(self, p: Params) -> dict[str, Any]:
        slot = self.open(p.text("path"), create=p.flag("create"))
        runtime = slot.runtime
        return {
            **slot.describe(),
            "problems": [
                {"line": x.line, "code": x.code, "message": x.message}
                for x in runtime.session.problems
            ],
            "settled": [
                {"id": s.operation_id, "kind": s.kind, "dest": s.dest} for s in runtime.settlements
            ],
        }

    async def _m_list(self, p: Params) -> dict[str, Any]:
        return {"sessions": [slot.describe() for slot in self._slots.values()]}

    async def _m_close(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        if slot.runtime.is_busy or slot.navigating or slot.compacting:
            raise RpcError(BUSY, "Session is busy; abort it or wait before closing")
        self._close(slot.runtime.session.session_id)
        return {"closed": True}

    async def _m_compress(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        focus = p.optional_text("focus")
        if slot.compacting:
            raise RpcError(BUSY, "A compaction is already running in this session")
        if slot.navigating:
            raise RpcError(BUSY, "Cannot compact while a navigation is running")
        slot.compacting = True
        try:
            outcome = await slot.runtime.compact(focus)
        finally:
            slot.compacting = False
        if outcome.status != "committed" or outcome.entry is None or outcome.result is None:
            return {"compacted": False, "reason": outcome.reason or "Nothing to compact"}
        result = outcome.result
        return {
            "compacted": True,
            "entryId": outcome.entry["id"],
            "summary": result.summary,
            "tokensBefore": result.tokens_before,
            "firstKeptEntryId": result.first_kept_entry_id,
            "shortSummary": result.short_summary,
        }

    async def _m_tree(self, p: Params) -> dict[str, Any]:
        session = self._slot(p.text("session_id")).runtime.session
        return {
            "sessionId": session.session_id,
            "name": session.tree.session_name(),
            "leafId": session.leaf_id,
            "nodes": tree_rows(session),
        }

    async def _m_navigate(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        target = p.text("target_id")
        summarize, focus = p.flag("summarize"), p.optional_text("focus")
        replace, label = p.flag("replace_instructions"), p.optional_text("label")
        if slot.runtime.is_busy or slot.compacting:
            raise RpcError(BUSY, NAVIGATION_BUSY)
        if slot.navigating:
            raise RpcError(BUSY, "A navigation is already running in this session")
        slot.navigating = True
        try:
            result = await slot.runtime.navigate(
                target,
                summarize=summarize,
                instructions=focus,
                replace_instructions=replace,
                label=label,
            )
        finally:
            slot.navigating = False
        entry = result.summary_entry
        return {**result.as_json(), "shortSummary": entry.get("shortSummary") if entry else None}

    async def _m_fork(self, p: Params) -> dict[str, Any]:
        runtime = self._slot(p.text("session_id")).runtime
        entry_id = p.text("entry_id")
        path = p.optional_text("path")
        result = await runtime.fork(entry_id, self._resolve(path) if path else None)
        if result.cancelled or result.session is None:
            return {
                "session_id": None,
                "path": None,
                "editorText": result.editor_text,
                "cancelled": True,
            }
        new = result.session
        journal = (
            Journal.open(new.store.location)
            if isinstance(new.store, JsonlStore)
            else Journal.in_memory()
        )
        forked = AgentSession(new, journal=journal, **self.options.arguments())
        slot = self._slots[self.add(forked)]
        return {**slot.describe(), "editorText": result.editor_text, "cancelled": False}

    async def _m_prompt(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        text = p.text("text")
        if slot.runtime.agent is None:
            raise RpcError(METHOD_NOT_FOUND, NO_AGENT)
        if slot.navigating:
            raise RpcError(BUSY, "Cannot prompt while a navigation is running")
        result = await slot.runtime.prompt(text)
        return {"state": result.state, "reply": result.reply, "queued": result.queued}

    async def _m_abort(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        was_busy = slot.runtime.is_busy or slot.navigating
        slot.runtime.abort()
        slot.runtime.abort_branch_summary()
        return {"aborted": was_busy}

    async def _m_context(self, p: Params) -> dict[str, Any]:
        session = self._slot(p.text("session_id")).runtime.session
        return context_report(session, session.leaf_id)


class RpcServer:
    """Serves a hub's methods over connections.

    Args:
        hub: The sessions and their methods.
        max_line_bytes: A longer request line is answered with a parse error and skipped.
    """

    def __init__(self, hub: SessionHub, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.hub = hub
        self.dispatcher = Dispatcher(hub.methods())
        self.max_line_bytes = max_line_bytes

    async def serve_connection(self, transport: Transport) -> None:
        """Answer one connection until it ends and its last request is answered."""
        send, receive = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)

        def post(text: str) -> None:
            # Unbounded and drained until every request is answered: this never blocks or fails.
            send.send_nowait(text + "\n")

        async def answer(line: bytes | None) -> None:
            if line is None:
                error = RpcError(PARSE_ERROR, f"Parse error: line over {self.max_line_bytes} bytes")
                post(encode(failure(None, error)))
                return
            reply = await self.dispatcher.handle_text(line)
            if reply is not None:
                post(reply)

        stop = self.hub.listen(lambda message: post(encode(message)))
        async with anyio.create_task_group() as outer:
            outer.start_soon(_write_all, transport, receive)
            try:
                async with anyio.create_task_group() as requests:
                    async for line in read_lines(transport, self.max_line_bytes):
                        requests.start_soon(answer, line)
            finally:
                stop()
                send.close()

    async def serve_tcp(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (``0``: any free port, reported through ``task_status``)."""
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
        async with listener:
            task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
            await listener.serve(self._tcp_connection)

    async def _tcp_connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await self.serve_connection(StreamTransport(stream))

    async def serve_stdio(self, fd_in: int = 0, fd_out: int = 1) -> None:
        """Serve one connection on stdin/stdout until stdin ends."""
        await self.serve_connection(FdTransport(fd_in, fd_out))


async def _write_all(transport: Transport, receive: MemoryObjectReceiveStream[str]) -> None:
    # After a failed write the peer is gone: keep draining so that nobody waits on us.
    alive = True
    async with receive:
        async for text in receive:
            if alive:
                try:
                    await transport.write(text.encode("utf-8"))
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    alive = False
