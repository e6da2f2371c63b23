"""The turn table hosted in a Temporal workflow: the same pure step, effects as activities.

Theory of operation. :class:`TurnFlow` is the workflow host of the turn driver written once in
:mod:`~orchestrator._runtime.turn.core` (counters, facts, payloads, the effect binding), as
:class:`~orchestrator._runtime.turn.driver.TurnDriver` is the one-process host. It steps
``machines/turn.toml`` only through the pure :func:`~orchestrator._lifecycle.machine.step`, so
the decisions and the journal's turn rows are the same on both hosts.

Effects that touch the world are activities, performed by the flow's two sides:
:mod:`~orchestrator._cluster.turn.agent` (the agent's run, the entries a turn appends, retry
waits) and :mod:`~orchestrator._cluster.turn.compactions` (the operations a turn starts). The
agent's run is made once (a retry is the table's decision); the appends and the journal writes
are idempotent and delivered again after a lost worker or a dropped store connection
(:data:`~orchestrator._cluster.operation.flow.DELIVER`).

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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from orchestrator._cluster.calls import (
    JournalLine,
    NewEntry,
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
    SHORT,
    OperationFlow,
    infrastructure,
    lost_reason,
)
from orchestrator._cluster.stepping import JournalLines, stop_in_flight
from orchestrator._cluster.turn.agent import FlowAgent
from orchestrator._cluster.turn.compactions import FlowCompactions, ManualCompaction
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.machine import MachineDef, step
from orchestrator._lifecycle.names import OperationState, TurnEvent
from orchestrator._runtime.driver import Report, check_effects
from orchestrator._runtime.turn.core import Effect, TurnCore, TurnTerms

T = TypeVar("T")


class TurnFlow(FlowAgent, FlowCompactions):
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

    def _compaction_settings(self) -> CompactionSettings:
        """What the worker's threshold is measured with (its reserve, or its set threshold)."""
        policy = self.policy
        return CompactionSettings(
            enabled=policy.compaction_enabled,
            reserve_tokens=policy.reserve_tokens,
            threshold_percent=policy.threshold_percent,
            threshold_tokens=policy.threshold_tokens,
        )
