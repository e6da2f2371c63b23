"""The operation runner: compactions, prunes and branch summaries through the operation table.

Every compaction path runs here: the runtime's automatic and manual compactions, the command
line (``--dry-run`` included), the JSON-RPC server and the benchmark, and :func:`compact` for a
bare plan. They differ only in their ports (a dry run has no journal and its commit reports
instead of appending) and never in the machine or the hooks. A runner takes the ports record,
never the session façade; it returns an :class:`~orchestrator._runtime.types.OperationOutcome`
and does not raise for a model failure or a cancellation, because the calling machine turns the
outcome into its next event.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import anyio
from anyio.lowlevel import RunVar

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.errors import Cancelled, ConflictError, StorageError, model_error
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.names import OperationState
from orchestrator._runtime.admission import Slot, start_slot
from orchestrator._runtime.operation.jobs import BranchJob, CompactionJob, PruneJob
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.summarize import (
    BranchSummaryResult,
    CompactionResult,
    SummaryRoutes,
)
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.types import OperationOutcome
from orchestrator._store.files import DISK_REFUSED
from orchestrator._store.memory import MemoryStore


class OperationRunner:
    """Runs one operation at a time for a session, through its ports.

    Args:
        ports: What operations perform through.
        settings: Compaction settings for planning.
    """

    def __init__(self, ports: Ports, settings: CompactionSettings) -> None:
        self.ports = ports
        self.settings = settings
        self.current: OperationRun | None = None
        self.settled: OperationOutcome | None = None

    def routes_for(self, reason: str | None) -> SummaryRoutes:
        """The summary routes an operation may use.

        D21: an automatic compaction walks the candidate list; a manual compaction and a branch
        summary use the current model's route (the first candidate), with retries.
        """
        return routes_for(self.ports.routes, reason)

    def cancel(self) -> None:
        """Ask the operation in progress, if any, to cancel (D22)."""
        if self.current is not None:
            self.current.cancel()

    async def _run(self, run: OperationRun, slot: Slot) -> OperationOutcome:
        self.current, self.settled = run, None
        try:
            return await run.run(slot)
        except BaseException:
            if run.machine.done:
                # Cancelled from outside, it settled through its table first: how it ended is
                # kept for whoever stopped it (a turn's cancel_compaction), as a return would be.
                self.settled = run.outcome()
            raise
        finally:
            slot.release()
            self.current = None

    async def compaction(
        self,
        *,
        reason: str,
        focus: str | None = None,
        dry_run: bool = False,
        slot: Slot | None = None,
    ) -> OperationOutcome:
        """Compact the active branch: plan, hooks, summaries, one appended entry.

        Args:
            reason: ``threshold``, ``overflow`` or ``manual``.
            focus: The user's instructions.
            dry_run: Everything but the append (and the journal) happens.
            slot: A start slot the caller holds and hands over (given back here in any case);
                without it, the operation queues for one (admission.py).
        """
        session = self.ports.session
        if slot is None:
            slot = await start_slot()  # held until the operation first waits (admission.py)
        try:
            routes = self.routes_for(reason)
            plan = functools.partial(
                CompactionJob,
                self.ports,
                routes,
                reason=reason,
                settings=self.settings,
                focus=focus,
            )
            if session is None or isinstance(session.store, MemoryStore) or session.context_is_live:
                # With the live context, planning reads its index: O(kept), under a millisecond
                # at 100k entries, less than the hop to a worker thread and back (issue 9).
                job = plan()
            else:
                # The first context build is O(entries): a worker thread does it, one at a time,
                # so the event loop keeps serving other sessions meanwhile (issue 9). It only
                # reads the session, which no one changes while its compaction starts. Shielded:
                # a cancel arriving meanwhile is seen by the operation's first step, as on the
                # loop.
                with anyio.CancelScope(shield=True):
                    job = await anyio.to_thread.run_sync(plan, limiter=_planner())
            run = OperationRun(self.ports, job, routes=routes, dry_run=dry_run)
        except BaseException:
            slot.release()  # an operation that never started (a failed plan) keeps no slot
            raise
        return await self._run(run, slot)

    async def prune(self, *, slot: Slot | None = None) -> OperationOutcome:
        """Prune old tool outputs (D23) as one journaled operation; no model is called.

        Args:
            slot: A start slot the caller holds and hands over, as for :meth:`compaction`.
        """
        assert self.ports.session is not None
        if slot is None:
            slot = await start_slot()
        try:
            run = OperationRun(self.ports, PruneJob(self.ports.session), routes=self.ports.routes)
        except BaseException:
            slot.release()  # as for a compaction: an operation that never started keeps no slot
            raise
        return await self._run(run, slot)

    async def branch_summary(
        self,
        plan: BranchPlan,
        *,
        new_leaf_id: str | None,
        old_leaf_id: str | None,
        instructions: str | None,
        replace_instructions: bool,
    ) -> OperationOutcome:
        """Summarize an abandoned branch and attach the summary at the new position (D17)."""
        routes = self.routes_for("navigation")
        slot = await start_slot()
        job = BranchJob(
            routes,
            plan,
            new_leaf_id=new_leaf_id,
            old_leaf_id=old_leaf_id,
            instructions=instructions,
            replace_instructions=replace_instructions,
        )
        return await self._run(OperationRun(self.ports, job, routes=routes), slot)


def routes_for(routes: SummaryRoutes, reason: str | None) -> SummaryRoutes:
    """The routes an operation of ``reason`` may use (D21; :meth:`OperationRunner.routes_for`)."""
    if reason in ("manual", "navigation"):
        return dataclasses.replace(routes, candidates=routes.candidates[:1])
    return routes


_PLANNER: RunVar[anyio.CapacityLimiter] = RunVar("orchestrator_planner")


def _planner() -> anyio.CapacityLimiter:
    """The event loop's planning thread: one, so the loop competes for the GIL with one thread."""
    try:
        return _PLANNER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _PLANNER.set(limiter)
        return limiter


def raise_for(outcome: OperationOutcome, what: str = "Compaction") -> OperationOutcome:
    """Return a good outcome; raise for a failed, conflicting or cancelled one.

    Raises:
        Cancelled: The operation was cancelled (a hook, or on request).
        ModelError: It failed; ``kind`` and ``retry_after`` keep the model failure's.
        ConflictError: Its commit met another writer's change (D27); the store's reason.
        StorageError: The disk refused its commit's write (full, a quota, an I/O error).
    """
    if outcome.status == OperationState.CANCELLED:
        raise Cancelled(outcome.reason or f"{what} cancelled")
    if outcome.status == OperationState.CONFLICT:
        raise ConflictError(outcome.error or f"{what} conflicted with another writer")
    if outcome.status == OperationState.FAILED:
        if outcome.cause is not None:
            refused = storage_failure(outcome.cause, outcome.error)
            if refused is not None:
                raise refused
        raise model_error(
            outcome.error_kind or "fatal",
            outcome.error or f"{what} failed",
            retry_after=outcome.retry_after,
        ) from outcome.cause
    return outcome


def storage_failure(cause: BaseException, message: str | None) -> StorageError | None:
    """The :class:`StorageError` a commit that failed with ``cause`` raises, if the disk refused.

    The store raises one naming the file; a bare system error of the disk (from a call the
    store does not wrap) becomes one with the commit's message.
    """
    if isinstance(cause, StorageError):
        return cause
    if isinstance(cause, OSError) and cause.errno in DISK_REFUSED:
        refused = StorageError(message or str(cause), cause.errno)
        refused.__cause__ = cause
        return refused
    return None


def _bare_ports(routes: SummaryRoutes) -> Ports:
    return Ports(session=None, routes=routes, sleep=routes.sleep)


async def compact(
    plan: CompactionPlan,
    summarizer: SummaryRoutes,
    *,
    focus: str | None = None,
    kept_messages: Sequence[Any] = (),
) -> CompactionResult:
    """Summarize a compaction plan through the operation table, without committing it.

    The same machine as every other compaction runs (hooks, candidates, retries, halving);
    there is no session, so the commit only reports the result.

    Args:
        plan: From :func:`~orchestrator.plan_compaction`.
        summarizer: Routes and settings.
        focus: The user's instructions ("Additional focus").
        kept_messages: The messages the compaction keeps (for the short summary).

    Returns:
        The result to commit.

    Raises:
        ModelError: every route failed (its kind and retry-after are the last failure's).
    """
    ports = _bare_ports(summarizer)
    job = CompactionJob(
        ports,
        summarizer,
        reason="manual",
        settings=CompactionSettings(),
        focus=focus,
        plan=plan,
        kept=kept_messages,
    )
    run = OperationRun(ports, job, routes=summarizer, dry_run=True)
    outcome = raise_for(await run.run())
    assert outcome.result is not None
    return outcome.result


async def summarize_branch(
    plan: BranchPlan,
    summarizer: SummaryRoutes,
    *,
    instructions: str | None = None,
    replace_instructions: bool = False,
) -> BranchSummaryResult:
    """Summarize an abandoned branch through the operation table, without attaching it.

    With no messages to summarize no model is called and the summary is
    ``No content to summarize``.

    Raises:
        ModelError: every route failed (the session is unchanged).
    """
    _, result = await detached_branch_summary(
        _bare_ports(summarizer),
        summarizer,
        plan,
        instructions=instructions,
        replace_instructions=replace_instructions,
        dry_run=True,
    )
    return result


async def detached_branch_summary(
    ports: Ports,
    routes: SummaryRoutes,
    plan: BranchPlan,
    *,
    instructions: str | None,
    replace_instructions: bool,
    dry_run: bool = False,
    session_id: str | None = None,
) -> tuple[str, BranchSummaryResult]:
    """Summarize a branch through the operation table; attaching it is someone else's work.

    Returns:
        The operation's id and the result.

    Raises:
        ModelError: Every route failed.
    """
    job = BranchJob(
        routes,
        plan,
        new_leaf_id=None,
        old_leaf_id=plan.old_leaf_id,
        instructions=instructions,
        replace_instructions=replace_instructions,
    )
    run = OperationRun(ports, job, routes=routes, dry_run=dry_run, session_id=session_id)
    raise_for(await run.run(), "Branch summarization")
    return run.id, job.result(run.texts, run.models, run.written)
