"""The session workflow: one per session, its id the session id (issue 10).

Theory of operation. Temporal runs at most one workflow per id, so making the session id the
workflow id gives the fleet one owner per session by construction: every request for a session,
from any client through any server, reaches the same workflow, on whichever worker holds it now.
Requests are updates (``compress``) and signals (``abort``, ``close``); what the session is
doing is a query (``state``). The workflow keeps nothing a store does not already keep: it
completes after ``idle_s`` without work, and the next request starts a fresh run with the same id.

One compaction at a time, as in the one-process server: a second ``compress`` while one runs is
refused by the validator (the refusal is not written to the history) and, should two arrive in
the same workflow task, by the handler itself, whose check-and-set runs without an await.

The operation itself is :class:`~orchestrator._cluster.flow.OperationFlow`: the shipped
operation table stepped by the pure step, effects as activities. The tables are data the
worker loaded (:func:`~orchestrator._cluster.worker.load_tables`) before any workflow ran, so
the workflow reads no file and a replay steps exactly the table the history was made with.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from orchestrator._cluster.contract import (
        BUSY_COMPACTING,
        WORKFLOW_NAME,
        CompressRequest,
        CompressResult,
        Op,
        SessionStart,
    )
    from orchestrator._cluster.flow import OperationFlow
    from orchestrator._lifecycle.machine import load_machine


@workflow.defn(name=WORKFLOW_NAME)
class SessionWorkflow:
    """One session's lifecycle, hosted by Temporal."""

    def __init__(self) -> None:
        self._flow: OperationFlow | None = None
        self._busy = False
        self._closing = False
        self._done: list[str] = []

    @workflow.run
    async def run(self, start: SessionStart) -> dict[str, Any]:
        """Serve requests until idle for ``start.idle_s`` (or closed), then complete."""
        idle = timedelta(seconds=start.idle_s)
        while not self._closing:
            try:
                await workflow.wait_condition(lambda: self._busy or self._closing, timeout=idle)
            except TimeoutError:
                if not self._busy:
                    break
            await workflow.wait_condition(lambda: not self._busy)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return {"sessionId": start.session_id, "operations": list(self._done)}

    @workflow.update(name="compress")
    async def compress(self, request: CompressRequest) -> CompressResult:
        """Compact the session now (``session.compress``), through the operation table.

        Raises:
            ApplicationError: ``Busy``: a compaction is already running in this session.
        """
        self._refuse_when_busy(request)
        self._busy = True
        try:
            op = Op(
                session_id=workflow.info().workflow_id,
                operation_id=workflow.uuid4().hex[:12],
                reason=request.reason,
                focus=request.focus,
            )
            self._flow = OperationFlow(load_machine("operation"), op)
            result = await self._flow.run()
            self._done.append(f"{result.operation_id}:{result.status}")
            return result
        finally:
            self._busy = False
            self._flow = None

    @compress.validator
    def _refuse_when_busy(self, request: CompressRequest) -> None:
        if self._busy:
            raise ApplicationError(BUSY_COMPACTING, type="Busy", non_retryable=True)

    @workflow.signal(name="abort")
    def abort(self) -> None:
        """Cancel the compaction in progress, if any; the table decides what that means (D22)."""
        if self._flow is not None:
            self._flow.interrupt("cancel")

    @workflow.signal(name="close")
    def close(self) -> None:
        """Complete once the work in progress has ended."""
        self._closing = True

    @workflow.query(name="state")
    def state(self) -> dict[str, Any]:
        """What the session is doing: the operation machine's state, if one runs."""
        flow = self._flow
        return {
            "busy": self._busy,
            "operation": None if flow is None else flow.op.operation_id,
            "operationState": None if flow is None else flow.state,
            "operations": list(self._done),
        }
