"""The compaction side of the turn flow: the operations a turn starts, cancels and reports.

The effects of :class:`~orchestrator._cluster.turn.flow.TurnFlow` that run the operation table
(the theory of operation of the flow is there). They are apart from the loop because they are
what starts child flows of another table; they are a mixin of the flow, whose fields they share
(:mod:`~orchestrator._cluster.turn.host`):

* ``start_*_compaction`` runs one :class:`~orchestrator._cluster.operation.flow.OperationFlow` (the
  operation table, its own activities) in flight; ``cancel_compaction`` interrupts it with
  ``cancel`` and waits until it settled through its own table.
* ``prune_tool_outputs`` runs one prune operation (the operation table's prune rows, its
  ``rewrite`` activity) when the worker prunes (D23); the core re-measures the context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from temporalio import workflow

from orchestrator._cluster.calls import Op, TurnCall
from orchestrator._cluster.contract import CompressResult
from orchestrator._cluster.operation.flow import OperationFlow
from orchestrator._cluster.turn.host import FlowHost
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._lifecycle.names import OperationState, ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.operation.compact_hooks import retries_after
from orchestrator._runtime.turn.core import Ending, result_fields

_STATUS = {"committed": "completed", "skipped": "skipped", "cancelled": "cancelled"}
"""``compaction_update``'s status for an operation's end (any other end: ``failed``)."""
NEVER_RAN = "Compaction cancelled: the session closed before it ran"


@dataclasses.dataclass(slots=True)
class ManualCompaction:
    """A compaction asked for (``compress``), and its outcome once the run hands it over."""

    focus: str | None
    reason: str = "manual"
    outcome: CompressResult | None = None
    done: bool = False


class FlowCompactions(FlowHost):
    """The compaction side of the turn table, mixed into ``TurnFlow`` (whose fields it shares)."""

    # The flow's fields only this side uses (set by TurnFlow.__init__).
    operation: MachineDef
    outcome: CompressResult | None
    manual: ManualCompaction | None
    flow: OperationFlow | None
    operations: list[str]

    if TYPE_CHECKING:  # the flow's journal (see FlowHost)

        async def _flush(self, compact_failed: dict[str, Any] | None = None) -> None: ...

    async def prune(self) -> int:
        """Run one prune operation (the operation table's prune rows); the tokens it saved."""
        outcome = await self._operation(await self._start_flow(kind="prune", reason="threshold"))
        return outcome.tokens_saved

    async def compaction(self, reason: str) -> Report | None:
        """Run one compaction operation (a child flow of the operation table) in flight."""
        focus = None
        if reason == "manual":
            request = self.manual or ManualCompaction(focus=None)
            reason, focus = request.reason, request.focus
        return await self._compaction(reason, focus)

    async def _compaction(self, reason: str, focus: str | None) -> Report | None:
        self.outcome = None
        flow = await self._start_flow(reason=reason, focus=focus)

        async def work() -> Report:
            result = await self._operation(flow)
            self.outcome = result
            return Report(outcome=ReportOutcome(result.status))

        return await self._in_flight(work)

    async def _start_flow(self, **op: Any) -> OperationFlow:
        """A new operation's flow; the turn's steps so far ride with its ``prepare`` (in order)."""
        new = Op(session_id=self.session_id, operation_id=workflow.uuid4().hex[:12], **op)
        flow = self.flow = OperationFlow(self.operation, new, carry=self._carried)
        return flow

    def _carried(self) -> tuple[TurnCall | None, Callable[[], None]]:
        """The turn's steps not yet journaled, for ``prepare``; and what to do if it was lost."""
        if not self.journal.lines:
            return None, lambda: None
        call, lines = self._call()
        return call, lambda: self.journal.lost(lines)

    async def _operation(self, flow: OperationFlow) -> CompressResult:
        """Run an operation with the events one process's operation runner emits."""
        op = flow.op
        self.emit("compaction_update", id=op.operation_id, kind=op.kind, status="in_progress")
        outcome = await flow.run()
        self.operations.append(f"{outcome.operation_id}:{outcome.status}")
        status = _STATUS.get(outcome.status, "failed")
        self.emit("compaction_update", id=op.operation_id, kind=op.kind, status=status)
        if outcome.status == "committed" and op.kind == "compaction":
            self.emit(
                "session_compact",
                entryId=outcome.entry_id,
                fromExtension=outcome.from_extension,
                reason=op.reason,
                willRetry=retries_after(op.reason),
            )
        elif outcome.compact_failed is not None:
            self.emit("session_compact_failed", **outcome.compact_failed)
        return outcome

    def ending(self) -> Ending | None:
        """How the last compaction ended (its estimate after a commit measured by the worker)."""
        outcome = self.outcome
        if outcome is None:
            return None
        committed = outcome.status == "committed"
        return Ending(
            status=outcome.status,
            reason=outcome.reason,
            error=outcome.error,
            result=result_fields(outcome) if committed else None,
            estimate_after=outcome.estimate_after,
        )

    async def compact_failed(self, payload: Mapping[str, Any]) -> None:
        """Record ``session_compact_failed``; the worker's hooks hear it with the journal."""
        self.emit("session_compact_failed", **payload)
        await self._flush(compact_failed=dict(payload))

    async def cancel_compaction(self) -> None:
        """Interrupt the compaction's flow with ``cancel`` and wait until it settled."""
        # The operation settles through its own table's cancel row, then reports as usual.
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if self.flow is not None:
            self.flow.interrupt("cancel")
        await task

    def hand_manual(self, *, never_ended: bool) -> None:
        """Hand the manual compaction's outcome (``cancelled`` when it never ended) over."""
        outcome = self.outcome
        if never_ended:
            operation_id = outcome.operation_id if outcome else ""
            outcome = CompressResult(operation_id=operation_id, status=OperationState.CANCELLED)
            self.outcome = outcome
        request, self.manual = self.manual, None
        if request is not None:
            request.outcome = outcome
            request.done = True
