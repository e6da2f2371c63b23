"""The open sessions of the JSON-RPC server and their methods.

Theory of operation. A :class:`SessionHub` holds the open sessions (one
:class:`~orchestrator._runtime.session.AgentSession` each, keyed by the header's session id) and
provides the method table (``session.open``, ``session.compress``, ``session.tree``, ...,
and the ``summary.*`` methods of :mod:`~orchestrator._rpc.hosted` for sessions pi owns) for a
:class:`~orchestrator._rpc.protocol.Dispatcher`. Every session's events are forwarded to the
hub's listeners as ``session.event`` notifications. A listener registered with a
:class:`~orchestrator._rpc.protocol.Peer` (a connection) receives only the events of the sessions
that peer opened or forked (its ``topics``); a listener without one (an embedding application in
the same process) receives every event. Several connections may follow one session; when it
closes, each gets a last ``session_closed`` event and no more. A listener that raises is
skipped, never allowed to break the session that emitted the event.

The session-level rules that the runtime does not enforce itself live here: one compaction at
a time per session, no navigation, compaction or prompt while a navigation's branch summary
runs, no close while anything runs (``-32001``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from orchestrator._core.errors import SessionError
from orchestrator._process.gc_policy import POLICY
from orchestrator._process.preload import load_on_start
from orchestrator._rpc.answers import AnswerCache, prepare_context, prepare_tree
from orchestrator._rpc.fair import Fairness
from orchestrator._rpc.hosted import HostedMethods, HostedOptions
from orchestrator._rpc.protocol import (
    BUSY,
    CANCELLED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Method,
    Params,
    Peer,
    RpcError,
    encode,
    notification,
    one_line,
    out_of_files,
)
from orchestrator._rpc.work import Encoded, Stop
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import Event
from orchestrator._runtime.navigate import BUSY as NAVIGATION_BUSY
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.summarize import SummaryRoutes
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.files import (
    refuse_folder_name,
    require_session_file,
    side_file_name,
)
from orchestrator._store.journal import Journal
from orchestrator._store.jsonl import JsonlStore
from orchestrator._telemetry.tracing import LifecycleTracer

EVENT_METHOD = "session.event"
QUIET_EVENTS = frozenset({"transition"})
"""Event types not forwarded: every machine step is one, and the journal already has them."""
SESSION_CLOSED = "session_closed"
"""The last event of a session, sent to every connection receiving its events when it closes."""
NO_AGENT = "session.prompt: no agent configured (start the server with --model)"
SERVER_OWNER = "orchestrator serve"
"""How the server names itself in the lock of the sessions it owns (D27)."""
SHUTTING_DOWN = "Server shutting down: the operation was cancelled; the session file is unchanged"
"""The message of the answer to each request still running when the server stops."""

Listener = Callable[[dict[str, Any]], None]
LineListener = Callable[[str], None]
"""Receives each notification already encoded as one line of JSON (no newline)."""


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
    answers: AnswerCache = field(init=False)

    def __post_init__(self) -> None:
        self.answers = AnswerCache(self.runtime)

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


def navigation_options(p: Params) -> tuple[str, bool, str | None, bool, str | None]:
    """``session.tree.navigate``'s parameters: target, summarize, focus, replace, label.

    Raises:
        RpcError: Instructions without a summary, or a replacement without instructions
            (``-32602``): they would be dropped without a word, as the command line refuses
            ``--focus`` without ``--summarize``.
    """
    target = p.text("target_id")
    summarize, focus = p.flag("summarize"), p.optional_text("focus")
    replace, label = p.flag("replace_instructions"), p.optional_text("label")
    if (focus is not None or replace) and not summarize:
        raise RpcError(
            INVALID_PARAMS,
            "session.tree.navigate: 'focus' and 'replace_instructions' shape the branch "
            'summary; add "summarize": true',
        )
    if replace and focus is None:
        raise RpcError(
            INVALID_PARAMS,
            "session.tree.navigate: 'replace_instructions' needs 'focus' (the prompt to use "
            "instead)",
        )
    return target, summarize, focus, replace, label


def _raise_if_committed(runtime: AgentSession, before: str | None) -> None:
    """Say so when a request cancelled mid-way had already committed its entry.

    The commit itself takes no cancel, but what follows it (the context taking the entry, the
    ``session_compact`` hook) does: a server stopping then answered "the session file is
    unchanged" for a compaction or branch summary that was in the file. The leaf tells: it
    moved from ``before`` to the entry the operation appended.

    Raises:
        RpcError: ``-32003`` naming the committed entry (``data.applied`` true).
    """
    leaf = runtime.session.leaf_id
    entry = runtime.session.tree.by_id.get(leaf) if leaf is not None else None
    if leaf == before or entry is None or entry.get("type") not in ("compaction", "branch_summary"):
        return
    raise RpcError(
        CANCELLED,
        f"Cancelled after its commit: the {entry['type']} entry {leaf} is in the session",
        {"kind": "cancelled_after_commit", "applied": True, "entryId": leaf},
    )


class SessionHub:
    """The open sessions and the RPC methods over them.

    Args:
        options: How runtimes are built.
    """

    def __init__(self, options: RuntimeOptions | None = None) -> None:
        load_on_start()  # not in the middle of a request, where a descriptor shortage fails it
        self.options = options or RuntimeOptions()
        self._slots: dict[str, _Slot] = {}
        # The session id open from each path: opening 1,000 sessions compared every new path
        # with every open one (half a million comparisons, issue 9).
        self._paths: dict[str, str] = {}
        # (listener, peer, whether it takes the encoded line)
        self._listeners: list[tuple[Callable[[Any], None], Peer | None, bool]] = []
        self.fair = Fairness()
        """The bounds of the work that grows with a session (open, context, tree)."""
        # Summaries for sessions pi owns (integrations/pi): no session of ours is involved.
        tracer = self.options.runtime_kwargs.get("tracer")
        self.hosted = HostedMethods(
            HostedOptions(
                routes=self.options.summarizer,
                settings=self.options.settings or RuntimeSettings(),
                resolve=self._resolve,
                owned=lambda path: str(path) in self._paths,
                tracer=tracer if isinstance(tracer, LifecycleTracer) else LifecycleTracer(None),
            )
        )

    # -- registry ------------------------------------------------------------------------------

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

    def _listened(self, session_id: str) -> bool:
        """Whether any listener receives the events of this session."""
        return any(peer is None or session_id in peer.topics for _, peer, _ in self._listeners)

    def _publish(self, session_id: str, message: dict[str, Any]) -> None:
        line: str | None = None
        for listener, peer, encoded in list(self._listeners):
            if peer is not None and session_id not in peer.topics:
                continue
            try:
                if not encoded:
                    listener(message)
                    continue
                if line is None:
                    line = encode(message)
                listener(line)
            except Exception as exc:  # noqa: BLE001 - one bad listener must not break a session
                print(f"orchestrator: event listener failed: {exc!r}", file=sys.stderr)

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
            if self._listened(session_id):  # the notification is built only for someone
                payload = {"session_id": session_id, "event": event.as_json()}
                self._publish(session_id, notification(EVENT_METHOD, payload))

        unsubscribe = runtime.events.subscribe(forward, ignoring=QUIET_EVENTS)
        slot = _Slot(runtime, path or runtime.session.store.location, unsubscribe)
        self._slots[session_id] = slot
        self._paths.setdefault(slot.path, session_id)
        return session_id

    def session_ids(self) -> set[str]:
        """The ids of the open sessions."""
        return set(self._slots)

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
        resolved = self._to_open(path, create)
        open_id = self._paths.get(str(resolved))
        if open_id is not None:
            return self._slots[open_id]
        loaded = self._load(path, resolved, create, self.options.arguments())
        return self._register(loaded, str(resolved))

    def _to_open(self, path: str, create: bool) -> Path:
        """The file ``path`` names, once it may be opened (or created)."""
        resolved = self._resolve(path)
        # What the name is, as the command line says it (not all "no such session file"); a
        # name ending in '/' is a folder's even to create (pathlib drops the slash).
        try:
            if create:
                refuse_folder_name(path)
            else:
                require_session_file(self._joined(path), path)
        except SessionError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        return resolved

    async def open_fairly(self, path: str, *, create: bool = False, peer: Peer | None) -> _Slot:
        """:meth:`open`, the file read in a worker thread, as heavy work (``_rpc/fair.py``).

        Raises:
            RpcError: as :meth:`open`; ``-32003`` when the client left before it started.
            SessionError: the file is not a session.
        """
        resolved = self._to_open(path, create)

        def prepare() -> Callable[[Stop], AgentSession | _Slot]:
            # On the loop, once it may start: another request may have opened it meanwhile.
            open_id = self._paths.get(str(resolved))
            if open_id is not None:
                slot = self._slots[open_id]
                return lambda stop: slot
            arguments = self.options.arguments()
            return lambda stop: self._load(path, resolved, create, arguments)

        # A server stopping meanwhile does not lose a session read: the thread's result is
        # returned even when cancelled (fair.py), so it is registered, and closed with the rest.
        opened = await self.fair.run(peer, str(resolved), prepare)
        return opened if isinstance(opened, _Slot) else self._register(opened, str(resolved))

    def _load(
        self, path: str, resolved: Path, create: bool, arguments: dict[str, Any]
    ) -> AgentSession:
        """Read ``resolved`` into a new runtime (touches nothing of the hub's: thread-safe)."""
        try:
            if not create and not resolved.is_file():
                raise RpcError(INVALID_PARAMS, f"{path}: no such session file")
            if create and not os.path.lexists(resolved) and side_file_name(resolved):
                raise RpcError(
                    INVALID_PARAMS,
                    f"{path}: a new session cannot take a side file's name (.lock, .journal, "
                    ".corrupt, or a rewrite's .NAME.tmp)",
                )
            # The server owns every session it opens until it closes it (D27).
            return AgentSession.open(resolved, owner=SERVER_OWNER, **arguments)
        except (OSError, SessionError) as exc:
            shortage = out_of_files(path, exc)
            if shortage is not None:
                raise shortage from None
            if isinstance(exc, SessionError):
                raise
            # A folder, a file we may not read, a name too long: the caller's path, not a bug.
            raise RpcError(INVALID_PARAMS, f"{path}: {exc.strerror or exc}") from None

    def _register(self, runtime: AgentSession, path: str) -> _Slot:
        """Add a runtime :meth:`_load` made (closing it when its id is open already)."""
        try:
            slot = self._slots[self.add(runtime, path)]
        except RpcError:
            runtime.close()
            raise
        # What the session holds is frozen now, by a full collection that walks only what is
        # not frozen yet (this session, mostly): opening a thousand sessions one request at a
        # time otherwise left them all for one full collection later, 1.2 s of a stopped
        # event loop in the middle of the requests that followed (issue 9; gc_policy.py).
        POLICY.settle()
        return slot

    def _joined(self, path: str) -> Path:
        """``path`` inside the served directory (or the working one), its links not followed.

        Raises:
            RpcError: a path no file can have (a NUL, a lone surrogate, an unknown ``~user``).
        """
        if "\0" in path:
            raise RpcError(INVALID_PARAMS, f"{path!r}: a path cannot hold a NUL character")
        try:
            given = Path(path).expanduser()
        except RuntimeError as exc:
            raise RpcError(INVALID_PARAMS, f"{path}: {one_line(str(exc))}") from None
        return given if given.is_absolute() else (self.options.root or Path.cwd()) / given

    def _fork_target(self, path: str) -> Path:
        """Where ``session.fork`` writes: a new name inside the served directory.

        The name itself must be free: a symbolic link there, even one that points nowhere, is
        "already exists" (resolving it first created the file it points to, through it).
        """
        if not path:
            raise RpcError(
                INVALID_PARAMS, "session.fork: 'path' is empty; leave it out for a default name"
            )
        target = self._resolve(path)
        try:
            refuse_folder_name(path)
        except SessionError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        if os.path.lexists(self._joined(path)):
            raise RpcError(INVALID_PARAMS, f"{path}: already exists")
        return target

    def _resolve(self, path: str) -> Path:
        if "\0" in path:
            raise RpcError(INVALID_PARAMS, f"{path!r}: a path cannot hold a NUL character")
        try:
            os.fsencode(path)
        except UnicodeEncodeError:
            # A lone surrogate outside \udc80-\udcff (those stand for undecodable bytes) is
            # in no file name on this system.
            raise RpcError(
                INVALID_PARAMS, f"{path!r}: not a file name (it holds a lone surrogate)"
            ) from None
        root = self.options.root
        try:
            candidate = Path(path).expanduser()
            if not candidate.is_absolute():
                candidate = (root or Path.cwd()) / candidate
            candidate = candidate.resolve()
        except (OSError, RuntimeError) as exc:
            # expanduser of an unknown ~user, a symlink loop: the caller's path, not a bug.
            if "loop" in str(exc).lower():
                raise RpcError(
                    INVALID_PARAMS,
                    f"{path}: symbolic link loop (following its links never reaches a file)",
                ) from None
            raise RpcError(INVALID_PARAMS, f"{path}: {one_line(str(exc))}") from None
        if root is not None and not candidate.is_relative_to(root.resolve()):
            raise RpcError(INVALID_PARAMS, f"{path}: outside the served directory")
        return candidate

    @staticmethod
    def _subscribe(peer: Peer | None, session_id: str) -> None:
        if peer is not None:
            peer.topics.add(session_id)

    def shutdown_error(self) -> RpcError:
        """The answer to each request still running when the server stops (``-32003``).

        The server cancels those requests and :meth:`abort_all` stops their work: nothing
        partial is applied.
        """
        return RpcError(CANCELLED, SHUTTING_DOWN, {"kind": "shutdown", "applied": False})

    def abort_all(self) -> None:
        """Stop the work running in every session for good (shutdown): nothing queued starts."""
        for slot in self._slots.values():
            slot.runtime.stop()

    def close_all(self) -> None:
        """Close every session (releases the file locks)."""
        for session_id in list(self._slots):
            self._close(session_id)

    def _close(self, session_id: str) -> None:
        slot = self._slots.pop(session_id)
        if self._paths.get(slot.path) == session_id:
            del self._paths[slot.path]
            # Another open session with the same path (a fork's store reporting it) takes over.
            for other_id, other in self._slots.items():
                if other.path == slot.path:
                    self._paths[slot.path] = other_id
                    break
        slot.unsubscribe()
        slot.runtime.close()
        POLICY.released()  # its cycles, if frozen, are collected at the next full collection
        self._ended(session_id)

    def _ended(self, session_id: str) -> None:
        """Tell everyone receiving a closed session's events that it closed; send no more.

        Every connection that opened the session follows it, not only the one that closes
        it: without a word, the others would wait for events that never come, and learn only
        at their next request that the session is gone.
        """
        if self._listened(session_id):
            payload = {"session_id": session_id, "event": {"type": SESSION_CLOSED}}
            self._publish(session_id, notification(EVENT_METHOD, payload))
        for _, peer, _ in self._listeners:
            if peer is not None:
                peer.topics.discard(session_id)

    # -- methods -------------------------------------------------------------------------------

    def methods(self) -> dict[str, Method]:
        """The method table for a :class:`Dispatcher`."""
        sid = frozenset({"session_id"})
        return {
            "session.open": Method(
                handler=self._m_open, params=frozenset({"path", "create"}), heavy=True
            ),
            "session.list": Method(handler=self._m_list),
            "session.close": Method(handler=self._m_close, params=sid),
            "session.compress": Method(handler=self._m_compress, params=sid | {"focus"}),
            "session.tree": Method(handler=self._m_tree, params=sid, heavy=True),
            "session.tree.navigate": Method(
                handler=self._m_navigate,
                params=sid | {"target_id", "summarize", "focus", "replace_instructions", "label"},
            ),
            "session.fork": Method(handler=self._m_fork, params=sid | {"entry_id", "path"}),
            "session.prompt": Method(handler=self._m_prompt, params=sid | {"text"}),
            "session.abort": Method(handler=self._m_abort, params=sid),
            "session.context": Method(handler=self._m_context, params=sid, heavy=True),
            **self.hosted.methods(),
        }

    async def _m_open(self, p: Params) -> dict[str, Any]:
        slot = await self.open_fairly(p.text("path"), create=p.flag("create"), peer=p.peer)
        runtime = slot.runtime
        self._subscribe(p.peer, runtime.session.session_id)
        return {
            **slot.describe(),
            "problems": [
                {"line": x.line, "code": x.code, "message": x.message}
                for x in runtime.session.problems
            ],
            "settled": [
                {
                    "id": s.operation_id,
                    "kind": s.kind,
                    "source": s.source,
                    "dest": s.dest,
                    "note": s.note,
                }
                for s in runtime.settlements
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
        before = slot.runtime.session.leaf_id
        try:
            outcome = await slot.runtime.compact(focus)
        except anyio.get_cancelled_exc_class():
            _raise_if_committed(slot.runtime, before)
            raise
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

    async def _m_tree(self, p: Params) -> Encoded:
        session_id = p.text("session_id")
        # Prepared in the connection's turn, so that a session.open sent before it has run.
        prepare = lambda: prepare_tree(self._slot(session_id).answers)  # noqa: E731
        return await self.fair.run(p.peer, session_id, prepare)

    async def _m_navigate(self, p: Params) -> dict[str, Any]:
        slot = self._slot(p.text("session_id"))
        target, summarize, focus, replace, label = navigation_options(p)
        if slot.runtime.is_busy or slot.compacting:
            raise RpcError(BUSY, NAVIGATION_BUSY)
        if slot.navigating:
            raise RpcError(BUSY, "A navigation is already running in this session")
        slot.navigating = True
        before = slot.runtime.session.leaf_id
        try:
            result = await slot.runtime.navigate(
                target,
                summarize=summarize,
                instructions=focus,
                replace_instructions=replace,
                label=label,
            )
        except anyio.get_cancelled_exc_class():
            _raise_if_committed(slot.runtime, before)
            raise
        finally:
            slot.navigating = False
        entry = result.summary_entry
        return {**result.as_json(), "shortSummary": entry.get("shortSummary") if entry else None}

    async def _m_fork(self, p: Params) -> dict[str, Any]:
        runtime = self._slot(p.text("session_id")).runtime
        entry_id = p.text("entry_id")
        path = p.optional_text("path")
        target = self._fork_target(path) if path is not None else None
        try:
            result = await runtime.fork(entry_id, target)
        except (OSError, SessionError) as exc:
            shortage = out_of_files(path or "session.fork", exc)
            if shortage is not None:
                raise shortage from None
            if isinstance(exc, SessionError):
                raise
            # A missing folder or one we may not write: the caller's path, not a bug.
            raise RpcError(INVALID_PARAMS, f"{path}: {exc.strerror or exc}") from None
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
        self._subscribe(p.peer, new.session_id)
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

    async def _m_context(self, p: Params) -> Encoded:
        session_id = p.text("session_id")
        prepare = lambda: prepare_context(self._slot(session_id).answers)  # noqa: E731
        return await self.fair.run(p.peer, session_id, prepare)
