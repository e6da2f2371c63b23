"""The operation table hosted in a Temporal workflow: the same pure step, effects as activities.

Theory of operation. :class:`OperationFlow` is the workflow-side twin of
:class:`~orchestrator._runtime.operation.run.OperationRun`. It holds the machine's state and steps
it only through the pure :func:`~orchestrator._lifecycle.machine.step` over the shipped table;
what an effect reports becomes the next event through the same functions the anyio driver uses
(:mod:`orchestrator._runtime.outcomes`). So retries, candidate switches, halvings and how the
operation ends are decisions of ``machines/operation.toml`` on both hosts.

Effects that touch the world are activities. Those whose outcome the table judges are made
ONCE (a retry is the table's decision, so Temporal must not make one behind its back):
``run_hooks`` and ``call_model``. The others are idempotent and *delivered* (:data:`DELIVER`:
again after a lost worker or a dropped store connection, see
:mod:`~orchestrator._cluster.delivery`): ``prepare`` only reads; the commit's entry id is
derived from the operation id here, before it runs, so a second delivery finds the entry and
appends nothing; ``finish`` and the journal lines skip the steps already written. That is
delivery, not a decision. Everything but the model call is a *local* activity
(:mod:`~orchestrator._cluster.local`: one history event each); the model call is a regular one
that heartbeats (:data:`HEARTBEAT`), so a dead worker's call is noticed in seconds, and the
operation's first call also makes the first attempt of every later independent request (a
split turn's prefix), as one process does: one activity, and the table takes each answer when
it reaches that request. Effects that only move counters (``next_candidate``, ``next_part``,
``shrink_request``) are workflow code; waits are workflow timers; ``rebuild_context`` has
nothing to do (each activity reads the store afresh). The operation's deadline is no timer: it
bounds what awaits (the model call's schedule-to-close time, the hooks, the waits), and an
effect that ends past it steps ``deadline_passed``.

Journal. Each step becomes a :class:`~orchestrator._cluster.calls.JournalLine` that rides
with the next activity, which writes it (durably) before performing its effect, so the commit's
entry id is journaled before the commit (D24), and no journal activity of its own is needed.
When an activity is lost (its worker died) I cannot know whether it wrote its lines, so the
next activity resends them and the writer skips those it finds.

Interrupts. ``abort`` (a signal) and the operation deadline only record an event; the loop
steps it through the table like any other, and the row's ``stop_work`` cancels the activity in
flight and waits for it to settle (D22). Temporal's cancellation of the
workflow reaches this loop as that same ``cancel`` (the workflow aborts its work, then ends).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy as TemporalRetry
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType
from temporalio.workflow import ActivityCancellationType

from orchestrator._cluster.calls import (
    STORE_UNAVAILABLE,
    Call,
    Op,
    Policy,
    Prepared,
    Reported,
    TurnCall,
    entry_id_for,
)
from orchestrator._cluster.contract import CompressResult
from orchestrator._cluster.local import run_local
from orchestrator._cluster.stepping import NO_DATA, TableFlow
from orchestrator._core.gate import GateSpec
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._lifecycle.names import OperationEvent, OperationState, ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.operation.driver import AWAITING, OperationDriver
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.outcomes import Attempt

ONCE = TemporalRetry(maximum_attempts=1)
"""Model calls and hooks: one attempt; the table decides what a failure means."""
DELIVER = TemporalRetry(
    maximum_attempts=5, initial_interval=timedelta(seconds=1), backoff_coefficient=2.0
)
"""The idempotent activities (planning, the commit, appends, journal writes): delivered again
after a lost worker or a dropped store connection, five attempts 1, 2, 4 and 8 s apart."""
HEARTBEAT = timedelta(seconds=2)
"""A worker that has not heartbeaten for this long is presumed dead; its activity fails over."""
SHORT = timedelta(seconds=60)
"""Time limit of an activity that does not call a model."""
LONG_CALL = timedelta(minutes=10)
"""Time limit of a model call when the operation has no deadline (and of an agent's turn)."""
MIN_LEFT = timedelta(milliseconds=1)
"""The shortest time limit given to work that starts as the deadline passes (Temporal refuses
zero, which means no limit)."""


Carry = Callable[[], tuple[TurnCall | None, Callable[[], None]]]
"""Gives the steps a turn hands its operation's ``prepare``, and what to call if they were lost."""


def _nothing_lost() -> None:
    return None


def model_call_limit(policy: Policy) -> timedelta:
    """The ``call_model`` activity's time limit: the operation's deadline and 30 s.

    The attempt ends itself (a streaming route after its idle timeout, another after
    ``model_timeout_s``) and the deadline's timer interrupts it. A streamed summary may take
    most of the deadline, heartbeating all along, so this only bounds a hang past the deadline;
    with no deadline, :data:`LONG_CALL`.
    """
    if policy.deadline_s is None:
        return LONG_CALL
    return timedelta(seconds=policy.deadline_s + 30)


class OperationFlow(TableFlow):
    """One compaction or branch summary, run by the operation table inside the workflow.

    Args:
        defn: The operation table.
        op: The operation (its id chosen by the workflow, deterministically).
        carry: The steps of the turn that starts the operation, not yet journaled: ``prepare``
            writes them first; called once, it gives them and what to do if they were lost.
    """

    def __init__(self, defn: MachineDef, op: Op, carry: Carry | None = None) -> None:
        self.op = op
        self._carry = carry
        # Every decision that is not I/O, shared with the one-process host (operation_driver.py).
        self.driver = OperationDriver(kind=op.kind, reason=op.reason)
        effects = self.driver.effects(
            {
                "run_hooks": self._run_hooks,
                "call_model": self._call_model,
                "sleep_retry": self._sleep_retry,
                "stop_work": self._stop_in_flight,
                "append_entry": self._append_entry,
                "rewrite_entries": self._rewrite_entries,
                "rebuild_context": self._nothing,
                "emit_result": self._emit_result,
                "drop_hook_result": self._drop_hook_result,
            }
        )
        super().__init__(defn, effects, awaiting=AWAITING)
        self.policy = Policy()
        self._result: dict[str, Any] | None = None
        self._entry_id: str | None = None
        self._pruned_ids: list[str] = []
        self._tokens_saved = 0
        self._compact_failed: dict[str, Any] | None = None
        self._deadline_at: datetime | None = None
        self._early: dict[int, Reported] = {}

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> CompressResult:
        """Plan, then step the table to a final state.

        Raises:
            TransitionError: The table refused a step (a bug, not a model failure).
        """
        turn, lost = self._carry() if self._carry is not None else (None, _nothing_lost)
        try:
            prepared: Prepared = await run_local(
                "prepare",
                Call(op=self.op, turn=turn),
                result_type=Prepared,
                limit=SHORT,
                retry=DELIVER,
            )
        except BaseException:
            lost()  # the turn's steps go back, to be written with its next activity
            raise
        self.policy = policy = prepared.policy
        driver = self.driver
        driver.policy = RetryPolicy(
            enabled=policy.enabled,
            max_retries=policy.max_retries,
            base_delay_ms=policy.base_delay_ms,
            switch_after_ms=policy.switch_after_ms,
            max_delay_ms=policy.max_delay_ms,
        )
        driver.gate, driver.fallback = policy.gate, policy.fallback
        # A branch summary has no hooks, so planning says how many candidates each request has.
        driver.routes = list(prepared.routes)
        driver.skipped = prepared.data.get("reason")
        self._pruned_ids = list(prepared.pruned_ids)
        self.op = dataclasses.replace(
            self.op,
            expect_last_id=prepared.expect_last_id,
            expect_length=prepared.expect_length,
            planned=True,
        )
        if self.policy.deadline_s is not None:
            self._deadline_at = workflow.now() + timedelta(seconds=self.policy.deadline_s)
        try:
            await self._loop(prepared.event, OperationFacts(**prepared.facts), prepared.data)
        except asyncio.CancelledError:
            # The workflow was cancelled: settle through the table's cancel row (D22).
            if not self.done and self.defn.rows_for(self.state, OperationEvent.CANCEL):
                await self._loop(OperationEvent.CANCEL, OperationFacts(), NO_DATA)
            raise
        return self._outcome()

    async def _loop(
        self, event: str | None, facts: OperationFacts, data: Mapping[str, Any]
    ) -> None:
        await self._steps(event, facts, data)
        if self.journal.lines:
            await self._flush()

    def _journal_data(self, source: str, dest: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
        kept = self.driver.journal_data(source, data)
        if dest == OperationState.COMMITTING and self.op.kind == "prune":
            # A prune rewrites the entries it planned: their ids are journaled first (D24).
            kept["entryIds"] = list(self._pruned_ids)
        elif dest == OperationState.COMMITTING:
            # Entering committing fixes what the commit writes: its id is journaled first (D24).
            self._entry_id = entry_id_for(self.op.operation_id)
            kept["entryId"] = self._entry_id
        return kept

    def _translate(self, effect: str, report: Report) -> tuple[str, OperationFacts, dict[str, Any]]:
        return self.driver.translate(effect, report)

    def _left(self, limit: timedelta) -> timedelta:
        """``limit``, or less: what is left before the operation's deadline."""
        if self._deadline_at is None:
            return limit
        return max(min(limit, self._deadline_at - workflow.now()), MIN_LEFT)

    def _check_deadline(self) -> None:
        """Step ``deadline_passed`` next if the deadline has passed where the table lists it.

        No timer runs for the deadline (two history events each operation): what awaits is
        bounded by it instead (:meth:`_left`), and each effect that awaited looks at the clock
        when it ends, so the table hears of the deadline as early as a timer would tell it.
        """
        at = self._deadline_at
        if at is None or workflow.now() < at or self.done:
            return
        if self.defn.rows_for(self.state, OperationEvent.DEADLINE_PASSED):
            self._deadline_at = None  # once
            assert self.policy.deadline_s is not None
            self.driver.deadline_passed(self.policy.deadline_s)
            self.interrupt(OperationEvent.DEADLINE_PASSED)

    # -- the effect table -------------------------------------------------------------------------

    async def _run_hooks(self) -> Report:
        lines, resend = self.journal.take()
        try:
            reported: Reported = await run_local(
                "run_hooks",
                Call(op=self.op, journal=lines, resend=resend),
                result_type=Reported,
                limit=self._left(SHORT),
                retry=ONCE,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except ActivityError as error:
            self.journal.lost(lines)
            self._check_deadline()
            # A hook that cannot be consulted cancels, as a hook's own failure would not: the
            # compaction must not go ahead without the hooks that might have refused it.
            return Report(
                outcome=ReportOutcome.CANCELLED, data={"reason": lost_reason(error, "hooks")}
            )
        self._check_deadline()
        if reported.op is not None:
            self.op = reported.op
        self.driver.routes = list(reported.routes)  # the hooks made the requests
        if reported.gate is not None:  # a hook supplied the summary: the gate may judge it
            self.driver.hook_supplied(reported.text, GateSpec.from_json(reported.gate))
        return reported.report()

    async def _call_model(self) -> Report:
        driver = self.driver
        at, missing = driver.at, driver.no_model()
        if missing is not None:
            return missing
        refusals = sum(1 for index, _ in driver.refused if index == at.part)
        first = not (at.candidate or at.retries or at.halvings or refusals or at.offline)
        early = self._early.pop(at.part, None) if first else None
        if early is not None:
            # Started alongside the operation's first call (a split turn's prefix).
            return self._accept(early)
        lines, resend = self.journal.take()
        try:
            reported: Reported = await workflow.execute_activity(
                "call_model",
                Call(
                    op=self.op,
                    journal=lines,
                    resend=resend,
                    part=at.part,
                    candidate=at.candidate,
                    halvings=at.halvings,
                    feedback=at.feedback,
                    offline=at.offline,
                    texts=dict(driver.texts),
                    early=first and at.part == 0,
                ),
                result_type=Reported,
                start_to_close_timeout=model_call_limit(self.policy),
                schedule_to_close_timeout=self._left(model_call_limit(self.policy)),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=ONCE,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except ActivityError as error:
            self.journal.lost(lines)
            self._check_deadline()
            # The worker died or the call hung: a transient failure the table may retry.
            return Report(outcome=ReportOutcome.TIMEOUT, error=lost_reason(error, "model call"))
        self._check_deadline()
        self._early.update((int(index), got) for index, got in reported.early.items())
        return self._accept(reported)

    def _accept(self, reported: Reported) -> Report:
        gate = GateSpec.from_json(reported.gate) if reported.gate is not None else None
        return self.driver.accept(Attempt(reported.report(), reported.text, gate), reported.purpose)

    async def _sleep_retry(self) -> Report:
        await workflow.sleep(self._left(timedelta(seconds=self.driver.retry_wait_s())))
        self._check_deadline()
        return Report(outcome=ReportOutcome.OK)

    async def _append_entry(self) -> Report:
        driver = self.driver
        call = Call(
            op=self.op,
            texts=dict(driver.texts),
            models=dict(driver.models),
            written=dict(driver.written),
            entry_id=self._entry_id,
        )
        reported = await self._commit("commit", "commit", call)
        self._result = reported.result
        return self.driver.committed(reported.report())

    async def _rewrite_entries(self) -> Report:
        reported = await self._commit("rewrite", "prune", Call(op=self.op))
        self._tokens_saved = reported.tokens_saved
        return self.driver.committed(reported.report())

    async def _commit(self, activity: str, what: str, call: Call) -> Reported:
        # Delivered again after a lost worker: the commit finds its entry, a prune its work.
        lines, resend = self.journal.take()
        try:
            reported: Reported = await run_local(
                activity,
                dataclasses.replace(call, journal=lines, resend=resend),
                result_type=Reported,
                limit=SHORT,
                retry=DELIVER,
            )
        except ActivityError as error:
            self.journal.lost(lines)
            return Reported(outcome="failed", error=lost_reason(error, what))
        return reported

    async def _drop_hook_result(self) -> None:
        # The gate refused the hook's summary: the next activities summarize without it.
        self.op = dataclasses.replace(self.op, supplied=None)

    async def _nothing(self) -> None:
        return None

    async def _emit_result(self) -> None:
        # The last steps ride with the result hooks (session_compact, session_compact_failed),
        # which run on a worker; the failure is worded here, as one process words it.
        self._compact_failed = self.driver.compact_failed(
            self.state, from_extension=self.op.supplied is not None
        )
        await self._finish(
            Call(
                op=self.op,
                status=self.state,
                entry_id=self._entry_id,
                compact_failed=self._compact_failed,
            )
        )

    async def _flush(self) -> None:
        await self._finish(Call(op=self.op))

    async def _finish(self, call: Call) -> None:
        """Journal the last steps (and tell the result hooks) once the outcome is settled.

        Delivered again after a lost worker or a dropped connection. When even that fails the
        outcome stands (a commit is not undone by a journal line): the lines are lost, and
        reading the journal settles the operation from the store (a commit looked up by its
        entry id), as after a crash.
        """
        lines, resend = self.journal.take()
        try:
            await run_local(
                "finish",
                dataclasses.replace(call, journal=lines, resend=resend),
                limit=SHORT,
                retry=DELIVER,
            )
        except ActivityError as error:
            workflow.logger.warning("%s; the outcome stands", lost_reason(error, "finish"))

    def _outcome(self) -> CompressResult:
        ending = self.driver.ending(self.state)
        result = self._result or {}
        committed = ending.status == OperationState.COMMITTED
        return CompressResult(
            operation_id=self.op.operation_id,
            **ending.fields(),
            entry_id=self._entry_id if committed else None,
            summary=result.get("summary") if committed else None,
            tokens_before=result.get("tokensBefore") if committed else None,
            first_kept_entry_id=result.get("firstKeptEntryId") if committed else None,
            short_summary=result.get("shortSummary") if committed else None,
            tokens_saved=self._tokens_saved,
            details=result.get("details") if committed else None,
            from_extension=bool(result.get("fromExtension")) and committed,
            estimate_after=result.get("estimateAfter") if committed else None,
            compact_failed=self._compact_failed,
        )


WORKER_SHUTDOWN = "WorkerShutdown"
"""The failure type Temporal gives an activity its worker cancelled on shutting down."""


def infrastructure(error: ActivityError) -> bool:
    """Whether ``error`` says the cluster failed under the activity, not its input or code.

    Its worker stopped answering (a timeout) or was stopped, or its store connection failed
    (after the retries of a delivered activity: this is the last attempt's failure).
    """
    cause = error.cause
    if isinstance(cause, TimeoutError):
        return True
    lost = (WORKER_SHUTDOWN, STORE_UNAVAILABLE)
    return isinstance(cause, ApplicationError) and cause.type in lost


def lost_reason(error: ActivityError, what: str) -> str:
    """One line saying why the activity ``what`` failed (lost worker, timeout, its error)."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT:
        return f"{what}: the worker running it stopped answering (no heartbeat)"
    if isinstance(cause, ApplicationError) and cause.type == WORKER_SHUTDOWN:
        # Stopped by a signal (orchestrator worker): the activity was given back at once.
        return f"{what}: the worker running it was stopped"
    if isinstance(cause, TimeoutError):
        return f"{what}: no answer in time"
    return f"{what}: {cause or error}"
