"""The turn table hosted in a Temporal workflow: the same pure step, effects as activities.

Theory of operation. :class:`TurnFlow` is the workflow host of the turn driver written once in
:mod:`~orchestrator._runtime.turn.core` (counters, facts, payloads, the effect binding), as
:class:`~orchestrator._runtime.turn.driver.TurnDriver` is the one-process host. It steps
``machines/turn.toml`` only through the pure :func:`~orchestrator._lifecycle.machine.step`, so
the decisions and the journal's turn rows are the same on both hosts.

Effects that touch the world are activities. The agent's run is made once (a retry is the
table's decision); the appends and the journal writes are idempotent and delivered again after
a lost worker or a dropped store connection (:data:`~orchestrator._cluster.operation.flow.DELIVER`):

* ``call_agent``: the ``call_agent`` activity runs the worker's agent on the live context (a
  failed attempt is out of it once ``omit_failed_attempt`` wrote its omission) and reports the
  messages it yielded and what the last reply means
  (:func:`~orchestrator._runtime.turn.replies.classify`, on the worker's settings). It
  appends nothing: the ``append`` activity then appends the messages, each under an id the
  workflow derived (:func:`~orchestrator._cluster.calls.message_id_for`), so a delivery
  repeated after a worker died finds them instead of appending twice. The append is not
  interruptible: an abort arriving meanwhile is stepped once the messages are whole (D22).
  ``stop_agent`` cancels the run and waits for its report of the messages it completed, then
  appends those the same way (one process keeps them too). An agent that raises (a bug) settles
  the run through the abort row, then fails the request with its exception (``AgentRaisedError``).
* ``start_turn`` and ``append_continue_message`` append the user message and the D20 message
  the same way, and ``omit_failed_attempt`` the ``context_edit`` entries that omit a failed
  attempt (before an overflow compaction, D18, and a transient-error retry, D21), their targets
  chosen from the last run's messages as one process chooses them from the path
  (:func:`~orchestrator._runtime.turn.replies.failed_attempt`); a run that reported no messages (a
  lost worker) has none to omit.
* ``start_*_compaction`` runs one :class:`~orchestrator._cluster.operation.flow.OperationFlow` (the
  operation table, its own activities) in flight; ``cancel_compaction`` interrupts it with
  ``cancel`` and waits until it settled through its own table.
* ``sleep_retry`` is a workflow timer in flight; ``stop_agent`` / ``cancel_retry_wait`` cancel
  what is in flight and wait until it has settled.
* ``prune_tool_outputs`` runs one prune operation (the operation table's prune rows, its
  ``rewrite`` activity) when the worker prunes (D23); the core re-measures the context.

Failures of the cluster. An activity that fails for good (its retries spent, or not
retryable) raises out of whatever effect awaited it. The turn then steps ``activity_failed``
from the state it stands in: the table's rows end the turn (an automatic compaction reports
its failure, a manual one hands it to its caller), so the session is idle again and never left
in a state nothing will step, which is what wedged it when planning was lost with its worker.
The request is answered ``Unavailable`` (``-32008``) when the cluster failed under it (a
timeout, a stopped worker, the store: :func:`~orchestrator._cluster.operation.flow.infrastructure`),
otherwise with the activity's own error, as before.

Notifications. Where one process emits an event (``message``, ``auto_retry_*``,
``auto_compaction_*``, ``compaction_update``, ``session_compact*``), the flow records it with
the same payload in :attr:`TurnFlow.events`, numbered in the workflow run: the server reads
them while the request runs (the ``events`` query) and from the request's answer, and sends
each once, in order, as ``session.event`` notifications.

Journal. Each step becomes a :class:`~orchestrator._cluster.calls.JournalLine` that rides
with the next turn activity (with a compaction's ``prepare`` when one starts, and a local
``journal_turn`` activity when the machine rests), written as a ``turn`` record with the facts
the guards read, as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

from orchestrator._cluster.calls import (
    AgentReported,
    JournalLine,
    NewEntry,
    Op,
    TurnCall,
    TurnPolicy,
    message_id_for,
)
from orchestrator._cluster.contract import (
    AGENT_RAISED,
    UNAVAILABLE,
    UNAVAILABLE_KIND,
    AgentRaisedError,
    CompressResult,
)
from orchestrator._cluster.local import run_local
from orchestrator._cluster.operation.flow import (
    DELIVER,
    HEARTBEAT,
    LONG_CALL,
    ONCE,
    SHORT,
    OperationFlow,
    infrastructure,
    lost_reason,
)
from orchestrator._cluster.stepping import JournalLines, stop_in_flight
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.machine import MachineDef, step
from orchestrator._lifecycle.names import OperationState, ReportOutcome, TurnEvent
from orchestrator._runtime.driver import Report, check_effects
from orchestrator._runtime.operation.compact_hooks import retries_after
from orchestrator._runtime.turn.core import Effect, Ending, TurnCore, TurnTerms, result_fields
from orchestrator._runtime.turn.replies import AUTO_CONTINUE_TYPE, failed_attempt

T = TypeVar("T")

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


class TurnFlow:
    """A session's turns, run by the turn table inside the session workflow.

    Args:
        defn: The turn table.
        operation: The operation table (the compactions a turn starts).
        session_id: The session.
    """

    def __init__(self, defn: MachineDef, operation: MachineDef, session_id: str) -> None:
        self.defn = defn
        self.operation = operation
        self.session_id = session_id
        self.state = defn.initial
        self.core = TurnCore(self, self)
        self.effects: Mapping[str, Effect] = self.core.effects()
        check_effects(defn, self.effects)
        self.policy = TurnPolicy(has_agent=False)
        self.outcome: CompressResult | None = None
        self.manual: ManualCompaction | None = None
        self.flow: OperationFlow | None = None
        self.operations: list[str] = []
        self.running = False
        self._attempt: list[tuple[str, dict[str, Any]]] = []  # the last run's messages, by id
        self._interrupts: list[str] = []
        self._task: asyncio.Task[Any] | None = None
        self._run_id = ""
        self._calls = 0
        self.journal = JournalLines()
        self._agent_call = 0
        self.events: list[dict[str, Any]] = []
        self._event_seq = 0

    # -- requests ---------------------------------------------------------------------------------

    def facts(self) -> TurnFacts:
        """What the turn table's guards read (the facts one process gives them)."""
        return self.core.facts()

    def terms(self) -> TurnTerms:
        """The worker's settings, as the turn's decisions read them."""
        policy = self.policy
        return TurnTerms(
            compaction=self._compaction_settings(),
            context_window=policy.context_window,
            auto_continue=policy.auto_continue,
            max_retries=policy.max_retries,
            base_delay_ms=policy.base_delay_ms,
            prune=policy.prune,
        )

    def queue(self, text: str) -> None:
        """Keep a prompt sent while a run is in progress; the table may take it as a follow-up."""
        self.core.follow_ups.append(text)

    def interrupt(self, event: str) -> None:
        """Record ``abort`` or ``manual_compact``; the table decides what it means now."""
        if self.running:
            self._interrupts.append(event)

    async def run(self, event: str, prompt: str = "") -> None:
        """Step ``event`` (``user_prompt`` or ``manual_compact``) and the table until it rests.

        Raises:
            TransitionError: The table refused a step (a bug, not a model failure).
        """
        self.running = True
        self.core.prompt = prompt
        # Every earlier request's answer carried its events: this run's start afresh.
        self.events = []
        self._run_id = workflow.uuid4().hex[:12]
        self.journal.seq = self._calls = 0
        try:
            await self._loop(event)
            while self.journal.lines:
                # The last steps are written before the run ends; a request that arrived
                # meanwhile is stepped as it would have been a moment earlier.
                await self._flush()
                await self._loop(self._at_rest())
            self.core.close_retry_streak()
        except AgentRaisedError as failure:
            # As one process: the run settles through the abort row, then the caller hears
            # the agent's exception (-32603 on the wire), not a turn that merely ended.
            if self._listed(TurnEvent.ABORT):
                await self._loop(TurnEvent.ABORT)
            while self.journal.lines:
                await self._flush()
            raise ApplicationError(
                failure.message, failure.kind, type=AGENT_RAISED, non_retryable=True
            ) from None
        except ActivityError as error:
            # An activity failed for good: the table's activity_failed rows end the turn, so
            # the session is idle again (never left where nothing steps it), then the caller
            # hears why: -32008 when the cluster failed under it, the error itself otherwise.
            unavailable = await self._settle(error)
            if unavailable is None:
                raise
            raise unavailable from None
        except asyncio.CancelledError:
            # The workflow was cancelled: settle through the table's abort row (D22).
            if self._listed(TurnEvent.ABORT):
                await self._loop(TurnEvent.ABORT)
            raise
        finally:
            self.running = False
            self._interrupts.clear()
            self.core.follow_ups.clear()
            request, self.manual = self.manual, None
            if request is not None:
                request.done = True

    async def _settle(self, error: ActivityError) -> ApplicationError | None:
        """Settle a failed activity; the ``Unavailable`` error to raise instead, if any."""
        reason = await self._activity_failed(error)
        if not infrastructure(error):
            return None
        return ApplicationError(
            f"Cluster unavailable: {reason}; the work stopped there and the session is idle again",
            type=UNAVAILABLE,
            non_retryable=True,
        )

    async def _activity_failed(self, error: ActivityError) -> str:
        """Step ``activity_failed`` from where the turn stands; returns why it failed."""
        reason = lost_reason(error, error.activity_type or "activity")
        flow = self.flow
        self.outcome = CompressResult(
            operation_id=flow.op.operation_id if flow is not None and not flow.done else "",
            status=OperationState.FAILED,
            error=reason,
            error_kind=UNAVAILABLE_KIND if infrastructure(error) else "fatal",
        )
        # Nothing queued or asked for meanwhile runs: the caller is told the work stopped.
        self._interrupts.clear()
        self.core.follow_ups.clear()
        self.core.close_retry_streak()
        if self._listed(TurnEvent.ACTIVITY_FAILED):
            await self._loop(TurnEvent.ACTIVITY_FAILED)
        if self.journal.lines:
            # Best effort: the store may be what failed (reading the journal then shows the
            # turn stopping short of rest, as after a crash).
            with contextlib.suppress(ActivityError):
                await self._flush()
        return reason

    # -- the loop ---------------------------------------------------------------------------------

    async def _loop(self, event: str | None) -> None:
        while event is not None:
            facts = self.facts()
            taken = step(self.defn, self.state, event, facts)
            self.state = taken.dest
            self.journal.add(taken.source, event, taken.dest, taken.effects, facts)
            event = await self.core.perform(taken.effects, self._perform, self._take_interrupt)
            if event is None:
                event = self._at_rest()

    async def _perform(self, name: str) -> Report | None:
        return await self.effects[name]()

    def _at_rest(self) -> str | None:
        return self.core.at_rest(self._take_interrupt(), self._listed)

    def _listed(self, event: str) -> bool:
        return bool(self.defn.rows_for(self.state, event))

    def _take_interrupt(self) -> str | None:
        # Requests the current state does not list mean nothing now (as in one process).
        while self._interrupts:
            event = self._interrupts.pop(0)
            if self.defn.rows_for(self.state, event):
                return event
        return None

    def _wanted(self) -> bool:
        return any(self.defn.rows_for(self.state, e) for e in self._interrupts)

    async def _in_flight(self, work: Callable[[], Awaitable[T]]) -> T | None:
        """Run slow work in a task until it ends or a listed request arrives (then ``None``)."""
        task = asyncio.ensure_future(work())
        self._task = task
        await workflow.wait_condition(lambda: task.done() or self._wanted())
        if task.done():
            self._task = None
            return task.result()
        return None

    async def stop_in_flight(self) -> None:
        """Cancel what is in flight (the retry wait) and wait until it settled."""
        task, self._task = self._task, None
        await stop_in_flight(task)

    # -- journal ----------------------------------------------------------------------------------

    def _call(self, **kwargs: Any) -> tuple[TurnCall, list[JournalLine]]:
        lines, resend = self.journal.take()
        call = TurnCall(
            session_id=self.session_id, run_id=self._run_id, journal=lines, resend=resend, **kwargs
        )
        return call, lines

    async def _flush(self, compact_failed: dict[str, Any] | None = None) -> None:
        # A local activity: journal lines alone need no durability of their own in the history
        # (one marker event, not an activity's three and a workflow task's three).
        await self._deliver("journal_turn", local=True, compact_failed=compact_failed)

    async def _append(self, entries: list[NewEntry]) -> None:
        await self._deliver("append", entries=entries)

    async def _deliver(self, activity: str, *, local: bool = False, **fields: Any) -> None:
        """Run an idempotent turn activity, delivered again after a lost worker (DELIVER)."""
        call, lines = self._call(**fields)
        try:
            if local:
                await run_local(activity, call, limit=SHORT, retry=DELIVER)
                return
            await workflow.execute_activity(
                activity,
                call,
                start_to_close_timeout=SHORT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=DELIVER,
            )
        except BaseException:
            self.journal.lost(lines)
            raise

    def _new_id(self, what: str) -> str:
        return message_id_for(f"{self.session_id}:{self._run_id}:{what}")

    # -- notifications ----------------------------------------------------------------------------

    def emit(self, type_: str, **payload: Any) -> None:
        """Record an event one process would emit here (``session.event`` on the wire).

        Numbered in the workflow run, so a server that reads them while the request runs
        (the ``events`` query) and again from its answer sends each once, in order.
        """
        self.events.append({"seq": self._event_seq, "event": {"type": type_, **payload}})
        self._event_seq += 1

    def events_after(self, seq: int) -> list[dict[str, Any]]:
        """This run's events numbered after ``seq``."""
        return [e for e in self.events if e["seq"] > seq]

    # -- the agent's side -------------------------------------------------------------------------

    async def append_user(self, text: str) -> None:
        """Append the user message under an id derived from the run (delivered again safely)."""
        self._attempt = []
        message = json.dumps(
            {
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": int(workflow.now().timestamp() * 1000),
            },
            ensure_ascii=False,
        )
        self._calls += 1
        entry = NewEntry(entry_id=self._new_id(f"user:{self._calls}"), message=message)
        await self._append([entry])
        self.emit("message", entryId=entry.entry_id, role="user")

    async def call_agent(self) -> Report | None:
        """Run the agent (an activity) in flight, then append what it yielded."""
        self._calls += 1
        self._agent_call = self._calls
        reported = await self._in_flight(self._agent)
        if reported is None:
            return None  # a request came first: its row stops the run (``stop_agent``)
        ids = await self._append_reported(reported)
        return self._classified(reported, ids)

    async def _append_reported(self, reported: AgentReported) -> list[str]:
        """Append a run's messages under ids derived from the run's call and their position."""
        number = self._agent_call
        ids = [self._new_id(f"agent:{number}:{i}") for i in range(len(reported.messages))]
        if reported.messages:
            pairs = zip(ids, reported.messages, strict=True)
            entries = [NewEntry(entry_id=i, message=m) for i, m in pairs]
            await self._append(entries)
            for entry_id, message in zip(ids, reported.messages, strict=True):
                self.emit("message", entryId=entry_id, role=json.loads(message).get("role"))
        return ids

    async def stop_agent(self) -> None:
        """Cancel the agent run; append the messages it completed before the cancel."""
        # The run reports what it completed before the cancel reached it (the activity waits
        # for that, WAIT_CANCELLATION_COMPLETED): kept, as one process keeps them (D22).
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            reported = await task
        except (asyncio.CancelledError, ActivityError, AgentRaisedError):
            return
        if reported is not None and reported.messages:
            await self._append_reported(reported)

    async def _agent(self) -> AgentReported:
        call, lines = self._call()
        try:
            reported: AgentReported = await workflow.execute_activity(
                "call_agent",
                call,
                result_type=AgentReported,
                start_to_close_timeout=LONG_CALL,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=ONCE,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except ActivityError as error:
            self.journal.lost(lines)
            cause = error.cause
            if isinstance(cause, ApplicationError) and not infrastructure(error):
                # The agent's own exception (a bug, not the provider's answer): the caller
                # sees it, as one process raises it, once the turn settled (``run``).
                raise AgentRaisedError(cause.type or "Exception", cause.message) from None
            # The worker died, the run hung or the store dropped the connection reading the
            # context: a transient failure the table may retry.
            lost = infrastructure(error)
            outcome = "transient" if lost else "fatal"
            return AgentReported(outcome=outcome, error=lost_reason(error, "agent"))
        except asyncio.CancelledError:
            self.journal.lost(lines)
            raise
        return reported

    def _classified(self, reported: AgentReported, ids: list[str]) -> Report:
        messages = [json.loads(m) for m in reported.messages]
        last = [(i, m) for i, m in zip(ids, messages, strict=True) if m.get("role") == "assistant"]
        # What omit_failed_attempt may omit: this run's messages only, none when it reported
        # none (a lost worker), so an earlier run's reply is never taken for the failed one.
        self._attempt = list(zip(ids, messages, strict=True))
        return self.core.take_reply(last[-1] if last else None, reported.verdict())

    async def omit_failed_attempt(self) -> None:
        """Append the omissions of the failed attempt, under ids derived here."""
        reply_id = self.core.counters.last_reply_id
        if reply_id is None:
            return
        self._calls += 1
        entries = [
            NewEntry(entry_id=self._new_id(f"omit:{self._calls}:{k}"), omits=target)
            for k, target in enumerate(failed_attempt(self._attempt, reply_id))
        ]
        if entries:
            await self._append(entries)

    async def prune(self) -> int:
        """Run one prune operation (the operation table's prune rows); the tokens it saved."""
        outcome = await self._operation(await self._start_flow(kind="prune", reason="threshold"))
        return outcome.tokens_saved

    def _compaction_settings(self) -> CompactionSettings:
        """What the worker's threshold is measured with (its reserve, or its set threshold)."""
        policy = self.policy
        return CompactionSettings(
            enabled=policy.compaction_enabled,
            reserve_tokens=policy.reserve_tokens,
            threshold_percent=policy.threshold_percent,
            threshold_tokens=policy.threshold_tokens,
        )

    async def wait(self, delay_ms: int) -> Report | None:
        """A workflow timer in flight before the retry."""

        async def wait() -> Report:
            await workflow.sleep(delay_ms / 1000)
            return Report(outcome=ReportOutcome.OK)

        return await self._in_flight(wait)

    async def append_continue_message(self) -> None:
        """Append the D20 message under an id derived from the run."""
        self._calls += 1
        entry = NewEntry(
            entry_id=self._new_id(f"continue:{self._calls}"),
            custom_type=AUTO_CONTINUE_TYPE,
            content=self.policy.continue_text,
            display=False,
        )
        await self._append([entry])

    async def close_session(self) -> None:
        """Nothing to release: the workflow holds no session open."""
        return None

    # -- compactions ------------------------------------------------------------------------------

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
