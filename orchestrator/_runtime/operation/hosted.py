"""Operations for a session another program owns and writes: pi, through our extension.

Theory of operation. pi plans its compaction (or collects the entries of the branch it leaves),
hands the preparation to its extensions, and appends whatever summary they return. Our pi
extension (``integrations/pi``) sends that preparation to ``orchestrator serve``, which runs it
here through the same operation table as every compaction of ours: the reason's candidate
routes (D21), retries and halvings, the hooks, the per-call timeout and the operation's
deadline, the journal, the traces. Only the commit differs: the ports hold no session, so the
``committing`` step appends nothing; its result goes back to pi, which appends the entry and
marks it ``fromHook``.

The journal is the session file's own (``FILE.journal``), opened without ownership: pi holds
the file, and we write nothing but the journal beside it. The ``committing`` record then names
no entry id (pi makes the entry, after we answer), so a server killed right there leaves an
operation that reopening settles as ``failed`` even if pi went on to append it: the one case
the journal cannot tell, and no data is lost by it (the entry is pi's, in pi's file).

A cancel from outside (the server's request cancelled: pi's abort signal, through the
extension's ``summary.cancel``) settles the operation through the table as ``cancelled``, as for
our own sessions, before the cancellation goes on.
"""

from __future__ import annotations

from anyio.lowlevel import checkpoint

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.errors import FatalModelError
from orchestrator._core.summary_request import FALLBACK_CONTEXT_WINDOW, no_room_for_branch
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.operation.jobs import CompactionJob
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.runner import detached_branch_summary, raise_for, routes_for
from orchestrator._runtime.operation.summarize import (
    BranchSummaryResult,
    CompactionResult,
    SummaryRoutes,
)
from orchestrator._runtime.ports import Ports

REASONS = frozenset({"manual", "threshold", "overflow"})
"""pi's compaction reasons; a manual one uses the current route only, the others every candidate."""


def branch_budget(routes: SummaryRoutes, reserve_tokens: int) -> int:
    """The tokens of the abandoned branch the summarizer may read (as our navigator computes it).

    Raises:
        FatalModelError: The first route's window leaves no room after the reserve;
            nothing is summarized, as for a navigation of ours.
    """
    candidates = routes.candidates
    window = (candidates[0].context_window if candidates else 0) or FALLBACK_CONTEXT_WINDOW
    if window <= reserve_tokens:
        raise FatalModelError(no_room_for_branch(window, reserve_tokens))
    return max(1, window - reserve_tokens)


async def compact_hosted(
    ports: Ports,
    plan: CompactionPlan,
    *,
    reason: str,
    focus: str | None,
    session_id: str | None = None,
) -> tuple[str, CompactionResult]:
    """Summarize pi's compaction plan through the operation table; pi commits the result.

    Args:
        ports: No session; the journal beside pi's file (or none), the server's routes,
            hooks, timeouts and tracer.
        plan: From :func:`~orchestrator._core.pi_preparation.compaction_plan_from_pi`.
        reason: ``manual``, ``threshold`` or ``overflow`` (D21 chooses the routes by it).
        focus: pi's custom instructions.
        session_id: pi's session id, named in the journal.

    Returns:
        The operation's id (its journal records carry it) and the result.

    Raises:
        Cancelled: A hook cancelled it.
        ModelError: Every route failed; nothing is returned to commit.
    """
    assert ports.session is None, "pi owns the session: nothing is committed here"
    routes = routes_for(ports.routes, reason)
    job = CompactionJob(
        ports, routes, reason=reason, settings=CompactionSettings(), focus=focus, plan=plan
    )
    run = OperationRun(ports, job, routes=routes, session_id=session_id)
    await checkpoint()  # a cancel that came before the start ends it here, before any record
    outcome = raise_for(await run.run())
    assert outcome.result is not None
    return run.id, outcome.result


async def summarize_branch_hosted(
    ports: Ports,
    plan: BranchPlan,
    *,
    instructions: str | None,
    replace_instructions: bool,
    session_id: str | None = None,
) -> tuple[str, BranchSummaryResult]:
    """Summarize the branch pi leaves through the operation table; pi attaches the summary.

    Returns:
        The operation's id and the result.

    Raises:
        ModelError: Every route failed (the request as :func:`compact_hosted`'s).
    """
    assert ports.session is None, "pi owns the session: nothing is committed here"
    await checkpoint()
    return await detached_branch_summary(
        ports,
        routes_for(ports.routes, "navigation"),
        plan,
        instructions=instructions,
        replace_instructions=replace_instructions,
        session_id=session_id,
    )
