"""The JSON-RPC methods backed by the cluster: ``orchestrator serve --temporal`` (issue 10).

Theory of operation. :class:`ClusterHub` answers the same methods, with the same parameters,
answers and error codes, as :class:`~orchestrator._rpc.hub.SessionHub`, so a client cannot tell
which host it talks to. The difference is where the work happens. This server owns nothing: a
session's owner is its workflow (id = session id), on whichever worker holds it, so
``session.prompt`` and ``session.compress`` are updates to that workflow (the turn table decides
what a turn does, there as here) and ``session.abort`` a signal, and two
servers compressing the same session reach the same workflow, which runs one compaction and
refuses the other with ``-32001`` exactly as one server would. ``session.tree.navigate`` and
``session.fork`` are updates too (the navigation table runs in the workflow; a fork's hooks and
its new session are an activity), with the one-process server's parameter checks, answers and
error codes.

A worker without an agent (no ``--model``) refuses ``session.prompt`` with ``-32601``, as a
server started without ``--model`` does.

Notifications. While ``session.prompt`` or ``session.compress`` runs, the server asks the
workflow for the events recorded since the last it sent (the ``events`` query, every
:data:`EVENT_POLL_S`), and the answer carries them all: each is sent once, in order, before the
answer, as ``session.event`` to the connections that opened the session, as one process sends
them. An agent that raises is answered ``-32603`` with its exception, as one process answers.

Reading (``session.tree``, ``session.context``, ``session.open``'s description) comes from the
shared store, not from a workflow query: a query may do no I/O and the workflow keeps no copy
of the session (it would have to carry it through its history), while the store is what every
server and worker reaches and is always current. A navigation without a summary is stored as a
leaf marker under the new leaf; reading resolves it to that position, as the one-process server
holds it in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio

from orchestrator._cluster.client import ClusterClient
from orchestrator._cluster.contract import (
    BUSY_COMPACTING,
    BUSY_NAVIGATING,
    COMPACT_WHILE_NAVIGATING,
    NO_AGENT,
    PROMPT_WHILE_NAVIGATING,
    TASK_QUEUE,
    UNAVAILABLE_KIND,
    AgentRaisedError,
    CompressResult,
    ForkRequest,
    NavigateRequest,
    NavigateResult,
)
from orchestrator._cluster.stores import cluster_store
from orchestrator._core.errors import (
    Cancelled,
    ConflictError,
    ModelError,
    SessionError,
    UnavailableError,
)
from orchestrator._rpc.hub import EVENT_METHOD, SessionHub, navigation_options
from orchestrator._rpc.protocol import (
    BUSY,
    CANCELLED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Method,
    Params,
    RpcError,
    notification,
    one_line,
)
from orchestrator._runtime.navigate import BUSY as NAVIGATION_BUSY
from orchestrator._runtime.navigation import recorded_position
from orchestrator._store.reports import context_report, tree_rows
from orchestrator._store.session import Session

BUSY_ANSWERS = frozenset(
    {BUSY_COMPACTING, BUSY_NAVIGATING, COMPACT_WHILE_NAVIGATING, PROMPT_WHILE_NAVIGATING}
)
"""Refusals a workflow gives while it works: ``-32001``, as one server gives them."""
NO_WORKER_AGENT = "session.prompt: no agent configured (start the workers with --model)"
"""``session.prompt`` refused by a worker without an agent, as ``-32601``."""
SHUTTING_DOWN_CLUSTER = (
    "Server shutting down: it stopped waiting for the answer; the work it forwarded goes on in"
    " the cluster and may still be applied (the session and its journal show the outcome)"
)
"""The message of the answer to each request still running when ``serve --temporal`` stops."""
EVENT_POLL_S = 0.25
"""How often a request in progress asks its workflow for new events."""


class _WithEvents(Protocol):
    @property
    def events(self) -> list[dict[str, Any]]: ...

    @property
    def events_run(self) -> str: ...


R = TypeVar("R", bound=_WithEvents)


NOT_CLUSTERED = (
    "{method}: not served with --temporal (pi's sessions are pi's files, not the cluster's); "
    "run a one-process orchestrator serve --socket PATH for pi's extension"
)
"""The ``-32601`` refusal of the ``summary.*`` methods by ``serve --temporal``."""


async def _not_clustered(p: Params) -> Any:
    raise RpcError(METHOD_NOT_FOUND, NOT_CLUSTERED.format(method=p.method))


class ClusterHub(SessionHub):
    """The RPC methods over session workflows and a shared store.

    Args:
        temporal: The Temporal server, ``HOST:PORT``.
        database: The shared store (a PostgreSQL URL or a directory).
        task_queue: Where the workers poll.
        client: A connected client to use instead (tests).
    """

    def __init__(
        self,
        temporal: str,
        database: str,
        *,
        task_queue: str = TASK_QUEUE,
        client: ClusterClient | None = None,
    ) -> None:
        super().__init__()
        self.temporal = temporal
        self.database = database
        self.task_queue = task_queue
        self._client = client
        self._open: dict[str, str] = {}
        self._sent: dict[str, tuple[str, int]] = {}  # session: (workflow run, last event sent)

    async def client(self) -> ClusterClient:
        """The cluster client, connected on first use."""
        if self._client is None:
            self._client = await ClusterClient.connect(self.temporal, task_queue=self.task_queue)
        return self._client

    # -- registry ---------------------------------------------------------------------------------

    def session_ids(self) -> set[str]:
        """The sessions this server has opened."""
        return set(self._open)

    def open_id(self, path: str) -> str:
        """Open the session named by ``path`` (its id, or ``<id>.jsonl``); returns its id.

        Raises:
            RpcError: No such session in the store (``-32602``).
        """
        session_id = session_id_of(path)
        if not cluster_store(self.database, session_id).exists():
            raise RpcError(INVALID_PARAMS, f"{path}: no such session in the store")
        self._open[session_id] = path
        return session_id

    def shutdown_error(self) -> RpcError:
        """The answer to each request still running when this server stops (``-32003``).

        Nothing runs here: the work a request forwarded runs in its session's workflow, which
        keeps it when a server stops (another server may be waiting on it too), so it may still
        be applied. The answer says so, and ``applied`` is ``null`` (not known here), not the
        one-process server's ``false``.
        """
        return RpcError(CANCELLED, SHUTTING_DOWN_CLUSTER, {"kind": "shutdown", "applied": None})

    def abort_all(self) -> None:
        """Nothing runs here: the workflows keep their work when a server stops."""

    def close_all(self) -> None:
        """Forget the open sessions (the server holds no lock)."""
        self._open.clear()

    def _location(self, session_id: str) -> str:
        """Where the store keeps ``session_id`` (a file, or the database and the id)."""
        with contextlib.closing(cluster_store(self.database, session_id)) as store:
            return store.location

    def _session(self, session_id: str) -> Session:
        if session_id not in self._open:
            raise RpcError(INVALID_PARAMS, f"Unknown session: {session_id}")
        # The position a navigation recorded (a leaf marker) is the leaf, as in one process.
        return recorded_position(Session.from_store(cluster_store(self.database, session_id)))

    async def _describe(self, session_id: str) -> dict[str, Any]:
        session = self._session(session_id)
        try:
            state = await (await self.client()).state(session_id)
        except (SessionError, UnavailableError):
            state = {"busy": False, "unknown": True}
        busy = bool(state and state.get("busy"))
        described = (state or {}).get("turnState") or ("manual_compacting" if busy else "idle")
        return {
            "session_id": session_id,
            "path": self._open[session_id],
            "entries": len(session.tree),
            "leafId": session.leaf_id,
            "state": "unknown" if state and state.get("unknown") else described,
            "busy": busy,
        }

    # -- notifications ----------------------------------------------------------------------------

    def _deliver(self, session_id: str, run: str, events: list[dict[str, Any]]) -> None:
        """Send the events not sent yet, in their order, as one process sends them."""
        sent_run, last = self._sent.get(session_id, ("", -1))
        if run != sent_run:
            last = -1  # a new workflow run numbers from 0 again
        for numbered in events:
            if numbered["seq"] > last:
                last = numbered["seq"]
                self._tell(session_id, numbered["event"])
        self._sent[session_id] = (run, last)

    def _tell(self, session_id: str, event: dict[str, Any]) -> None:
        payload = {"session_id": session_id, "event": event}
        self._publish(session_id, notification(EVENT_METHOD, payload))

    async def _fetch(self, session_id: str) -> None:
        """Ask the workflow for the events not sent yet (best effort: its answer has them all)."""
        client = await self.client()
        run, last = self._sent.get(session_id, ("", -1))
        try:
            current, events = await client.events(session_id, last)
            if current != run and last >= 0:
                current, events = await client.events(session_id, -1)
        except Exception:  # noqa: BLE001 - not started yet, or no worker answered in time
            return
        self._deliver(session_id, current, events)

    async def _forwarding(self, session_id: str, request: Callable[[], Awaitable[R]]) -> R:
        """Run a request, sending its workflow's events while it runs and before its answer.

        While the request runs, the events are read every :data:`EVENT_POLL_S` (a query: no
        history is written); the answer carries them all, so none is lost to a slow query.
        """
        if not self._listened(session_id):
            return await request()

        async def poll() -> None:
            while True:
                await anyio.sleep(EVENT_POLL_S)
                await self._fetch(session_id)

        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(poll)
            try:
                result = await request()
            except Exception as error:  # noqa: BLE001 - raised below, after its events
                failure = error
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            await self._fetch(session_id)  # a refused or failed request: what it emitted first
            raise failure
        self._deliver(session_id, result.events_run, result.events)
        return result

    # -- methods ----------------------------------------------------------------------------------

    def methods(self) -> dict[str, Method]:
        """The same method table as the one-process hub."""
        table = super().methods()
        handlers = {
            "session.open": self._c_open,
            "session.list": self._c_list,
            "session.close": self._c_close,
            "session.compress": self._c_compress,
            "session.tree": self._c_tree,
            "session.tree.navigate": self._c_navigate,
            "session.fork": self._c_fork,
            "session.prompt": self._c_prompt,
            "session.abort": self._c_abort,
            "session.context": self._c_context,
        }
        return {
            name: Method(handler=handlers.get(name, _not_clustered), params=m.params)
            for name, m in table.items()
        }

    async def _c_open(self, p: Params) -> dict[str, Any]:
        session_id = self.open_id(p.text("path"))
        if p.peer is not None:
            p.peer.topics.add(session_id)
        session = self._session(session_id)
        return {
            **(await self._describe(session_id)),
            "problems": [
                {"line": x.line, "code": x.code, "message": x.message} for x in session.problems
            ],
            "settled": [],
        }

    async def _c_list(self, p: Params) -> dict[str, Any]:
        return {"sessions": [await self._describe(s) for s in sorted(self._open)]}

    async def _c_close(self, p: Params) -> dict[str, Any]:
        described = await self._describe(p.text("session_id"))
        if described["busy"]:
            raise RpcError(BUSY, "Session is busy; abort it or wait before closing")
        self._open.pop(described["session_id"], None)
        self._ended(described["session_id"])
        return {"closed": True}

    async def _c_compress(self, p: Params) -> dict[str, Any]:
        session_id = p.text("session_id")
        self._session(session_id)
        try:
            client = await self.client()
            focus = p.optional_text("focus")
            done = await self._forwarding(session_id, lambda: client.compress(session_id, focus))
        except SessionError as error:
            raise _busy_or(error) from None
        return compress_answer(done)

    async def _c_navigate(self, p: Params) -> dict[str, Any]:
        session_id = p.text("session_id")
        self._session(session_id)
        target, summarize, focus, replace, label = navigation_options(p)
        request = NavigateRequest(
            target_id=target,
            summarize=summarize,
            instructions=focus,
            replace_instructions=replace,
            label=label,
        )
        try:
            done = await (await self.client()).navigate(session_id, request)
        except SessionError as error:
            raise _busy_or(error) from None
        answer = navigate_answer(done)
        if done.status == "done":
            # The leaf moved: told as one process tells it (not its branch summary's
            # compaction_update: the answer does not carry that operation's id).
            self._tell(
                session_id,
                {
                    "type": "session_tree",
                    "newLeafId": done.new_leaf_id,
                    "oldLeafId": done.old_leaf_id,
                    "summaryEntryId": done.summary_entry_id,
                },
            )
        return answer

    async def _c_fork(self, p: Params) -> dict[str, Any]:
        session_id = p.text("session_id")
        self._session(session_id)
        entry_id = p.text("entry_id")
        path = p.optional_text("path")
        # A fork is named like a session to open: its id, or <id>.jsonl (default: a fresh id).
        new_id = session_id_of(path) if path else None
        done = await (await self.client()).fork(
            session_id, ForkRequest(entry_id=entry_id, new_session_id=new_id)
        )
        if done.cancelled or done.session_id is None:
            return {
                "session_id": None,
                "path": None,
                "editorText": done.editor_text,
                "cancelled": True,
            }
        # Told on the forked session, as one process tells it, before the fork is opened.
        self._tell(
            session_id,
            {
                "type": "session_fork",
                "previousSessionFile": self._location(session_id),
                "newSessionFile": self._location(done.session_id),
                "entryId": entry_id,
            },
        )
        self._open[done.session_id] = path or done.session_id
        if p.peer is not None:
            p.peer.topics.add(done.session_id)
        described = await self._describe(done.session_id)
        return {**described, "editorText": done.editor_text, "cancelled": False}

    async def _c_tree(self, p: Params) -> dict[str, Any]:
        session = self._session(p.text("session_id"))
        return {
            "sessionId": session.session_id,
            "name": session.tree.session_name(),
            "leafId": session.leaf_id,
            "nodes": tree_rows(session),
        }

    async def _c_prompt(self, p: Params) -> dict[str, Any]:
        session_id = p.text("session_id")
        self._session(session_id)
        text = p.text("text")
        try:
            client = await self.client()
            result = await self._forwarding(session_id, lambda: client.prompt(session_id, text))
        except AgentRaisedError as error:
            # One process lets the agent's exception reach the dispatcher: a bug, -32603.
            message = one_line(str(error)) or error.kind
            raise RpcError(INTERNAL_ERROR, f"Internal error: {error.kind}: {message}") from None
        except SessionError as error:
            if str(error) == NO_AGENT:
                # The workers run the turns: --model is theirs (this server takes none).
                raise RpcError(METHOD_NOT_FOUND, NO_WORKER_AGENT) from None
            raise _busy_or(error) from None
        return {"state": result.state, "reply": result.reply, "queued": result.queued}

    async def _c_abort(self, p: Params) -> dict[str, Any]:
        session_id = p.text("session_id")
        self._session(session_id)
        return {"aborted": await (await self.client()).abort(session_id)}

    async def _c_context(self, p: Params) -> dict[str, Any]:
        session = self._session(p.text("session_id"))
        return context_report(session, session.leaf_id)


def session_id_of(path: str) -> str:
    """The session a ``path`` parameter names: its id, or ``<id>.jsonl`` (folders ignored).

    Raises:
        RpcError: Nothing usable as an id (``-32602``).
    """
    name = Path(path).name
    session_id = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    if not session_id or "\0" in session_id:
        raise RpcError(INVALID_PARAMS, f"{path!r}: not a session id")
    return session_id


def _busy_or(error: SessionError) -> Exception:
    """A workflow's busy refusal as ``-32001``; any other refusal as it is."""
    if str(error) in BUSY_ANSWERS:
        return RpcError(BUSY, str(error))
    return error


def navigate_answer(done: NavigateResult) -> dict[str, Any]:
    """``session.tree.navigate``'s answer, as the one-process server gives it.

    Raises:
        RpcError: A compaction runs (``-32001``, the navigation table refused).
        ModelError: The branch summary failed; history and leaf are unchanged.
        ConflictError: Another writer changed the session first (D27); nothing was applied.
    """
    if done.status == "refused":
        raise RpcError(BUSY, NAVIGATION_BUSY)
    if done.status == "failed":
        if done.error_kind == "conflict":
            raise ConflictError(done.error or "Branch summary conflicted with another writer")
        raise ModelError(
            done.error or "Branch summarization failed", kind=done.error_kind or "fatal"
        )
    return {
        "cancelled": done.status == "cancelled",
        "aborted": done.aborted,
        "editorText": done.editor_text,
        "newLeafId": done.new_leaf_id,
        "oldLeafId": done.old_leaf_id,
        "summaryEntryId": done.summary_entry_id,
        "shortSummary": done.short_summary,
    }


def compress_answer(done: CompressResult) -> dict[str, Any]:
    """``session.compress``'s answer, as the one-process server gives it.

    Raises:
        Cancelled: The compaction was cancelled (``abort``, or a hook).
        ModelError: It failed; the session is unchanged.
        ConflictError: Its commit conflicted with another writer (D27).
        UnavailableError: The cluster failed under it (a worker lost, the store unreachable,
            after the retries); the session is idle again.
    """
    if done.status == "cancelled":
        raise Cancelled(done.reason or "Compaction cancelled")
    if done.status == "conflict":
        raise ConflictError(done.error or "Compaction conflicted with another writer")
    if done.status == "failed" and done.error_kind == UNAVAILABLE_KIND:
        raise UnavailableError(f"Cluster unavailable: {done.error}; nothing was applied")
    if done.status == "failed":
        raise ModelError(done.error or "Compaction failed", kind=done.error_kind or "fatal")
    if done.status != "committed":
        return {"compacted": False, "reason": done.reason or "Nothing to compact"}
    return {
        "compacted": True,
        "entryId": done.entry_id,
        "summary": done.summary,
        "tokensBefore": done.tokens_before,
        "firstKeptEntryId": done.first_kept_entry_id,
        "shortSummary": done.short_summary,
    }
