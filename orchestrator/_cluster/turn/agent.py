"""The agent's side of the turn flow: the user message, the agent's run, retry waits, continuing.

The effects of :class:`~orchestrator._cluster.turn.flow.TurnFlow` that run the agent and append
what a turn writes (the theory of operation of the flow is there). They are apart from the loop
because they are what talks to the agent through activities; they are a mixin of the flow, whose
fields they share (:mod:`~orchestrator._cluster.turn.host`):

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
* ``sleep_retry`` is a workflow timer in flight; ``stop_agent`` / ``cancel_retry_wait`` cancel
  what is in flight and wait until it has settled.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

from orchestrator._cluster.calls import AgentReported, NewEntry, TurnPolicy
from orchestrator._cluster.contract import AgentRaisedError
from orchestrator._cluster.operation.flow import (
    HEARTBEAT,
    LONG_CALL,
    ONCE,
    infrastructure,
    lost_reason,
)
from orchestrator._cluster.turn.host import FlowHost
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.turn.core import TurnCore
from orchestrator._runtime.turn.replies import AUTO_CONTINUE_TYPE, failed_attempt


class FlowAgent(FlowHost):
    """The agent's side of the turn table, mixed into ``TurnFlow`` (whose fields it shares)."""

    # The flow's fields only this side uses (set by TurnFlow.__init__).
    core: TurnCore
    policy: TurnPolicy
    _attempt: list[tuple[str, dict[str, Any]]]
    _calls: int
    _agent_call: int

    if TYPE_CHECKING:  # the flow's journal and delivery (see FlowHost)

        async def _append(self, entries: list[NewEntry]) -> None: ...

        def _new_id(self, what: str) -> str: ...

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
