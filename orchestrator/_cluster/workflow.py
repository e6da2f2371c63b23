"""The session workflow: one per session, its id the session id (issue 10).

Theory of operation. Temporal runs at most one workflow per id, so making the session id the
workflow id gives the fleet one owner per session by construction: every request for a session,
from any client through any server, reaches the same workflow, on whichever worker holds it now.
Requests are updates (``prompt``, ``compress``) and signals (``abort``, ``close``); what the
session is doing is a query (``state``). The workflow keeps nothing a store does not already
keep: it completes after ``idle_s`` without work, and the next request starts a fresh run with
the same id.

Turns. The session's turn machine is a :class:`~orchestrator._cluster.turn_flow.TurnFlow`: the
shipped turn table stepped by the pure step, as the one-process turn driver steps it. A prompt
runs a turn to its end (automatic compactions, overflow recovery and agent retries included, as
the table decides); a prompt while a run is in progress is queued and the table takes it as a
follow-up when the machine rests, as in one process. ``compress`` steps ``manual_compact``
through the same table: it stops a running agent first (D22) and the interrupted turn is not
resumed. One manual compaction at a time: a second ``compress`` while one is asked for or runs
is refused by the validator (the refusal is not written to the history) and, should two arrive
in the same workflow task, by the handler itself, whose check-and-set runs without an await.

Histories recorded before turns were hosted ran ``compress`` straight through the operation
table; :func:`temporalio.workflow.patched` keeps them replaying that way.

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
        NO_AGENT,
        NO_AGENT_TYPE,
        WORKFLOW_NAME,
        CompressRequest,
        CompressResult,
        Op,
        PromptRequest,
        PromptResult,
        SessionStart,
        TurnPolicy,
    )
    from orchestrator._cluster.flow import SHORT, OperationFlow
    from orchestrator._cluster.turn_flow import NEVER_RAN, ManualCompaction, TurnFlow
    from orchestrator._lifecycle.machine import load_machine

TURN_PATCH = "turn-table"
"""The patch that routes ``compress`` through the turn table (older histories did not)."""


@workflow.defn(name=WORKFLOW_NAME)
class SessionWorkflow:
    """One session's lifecycle, hosted by Temporal."""

    def __init__(self) -> None:
        self._flow: OperationFlow | None = None
        self._busy = False
        self._closing = False
        self._done: list[str] = []
        self._turn: TurnFlow | None = None
        self._policy: TurnPolicy | None = None

    def _turns(self) -> TurnFlow:
        if self._turn is None:
            self._turn = TurnFlow(
                load_machine("turn"), load_machine("operation"), workflow.info().workflow_id
            )
        return self._turn

    def _working(self) -> bool:
        return self._busy or (self._turn is not None and self._turn.running)

    @workflow.run
    async def run(self, start: SessionStart) -> dict[str, Any]:
        """Serve requests until idle for ``start.idle_s`` (or closed), then complete."""
        idle = timedelta(seconds=start.idle_s)
        while not self._closing:
            try:
                await workflow.wait_condition(
                    lambda: self._working() or self._closing, timeout=idle
                )
            except TimeoutError:
                if not self._working():
                    break
            await workflow.wait_condition(lambda: not self._working())
        await workflow.wait_condition(workflow.all_handlers_finished)
        return {"sessionId": start.session_id, "operations": self._operations()}

    def _operations(self) -> list[str]:
        return [*self._done, *(self._turn.operations if self._turn is not None else [])]

    async def _turn_policy(self) -> TurnPolicy:
        """The worker's turn settings, asked once per run (recorded in the history)."""
        if self._policy is None:
            policy: TurnPolicy = await workflow.execute_activity(
                "turn_policy", start_to_close_timeout=SHORT, result_type=TurnPolicy
            )
            self._policy = self._policy or policy
        return self._policy

    @workflow.update(name="prompt")
    async def prompt(self, request: PromptRequest) -> PromptResult:
        """Run a turn for ``request.text`` (``session.prompt``); queued while a run is in progress.

        Raises:
            ApplicationError: ``NoAgent``: the worker has no agent (``serve`` without ``--model``).
        """
        turn = self._turns()
        policy = await self._turn_policy()
        if not policy.has_agent:
            raise ApplicationError(NO_AGENT, type=NO_AGENT_TYPE, non_retryable=True)
        turn.policy = policy
        if turn.running:
            turn.queue(request.text)
            return PromptResult(state=turn.state, queued=True)
        await turn.run("user_prompt", request.text)
        reply = turn.counters.last_reply
        return PromptResult(state=turn.state, reply=None if reply is None else dict(reply))

    @workflow.update(name="compress")
    async def compress(self, request: CompressRequest) -> CompressResult:
        """Compact the session now (``session.compress``), through the operation table.

        Raises:
            ApplicationError: ``Busy``: a compaction is already running in this session.
        """
        self._refuse_when_busy(request)
        if workflow.patched(TURN_PATCH):
            return await self._compress_through_the_turn_table(request)
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

    async def _compress_through_the_turn_table(self, request: CompressRequest) -> CompressResult:
        turn = self._turns()
        policy = await self._turn_policy()
        # From here to the run (or the interrupt) nothing awaits: check and act at once.
        self._refuse_when_busy(request)
        manual = turn.manual = ManualCompaction(focus=request.focus, reason=request.reason)
        if turn.running:
            turn.interrupt("manual_compact")
            await workflow.wait_condition(lambda: manual.done)
        else:
            turn.policy = policy
            await turn.run("manual_compact")
        if manual.outcome is None:
            return CompressResult(operation_id="", status="cancelled", reason=NEVER_RAN)
        return manual.outcome

    @compress.validator
    def _refuse_when_busy(self, request: CompressRequest) -> None:
        turn = self._turn
        manual = turn is not None and (turn.manual is not None or turn.state == "manual_compacting")
        if self._busy or manual:
            raise ApplicationError(BUSY_COMPACTING, type="Busy", non_retryable=True)

    @workflow.signal(name="abort")
    def abort(self) -> None:
        """Stop the work in progress, if any; the table decides what that means (D22)."""
        if self._flow is not None:
            self._flow.interrupt("cancel")
        if self._turn is not None:
            self._turn.interrupt("abort")

    @workflow.signal(name="close")
    def close(self) -> None:
        """Complete once the work in progress has ended."""
        self._closing = True

    @workflow.query(name="state")
    def state(self) -> dict[str, Any]:
        """What the session is doing: the operation machine's state, if one runs."""
        flow, turn = self._flow, self._turn
        if flow is None and turn is not None and turn.flow is not None and not turn.flow.done:
            flow = turn.flow
        return {
            "busy": self._working(),
            "turnState": "idle" if turn is None else turn.state,
            "operation": None if flow is None else flow.op.operation_id,
            "operationState": None if flow is None else flow.state,
            "operations": self._operations(),
        }
