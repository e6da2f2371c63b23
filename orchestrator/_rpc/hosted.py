"""``summary.compact``, ``summary.branch`` and ``summary.cancel``: summaries for pi's sessions.

Theory of operation. pi's extension (``integrations/pi``) sends the preparation pi hands it in
``session_before_compact`` or ``session_before_tree``; I turn it into a plan
(:mod:`~orchestrator._core.pi_preparation`), run it through the operation table for a session
this server does not own (:mod:`~orchestrator._runtime.operation.hosted`), and answer the summary,
``details`` and ``usage`` that pi appends. Nothing here opens the session: pi holds the file,
and the server writes only its journal beside it (``session_file``, when given), which it opens
for the operation and closes after. A file the server has open itself (``session.open``) is
refused ``-32001``: its runtime owns that journal, and two writers of one session is the race
D27 exists to prevent.

Cancelling. Closing a connection does not stop its requests (docs/server.md), and pi's abort
signal must: a request may name a ``cancel_key``, and ``summary.cancel`` with that key cancels
it. The request is then answered ``-32003`` with nothing to commit, after its operation settled
as ``cancelled`` in the journal. Keys are the connection's own. A cancel that arrives before
its request started (both are in flight at once) is remembered, a few per connection, and the
request is cancelled when it starts.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio

from orchestrator._core.errors import SessionError
from orchestrator._core.pi_preparation import (
    PreparationError,
    branch_plan_from_pi,
    compaction_plan_from_pi,
)
from orchestrator._lifecycle.admission import admit
from orchestrator._lifecycle.guards import SessionFacts
from orchestrator._lifecycle.names import SessionEvent
from orchestrator._rpc.errors import CANCELLED, INVALID_PARAMS, RpcError
from orchestrator._rpc.protocol import Method, Params, Peer
from orchestrator._runtime.operation.hosted import (
    REASONS,
    branch_budget,
    compact_hosted,
    summarize_branch_hosted,
)
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports, default_routes, traced_routes
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.files import require_session_file
from orchestrator._store.journal import Journal
from orchestrator._telemetry.tracing import LifecycleTracer

EARLY_CANCELS = 16
"""How many cancels of requests not started yet a connection may leave waiting."""
_COMMON = frozenset({"session_file", "session_id", "preparation", "cancel_key"})
_COMMON |= {"custom_instructions"}
PARAMS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "summary.compact": _COMMON | {"reason", "will_retry"},
        "summary.branch": _COMMON | {"replace_instructions"},
        "summary.cancel": frozenset({"cancel_key"}),
    }
)
"""The ``summary.*`` methods and the parameters each takes."""

Key = tuple[int, str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HostedOptions:
    """What the summaries for pi's sessions run with.

    Attributes:
        routes: The server's summary routes (``None``: the offline summarizer).
        settings: Timeouts, the operation deadline, the branch reserve.
        resolve: Turns a client's path into the file's absolute path (``-32602`` outside the
            served directory).
        owned: Whether the server has that file open as a session of its own.
        tracer: Where spans go.
    """

    routes: SummaryRoutes | None
    settings: RuntimeSettings
    resolve: Callable[[str], Path]
    owned: Callable[[Path], bool]
    tracer: LifecycleTracer = dataclasses.field(default_factory=lambda: LifecycleTracer(None))


class HostedMethods:
    """The three methods, with the cancel scopes of the requests running.

    Args:
        options: Routes, settings and the path rules of the hub.
    """

    def __init__(self, options: HostedOptions) -> None:
        self.options = options
        self._running: dict[Key, anyio.CancelScope] = {}
        # Cancels that came before their request, per connection (forgotten with it).
        self._early: weakref.WeakKeyDictionary[Peer, deque[str]] = weakref.WeakKeyDictionary()
        self._early_here: deque[str] = deque(maxlen=EARLY_CANCELS)  # in-process callers

    def methods(self) -> dict[str, Method]:
        """The method table rows."""
        handlers = {
            "summary.compact": self._m_compact,
            "summary.branch": self._m_branch,
            "summary.cancel": self._m_cancel,
        }
        return {name: Method(handler=handlers[name], params=PARAMS[name]) for name in PARAMS}

    # -- the methods ---------------------------------------------------------------------------

    async def _m_compact(self, p: Params) -> dict[str, Any]:
        reason = p.optional_text("reason") or "manual"
        if reason not in REASONS:
            raise RpcError(
                INVALID_PARAMS, "summary.compact: 'reason' must be manual, threshold or overflow"
            )
        p.flag("will_retry")  # pi's to act on (it retries the turn); only its type is checked
        _cancel_key(p)
        plan = _planned(p, compaction_plan_from_pi, p.obj("preparation"))
        focus = p.optional_text("custom_instructions")
        ports, journal = self._ports(p)
        try:
            op_id, result = await self._cancellable(
                p,
                compact_hosted(ports, plan, reason=reason, focus=focus, session_id=_session_id(p)),
            )
        finally:
            _close(journal)
        return {
            "summary": result.summary,
            "firstKeptEntryId": result.first_kept_entry_id,
            "tokensBefore": result.tokens_before,
            "details": result.details,
            "usage": result.usage,
            "model": result.model,
            "operationId": op_id,
        }

    async def _m_branch(self, p: Params) -> dict[str, Any]:
        preparation = p.obj("preparation")
        instructions = p.optional_text("custom_instructions")
        replace = p.flag("replace_instructions")
        _cancel_key(p)
        if replace and not instructions:
            raise RpcError(
                INVALID_PARAMS,
                "summary.branch: 'replace_instructions' needs 'custom_instructions' (the prompt "
                "to use instead)",
            )
        settings = self.options.settings
        ports, journal = self._ports(p)
        try:
            budget = branch_budget(ports.routes, settings.branch_reserve_tokens)
            plan = _planned(p, lambda prep: branch_plan_from_pi(prep, budget), preparation)
            op_id, result = await self._cancellable(
                p,
                summarize_branch_hosted(
                    ports,
                    plan,
                    instructions=instructions,
                    replace_instructions=replace,
                    session_id=_session_id(p),
                ),
            )
        finally:
            _close(journal)
        return {
            "summary": result.summary,
            "details": result.details,
            "usage": result.usage,
            "model": result.model,
            "operationId": op_id,
        }

    async def _m_cancel(self, p: Params) -> dict[str, Any]:
        key = p.text("cancel_key")
        scope = self._running.get((id(p.peer), key))
        if scope is not None:
            scope.cancel()
            return {"cancelled": True}
        self._early_for(p.peer).append(key)
        return {"cancelled": False}

    # -- helpers -------------------------------------------------------------------------------

    def _early_for(self, peer: Peer | None) -> deque[str]:
        if peer is None:
            return self._early_here
        return self._early.setdefault(peer, deque(maxlen=EARLY_CANCELS))

    def _ports(self, p: Params) -> tuple[Ports, Journal | None]:
        options, settings = self.options, self.options.settings
        journal = None
        shown = p.optional_text("session_file")
        if shown is not None:
            path = options.resolve(shown)
            try:
                require_session_file(path, shown)
            except SessionError as exc:
                raise RpcError(INVALID_PARAMS, f"{p.method}: {exc}") from None
            # A session this server has open: the session machine's "hosted" rows decide.
            facts = SessionFacts(session_open=options.owned(path))
            admit(SessionEvent.HOSTED, facts, method=p.method, path=shown)
            journal = Journal.open(path)
        routes = options.routes or default_routes(None, settings)
        ports = Ports(
            session=None,
            routes=traced_routes(routes, options.tracer, short_summary=False),
            journal=journal,
            tracer=options.tracer,
            sleep=routes.sleep,
            timeout_s=settings.model_timeout_s,
            idle_s=settings.model_idle_timeout_s,
            deadline_s=settings.operation_deadline_s,
        )
        return ports, journal

    async def _cancellable(self, p: Params, work: Any) -> Any:
        key = _cancel_key(p)
        token = (id(p.peer), key) if key is not None else None
        if token is not None and token in self._running:
            work.close()  # never started
            raise RpcError(INVALID_PARAMS, f"{p.method}: 'cancel_key' {key!r} is already in use")
        with anyio.CancelScope() as scope:
            if token is not None:
                self._running[token] = scope
                early = self._early_for(p.peer)
                if token[1] in early:
                    early.remove(token[1])
                    scope.cancel()
            try:
                return await work
            finally:
                if token is not None:
                    del self._running[token]
        raise RpcError(
            CANCELLED,
            f"{p.method}: cancelled; nothing to commit",
            {"kind": "cancelled", "applied": False},
        )


def _planned(p: Params, make: Callable[[dict[str, Any]], Any], preparation: dict[str, Any]) -> Any:
    try:
        return make(preparation)
    except PreparationError as exc:
        raise RpcError(INVALID_PARAMS, f"{p.method}: {exc}") from None


def _cancel_key(p: Params) -> str | None:
    key = p.optional_text("cancel_key")
    if key == "":
        raise RpcError(INVALID_PARAMS, f"{p.method}: 'cancel_key' must be a non-empty string")
    return key


def _session_id(p: Params) -> str | None:
    return p.optional_text("session_id")


def _close(journal: Journal | None) -> None:
    if journal is not None:
        journal.close(durable=True)
