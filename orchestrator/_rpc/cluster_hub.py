"""The JSON-RPC methods backed by the cluster: ``orchestrator serve --temporal`` (issue 10).

Theory of operation. :class:`ClusterHub` is the one hub (:class:`~orchestrator._rpc.hub.RpcHub`)
over a :class:`ClusterHost`: the same methods, parameters, answers and error codes as
:class:`~orchestrator._rpc.hub.SessionHub`, so a client cannot tell which host it talks to. The
difference is where the work happens. This server owns nothing: a
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

Operations. A ``session.compress`` or ``session.tree.navigate`` is the workflow update named
by its operation id (``compress:ID``, ``navigate:ID``; :mod:`~orchestrator._rpc.operations`):
Temporal keeps its outcome with the workflow run, so ``session.operation`` on any server
(:func:`recall_operation`) finds it, also after the server that asked for it died or lost
Temporal for a while.

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
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio

from orchestrator._cluster.client import ClusterClient
from orchestrator._cluster.contract import (
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
    BusyError,
    Cancelled,
    ConflictError,
    NoAgentError,
    SessionError,
    UnavailableError,
    model_error,
)
from orchestrator._lifecycle.admission import CLOSE_WHILE_BUSY, NAVIGATE_WHILE_WORKING, admit
from orchestrator._lifecycle.guards import SessionFacts
from orchestrator._lifecycle.names import SessionEvent
from orchestrator._rpc import host
from orchestrator._rpc.errors import (
    CANCELLED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RpcError,
    error_for,
    one_line,
)
from orchestrator._rpc.hosted import PARAMS as SUMMARY_PARAMS
from orchestrator._rpc.hub import RpcHub
from orchestrator._rpc.operations import OPERATION_ID, Operation, with_id
from orchestrator._rpc.protocol import Method, Params, Peer
from orchestrator._runtime.navigation.moves import recorded_position
from orchestrator._store.reports import context_report, tree_rows
from orchestrator._store.session import Session

__all__ = ["CLOSE_WHILE_BUSY", "ClusterHost", "ClusterHub"]

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


class ClusterHost(host.Attached):
    """The sessions of the cluster: their workflows, and the shared store they are read from.

    Its arguments are :class:`ClusterHub`'s.
    """

    def __init__(self, temporal: str, database: str, task_queue: str, client: Any) -> None:
        self.temporal, self.database, self.task_queue = temporal, database, task_queue
        self._client: ClusterClient | None = client
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

    def more_methods(self) -> dict[str, Method]:
        """Pi's ``summary.*`` methods, refused (``-32601``): pi's sessions are not the cluster's."""
        return {
            name: Method(handler=_not_clustered, params=params)
            for name, params in SUMMARY_PARAMS.items()
        }

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

    async def _describe(self, session_id: str) -> host.Described:
        session = self._session(session_id)
        try:
            state = await (await self.client()).state(session_id)
        except (SessionError, UnavailableError):
            state = {"busy": False, "unknown": True}
        busy = bool(state and state.get("busy"))
        described = (state or {}).get("turnState") or ("manual_compacting" if busy else "idle")
        return host.Described(
            session_id=session_id,
            path=self._open[session_id],
            entries=len(session.tree),
            leaf_id=session.leaf_id,
            state="unknown" if state and state.get("unknown") else described,
            busy=busy,
        )

    # -- notifications ----------------------------------------------------------------------------

    def _deliver(self, session_id: str, run: str, events: list[dict[str, Any]]) -> None:
        """Send the events not sent yet, in their order, as one process sends them."""
        sent_run, last = self._sent.get(session_id, ("", -1))
        if run != sent_run:
            last = -1  # a new workflow run numbers from 0 again
        for numbered in events:
            if numbered["seq"] > last:
                last = numbered["seq"]
                self.outlet.tell(session_id, numbered["event"])
        self._sent[session_id] = (run, last)

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
        if not self.outlet.listened(session_id):
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

    # -- requests ---------------------------------------------------------------------------------

    async def open(self, path: str, *, create: bool, peer: Peer | None) -> host.Opened:
        session_id = self.open_id(path)
        session = self._session(session_id)
        problems = [
            {"line": x.line, "code": x.code, "message": x.message} for x in session.problems
        ]
        return host.Opened(await self._describe(session_id), problems, [])

    async def sessions(self) -> list[host.Described]:
        return [await self._describe(s) for s in sorted(self._open)]

    async def close(self, session_id: str) -> None:
        described = await self._describe(session_id)
        # The workflow says only whether it works: the session table refuses on either fact.
        admit(SessionEvent.CLOSE, SessionFacts(turn_running=described.busy))
        self._open.pop(session_id, None)
        self.outlet.ended(session_id)

    async def compress(
        self, session_id: str, focus: str | None, *, operation_id: str | None = None
    ) -> host.Compacted | str:
        self._session(session_id)
        client = await self.client()
        done = await self._forwarding(
            session_id, lambda: client.compress(session_id, focus, operation_id=operation_id)
        )
        return compacted(done)

    async def recall(
        self, session_id: str, operation_id: str, method: str | None
    ) -> dict[str, Any] | None:
        """Ask the cluster: the operation's update, whichever server asked for it (client.py).

        Raises:
            UnavailableError: The Temporal server cannot be reached.
        """
        return await recall_operation(await self.client(), session_id, operation_id, method)

    async def navigate(
        self, session_id: str, request: host.Navigation, *, operation_id: str | None = None
    ) -> dict[str, Any]:
        self._session(session_id)
        asked = NavigateRequest(**dataclasses.asdict(request))
        done = await (await self.client()).navigate(session_id, asked, operation_id=operation_id)
        answer = navigate_answer(done)
        if done.status == "done":
            # The leaf moved: told as one process tells it (not its branch summary's
            # compaction_update: the answer does not carry that operation's id).
            self.outlet.tell(
                session_id,
                {
                    "type": "session_tree",
                    "newLeafId": done.new_leaf_id,
                    "oldLeafId": done.old_leaf_id,
                    "summaryEntryId": done.summary_entry_id,
                },
            )
        return answer

    async def fork(self, session_id: str, entry_id: str, path: str | None) -> host.Forked:
        self._session(session_id)
        # A fork is named like a session to open: its id, or <id>.jsonl (default: a fresh id).
        new_id = session_id_of(path) if path else None
        done = await (await self.client()).fork(
            session_id, ForkRequest(entry_id=entry_id, new_session_id=new_id)
        )
        if done.cancelled or done.session_id is None:
            return host.Forked(None, done.editor_text)
        # Told on the forked session, as one process tells it, before the fork is opened.
        self.outlet.tell(
            session_id,
            {
                "type": "session_fork",
                "previousSessionFile": self._location(session_id),
                "newSessionFile": self._location(done.session_id),
                "entryId": entry_id,
            },
        )
        self._open[done.session_id] = path or done.session_id
        return host.Forked(await self._describe(done.session_id), done.editor_text)

    async def tree(self, session_id: str, peer: Peer | None) -> dict[str, Any]:
        session = self._session(session_id)
        return {
            "sessionId": session.session_id,
            "name": session.tree.session_name(),
            "leafId": session.leaf_id,
            "nodes": tree_rows(session),
        }

    async def prompt(self, session_id: str, text: str) -> host.Prompted:
        self._session(session_id)
        try:
            client = await self.client()
            result = await self._forwarding(session_id, lambda: client.prompt(session_id, text))
        except AgentRaisedError as error:
            # One process lets the agent's exception reach the dispatcher: a bug, -32603.
            message = one_line(str(error)) or error.kind
            raise RpcError(INTERNAL_ERROR, f"Internal error: {error.kind}: {message}") from None
        except NoAgentError:
            # The workers run the turns: --model is theirs (this server takes none).
            raise NoAgentError(NO_WORKER_AGENT) from None
        return host.Prompted(result.state, result.reply, result.queued)

    async def abort(self, session_id: str) -> bool:
        self._session(session_id)
        return await (await self.client()).abort(session_id)

    async def context(self, session_id: str, peer: Peer | None) -> dict[str, Any]:
        session = self._session(session_id)
        return context_report(session, session.leaf_id)


class ClusterHub(RpcHub):
    """The JSON-RPC methods over session workflows and a shared store.

    Args:
        temporal: The Temporal server, ``HOST:PORT``.
        database: The shared store (a PostgreSQL URL or a directory).
        task_queue: Where the workers poll.
        client: A connected client to use instead (tests).
    """

    host: ClusterHost

    def __init__(
        self,
        temporal: str,
        database: str,
        *,
        task_queue: str = TASK_QUEUE,
        client: ClusterClient | None = None,
    ) -> None:
        super().__init__(ClusterHost(temporal, database, task_queue, client))

    async def client(self) -> ClusterClient:
        """The cluster client, connected on first use."""
        return await self.host.client()


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


def navigate_answer(done: NavigateResult) -> dict[str, Any]:
    """``session.tree.navigate``'s answer, as the one-process server gives it.

    Raises:
        BusyError: A compaction or a turn runs (the navigation table refused).
        ModelError: The branch summary failed; history and leaf are unchanged.
        ConflictError: Another writer changed the session first (D27); nothing was applied.
    """
    if done.status == "refused":
        raise BusyError(NAVIGATE_WHILE_WORKING)
    if done.status == "failed":
        if done.error_kind == "conflict":
            raise ConflictError(done.error or "Branch summary conflicted with another writer")
        raise model_error(done.error_kind or "fatal", done.error or "Branch summarization failed")
    return {
        "cancelled": done.status == "cancelled",
        "aborted": done.aborted,
        "editorText": done.editor_text,
        "newLeafId": done.new_leaf_id,
        "oldLeafId": done.old_leaf_id,
        "summaryEntryId": done.summary_entry_id,
        "shortSummary": done.short_summary,
    }


def compacted(done: CompressResult) -> host.Compacted | str:
    """A workflow's compaction outcome: the entry committed, or why nothing was.

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
        raise model_error(done.error_kind or "fatal", done.error or "Compaction failed")
    if done.status != "committed":
        return done.reason or "Nothing to compact"
    return host.Compacted.of(done)


def compress_answer(done: CompressResult) -> dict[str, Any]:
    """``session.compress``'s answer, as the one-process server gives it (see :func:`compacted`)."""
    return host.compress_answer(compacted(done))


async def recall_operation(
    client: ClusterClient, session_id: str, operation_id: str, method: str | None = None
) -> dict[str, Any] | None:
    """``session.operation``'s answer from the cluster: the update named by ``operation_id``.

    Args:
        client: The cluster.
        session_id: The session (its workflow's id).
        operation_id: The operation's id.
        method: The method that asked for it, when known (else each operation's is tried).

    Returns:
        ``{operationId, state, result | error}`` as the original call would have been
        answered; ``None`` when no run of the session's workflow knows the id.

    Raises:
        UnavailableError: The Temporal server cannot be reached.
    """
    for name, hub_method in _UPDATES.items():
        if method is not None and method != hub_method:
            continue
        found = await client.recall(session_id, name, operation_id)
        if found is None:
            continue
        recalled = Operation(
            session_id=session_id, operation_id=operation_id, method=hub_method, asked=""
        )
        if not found.done:
            return recalled.as_json()
        try:
            if found.error is not None:
                raise found.error
            answer = _ANSWERS[name](found.result)
        except Exception as exc:  # noqa: BLE001 - the error the original call was answered
            recalled.end(error=with_id(error_for(exc, hub_method), operation_id))
        else:
            recalled.end({**answer, OPERATION_ID: operation_id})
        return recalled.as_json()
    return None


_UPDATES = {"compress": "session.compress", "navigate": "session.tree.navigate"}
"""The workflow updates that are operations, and the method that asks for each."""
_ANSWERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "compress": compress_answer,
    "navigate": navigate_answer,
}
"""How each update's result is answered (or raised), as its method answers it."""
