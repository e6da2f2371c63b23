"""The sessions of this process, as a :class:`~orchestrator._rpc.host.SessionHost`.

Theory of operation. A :class:`LocalHost` holds the open sessions (one
:class:`~orchestrator._runtime.session.AgentSession` each, keyed by the header's session id),
reads them in worker threads as heavy work (:mod:`~orchestrator._rpc.fair`), and forwards each
session's events to the hub. Which requests may run together on a session is the session
machine's decision (``machines/session.toml``, :func:`~orchestrator._lifecycle.admission.admit`):
the facts are what the runtime runs and what this host admitted and has not finished (a manual
compaction asked for is running before the turn machine has taken it).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import anyio

from orchestrator._core.errors import NoAgentError, SessionError
from orchestrator._lifecycle.admission import admit
from orchestrator._lifecycle.guards import SessionFacts
from orchestrator._lifecycle.load import MachineDef
from orchestrator._lifecycle.machine import load_machine
from orchestrator._lifecycle.names import SessionEvent
from orchestrator._process.gc_policy import POLICY
from orchestrator._rpc.answers import AnswerCache, prepare_context, prepare_tree
from orchestrator._rpc.errors import CANCELLED, INVALID_PARAMS, RpcError, out_of_files
from orchestrator._rpc.host import (
    Attached,
    Compacted,
    Described,
    Forked,
    Navigation,
    Opened,
    Prompted,
)
from orchestrator._rpc.hosted import HostedMethods, HostedOptions
from orchestrator._rpc.paths import fork_target, joined, resolve
from orchestrator._rpc.protocol import Method, Peer
from orchestrator._rpc.work import Stop
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import Event
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.files import refuse_folder_name, require_session_file, side_file_name
from orchestrator._store.journal import Journal
from orchestrator._store.jsonl import JsonlStore
from orchestrator._telemetry.tracing import LifecycleTracer

QUIET_EVENTS = frozenset({"transition"})
"""Event types not forwarded: every machine step is one, and the journal already has them."""
NO_AGENT = "session.prompt: no agent configured (start the server with --model)"
SERVER_OWNER = "orchestrator serve"
"""How the server names itself in the lock of the sessions it owns (D27)."""
SHUTTING_DOWN = "Server shutting down: the operation was cancelled; the session file is unchanged"
"""The message of the answer to each request still running when the server stops."""


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
class Slot:
    """One open session and the requests this host admitted that still run."""

    runtime: AgentSession
    path: str
    unsubscribe: Callable[[], None]
    running: set[SessionEvent] = field(default_factory=set)
    answers: AnswerCache = field(init=False)

    def __post_init__(self) -> None:
        self.answers = AnswerCache(self.runtime)

    def facts(self) -> SessionFacts:
        """What runs in the session, as the session machine's guards read it."""
        compacting = SessionEvent.COMPACT in self.running
        return SessionFacts(
            turn_running=self.runtime.is_busy or compacting,
            compaction_running=compacting,
            navigation_running=SessionEvent.NAVIGATE in self.running,
        )

    def describe(self) -> Described:
        session = self.runtime.session
        return Described(
            session_id=session.session_id,
            path=self.path,
            entries=len(session.tree),
            leaf_id=session.leaf_id,
            state=self.runtime.state,
            busy=self.runtime.is_busy or SessionEvent.NAVIGATE in self.running,
        )


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


class LocalHost(Attached):
    """The sessions of this process.

    Args:
        options: How runtimes are built.
    """

    def __init__(self, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.slots: dict[str, Slot] = {}
        # The session id open from each path: opening 1,000 sessions compared every new path
        # with every open one (half a million comparisons, issue 9).
        self._paths: dict[str, str] = {}
        self.rules: MachineDef = load_machine("session")
        """The session machine's table (tests put a modified copy here)."""
        tracer = self.options.runtime_kwargs.get("tracer")
        # Summaries for sessions pi owns (integrations/pi): no session of ours is involved.
        self.hosted = HostedMethods(
            HostedOptions(
                routes=self.options.summarizer,
                settings=self.options.settings or RuntimeSettings(),
                resolve=self.resolve,
                owned=lambda path: str(path) in self._paths,
                tracer=tracer if isinstance(tracer, LifecycleTracer) else LifecycleTracer(None),
            )
        )

    # -- registry ------------------------------------------------------------------------------

    def session_ids(self) -> set[str]:
        return set(self.slots)

    def slot(self, session_id: str) -> Slot:
        """The open session ``session_id`` (``RpcError -32602`` when unknown)."""
        slot = self.slots.get(session_id)
        if slot is None:
            raise RpcError(INVALID_PARAMS, f"Unknown session: {session_id}")
        return slot

    def add(self, runtime: AgentSession, path: str | None = None) -> str:
        """Register an open runtime; returns its session id.

        Raises:
            RpcError: another open session has the same id (``-32602``).
        """
        session_id = runtime.session.session_id
        if session_id in self.slots:
            raise RpcError(
                INVALID_PARAMS,
                f"Session {session_id} is already open from {self.slots[session_id].path}",
            )
        outlet = self.outlet

        def forward(event: Event) -> None:
            # The hub builds the notification only for someone; asking it first whether anyone
            # listens went over its listeners twice for each event (three a compaction).
            outlet.tell(session_id, event.as_json())

        unsubscribe = runtime.events.subscribe(forward, ignoring=QUIET_EVENTS)
        slot = Slot(runtime, path or runtime.session.store.location, unsubscribe)
        self.slots[session_id] = slot
        self._paths.setdefault(slot.path, session_id)
        return session_id

    def open_now(self, path: str, *, create: bool = False) -> Slot:
        """Open a session file in this thread (or return it when already open).

        Raises:
            RpcError: the path is outside the served directory or the file does not exist.
            SessionError: the file is not a session.
        """
        resolved = self._to_open(path, create)
        open_id = self._paths.get(str(resolved))
        if open_id is not None:
            return self.slots[open_id]
        loaded = self._load(path, resolved, create, self.options.arguments())
        return self._register(loaded, str(resolved))

    def _to_open(self, path: str, create: bool) -> Path:
        """The file ``path`` names, once it may be opened (or created)."""
        resolved = self.resolve(path)
        # What the name is, as the command line says it (not all "no such session file"); a
        # name ending in '/' is a folder's even to create (pathlib drops the slash).
        try:
            if create:
                refuse_folder_name(path)
            else:
                require_session_file(joined(path, self.options.root), path)
        except SessionError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        return resolved

    async def open_slot(self, path: str, *, create: bool, peer: Peer | None) -> Slot:
        """:meth:`open_now`, the file read in a worker thread, as heavy work (``_rpc/fair.py``).

        Raises:
            RpcError: as :meth:`open_now`; ``-32003`` when the client left before it started.
            SessionError: the file is not a session.
        """
        resolved = self._to_open(path, create)

        def prepare() -> Callable[[Stop], AgentSession | Slot]:
            # On the loop, once it may start: another request may have opened it meanwhile.
            open_id = self._paths.get(str(resolved))
            if open_id is not None:
                slot = self.slots[open_id]
                return lambda stop: slot
            arguments = {**self.options.arguments(), "offload": self._offload(str(resolved))}
            return lambda stop: self._load(path, resolved, create, arguments)

        # A server stopping meanwhile does not lose a session read: the thread's result is
        # returned even when cancelled (fair.py), so it is registered, and closed with the rest.
        opened = await self.outlet.fair.run(peer, str(resolved), prepare)
        return opened if isinstance(opened, Slot) else self._register(opened, str(resolved))

    def _load(
        self, path: str, resolved: Path, create: bool, arguments: dict[str, Any]
    ) -> AgentSession:
        """Read ``resolved`` into a new runtime (touches nothing of the host's: thread-safe)."""
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
            _reraise_path_error(path, exc)

    def _offload(self, key: str) -> Callable[[Callable[[], Any]], Awaitable[Any]]:
        """How a session's work that grows with it runs: as the server's heavy work (fair.py)."""
        fair = self.outlet.fair

        async def offload(work: Callable[[], Any]) -> Any:
            return await fair.run(None, key, lambda: lambda stop: work())

        return offload

    def _register(self, runtime: AgentSession, path: str) -> Slot:
        """Add a runtime :meth:`_load` made (closing it when its id is open already)."""
        try:
            slot = self.slots[self.add(runtime, path)]
        except RpcError:
            runtime.close()
            raise
        # What the session holds is frozen now (gc_policy.py): opening a thousand sessions one
        # request at a time otherwise left them all for one full collection later, 1.2 s of a
        # stopped event loop in the middle of the requests that followed (issue 9), and a big
        # session's long lists for the next collection to visit item by item (issue 35).
        POLICY.settle()
        return slot

    def resolve(self, path: str) -> Path:
        """``path`` resolved inside the served directory (``RpcError -32602`` outside it)."""
        return resolve(path, self.options.root)

    def shutdown_error(self) -> RpcError:
        """The answer to each request still running when the server stops (``-32003``).

        The server cancels those requests and :meth:`abort_all` stops their work: nothing
        partial is applied.
        """
        return RpcError(CANCELLED, SHUTTING_DOWN, {"kind": "shutdown", "applied": False})

    def abort_all(self) -> None:
        """Stop the work running in every session for good (shutdown): nothing queued starts."""
        for slot in self.slots.values():
            slot.runtime.stop()

    def close_all(self) -> None:
        """Close every session (releases the file locks)."""
        for session_id in list(self.slots):
            self._close(session_id)

    def _close(self, session_id: str) -> None:
        slot = self.slots.pop(session_id)
        if self._paths.get(slot.path) == session_id:
            del self._paths[slot.path]
            # Another open session with the same path (a fork's store reporting it) takes over.
            for other_id, other in self.slots.items():
                if other.path == slot.path:
                    self._paths[slot.path] = other_id
                    break
        slot.unsubscribe()
        slot.runtime.close()
        closed = weakref.ref(slot.runtime.session)
        del slot
        self.outlet.ended(session_id)
        # Frozen or not, a closed session is freed by reference counting; only one a cycle
        # still holds later has everything unfrozen, for the next full collection to find it
        # (gc_policy.py): that collection walks every open session again (issue 35).
        POLICY.released(closed)

    # -- requests ------------------------------------------------------------------------------

    def more_methods(self) -> dict[str, Method]:
        return self.hosted.methods()

    async def open(self, path: str, *, create: bool, peer: Peer | None) -> Opened:
        slot = await self.open_slot(path, create=create, peer=peer)
        runtime = slot.runtime
        problems = [
            {"line": x.line, "code": x.code, "message": x.message} for x in runtime.session.problems
        ]
        settled = [
            {
                "id": s.operation_id,
                "kind": s.kind,
                "source": s.source,
                "dest": s.dest,
                "note": s.note,
            }
            for s in runtime.settlements
        ]
        return Opened(slot.describe(), problems, settled)

    async def sessions(self) -> list[Described]:
        return [slot.describe() for slot in self.slots.values()]

    async def close(self, session_id: str) -> None:
        slot = self.slot(session_id)
        admit(SessionEvent.CLOSE, slot.facts(), table=self.rules)
        self._close(session_id)

    async def compress(
        self, session_id: str, focus: str | None, *, operation_id: str | None = None
    ) -> Compacted | str:
        slot = self.slot(session_id)
        admit(SessionEvent.COMPACT, slot.facts(), table=self.rules)
        slot.running.add(SessionEvent.COMPACT)
        before = slot.runtime.session.leaf_id
        try:
            outcome = await slot.runtime.compact(focus)
        except anyio.get_cancelled_exc_class():
            _raise_if_committed(slot.runtime, before)
            raise
        finally:
            slot.running.discard(SessionEvent.COMPACT)
        if outcome.status != "committed" or outcome.entry is None or outcome.result is None:
            return outcome.reason or "Nothing to compact"
        result = outcome.result
        return Compacted(
            entry_id=outcome.entry["id"],
            summary=result.summary,
            tokens_before=result.tokens_before,
            first_kept_entry_id=result.first_kept_entry_id,
            short_summary=result.short_summary,
        )

    async def recall(
        self, session_id: str, operation_id: str, method: str | None
    ) -> dict[str, Any] | None:
        """Nothing beyond the hub's book: an operation runs, and ends, in this process."""
        return None

    async def tree(self, session_id: str, peer: Peer | None) -> Any:
        # Prepared in the connection's turn, so that a session.open sent before it has run.
        prepare = lambda: prepare_tree(self.slot(session_id).answers)  # noqa: E731
        return await self.outlet.fair.stream(peer, session_id, prepare)

    async def context(self, session_id: str, peer: Peer | None) -> Any:
        prepare = lambda: prepare_context(self.slot(session_id).answers)  # noqa: E731
        return await self.outlet.fair.stream(peer, session_id, prepare)

    async def navigate(
        self, session_id: str, request: Navigation, *, operation_id: str | None = None
    ) -> dict[str, Any]:
        slot = self.slot(session_id)
        admit(SessionEvent.NAVIGATE, slot.facts(), table=self.rules)
        slot.running.add(SessionEvent.NAVIGATE)
        before = slot.runtime.session.leaf_id
        try:
            result = await slot.runtime.navigate(
                request.target_id,
                summarize=request.summarize,
                instructions=request.instructions,
                replace_instructions=request.replace_instructions,
                label=request.label,
            )
        except anyio.get_cancelled_exc_class():
            _raise_if_committed(slot.runtime, before)
            raise
        finally:
            slot.running.discard(SessionEvent.NAVIGATE)
        entry = result.summary_entry
        return {**result.as_json(), "shortSummary": entry.get("shortSummary") if entry else None}

    async def fork(self, session_id: str, entry_id: str, path: str | None) -> Forked:
        slot = self.slot(session_id)
        admit(SessionEvent.FORK, slot.facts(), table=self.rules)
        target = fork_target(path, self.options.root) if path is not None else None
        try:
            result = await slot.runtime.fork(entry_id, target)
        except (OSError, SessionError) as exc:
            _reraise_path_error(path or "session.fork", exc)
        if result.cancelled or result.session is None:
            return Forked(None, result.editor_text)
        new = result.session
        journal = (
            Journal.open(new.store.location)
            if isinstance(new.store, JsonlStore)
            else Journal.in_memory()
        )
        offload = self._offload(new.store.location)
        forked = AgentSession(new, journal=journal, offload=offload, **self.options.arguments())
        described = self.slots[self.add(forked)].describe()
        POLICY.settle()  # frozen as an opened session is (_register): its index is as long
        return Forked(described, result.editor_text)

    async def prompt(self, session_id: str, text: str) -> Prompted:
        slot = self.slot(session_id)
        if slot.runtime.agent is None:
            raise NoAgentError(NO_AGENT)
        admit(SessionEvent.PROMPT, slot.facts(), table=self.rules)
        result = await slot.runtime.prompt(text)
        return Prompted(result.state, result.reply, result.queued)

    async def abort(self, session_id: str) -> bool:
        slot = self.slot(session_id)
        was_busy = slot.describe().busy
        slot.runtime.abort()
        slot.runtime.abort_branch_summary()
        return was_busy


def _reraise_path_error(path: str, exc: OSError | SessionError) -> NoReturn:
    """A failure to read or write ``path`` as the caller's error, or a shortage as ``-32005``.

    Raises:
        RpcError: Out of descriptors (``-32005``), or a folder, a file we may not read or
            write, a name too long (``-32602``: the caller's path, not a bug).
        SessionError: ``exc`` itself, when it is one.
    """
    shortage = out_of_files(path, exc)
    if shortage is not None:
        raise shortage from None
    if isinstance(exc, SessionError):
        raise exc
    raise RpcError(INVALID_PARAMS, f"{path}: {exc.strerror or exc}") from None
