"""The turn machine's driver, written once for both hosts (issue 34, house style 18).

Theory of operation. ``machines/turn.toml`` is run by two hosts: the anyio driver in one process
(:mod:`orchestrator._runtime.turn.driver`) and the Temporal workflow
(:mod:`orchestrator._cluster.turn.flow`). Everything that does not depend on how an effect is
performed lives here, once: the per-turn counters and the facts the guards read, the queue of
follow-up prompts, what an agent's reply means to the counters, the retry waits, the payloads of
the ``auto_retry_*`` and ``auto_compaction_*`` events, the effects that only count or emit, and
the binding of every effect name of the table to what performs it (:meth:`TurnCore.effects`).

A host implements the two small interfaces below and nothing else: :class:`AgentSide` (append
the user message, run the agent, wait, write the omissions and the continue message, prune,
release the session) and :class:`CompactionSide` (run and cancel a compaction, say how it
ended, hand a manual compaction's outcome to its caller). One process performs those with anyio
and the session in memory; the workflow performs them as activities, timers and child flows.
So a decision, a counter or a payload cannot drift between the hosts: there is one of each.

Exceptions to the table, kept here so that they are in one place (house style 19):

* A request (``abort``, ``manual_compact``) the current state does not list is dropped, not
  refused: it arrives asynchronously, while effects run, and the state it was meant for may be
  gone by the time it is stepped (:meth:`TurnCore.at_rest`).
* A run that ends with a retry streak still open (an abort, a manual compaction, an overflow
  recovery that failed) closes it with ``auto_retry_end`` ``success: false``
  (:meth:`TurnCore.close_retry_streak`, called by both hosts when a run ends): every
  ``auto_retry_start`` has its end, whichever row stopped the run. A reply that ends a streak is
  a row's effect (``end_retry_streak``, ``fail_retry_streak``).
* Whether to prune reads the ``prune`` setting inside ``prune_tool_outputs``: as a guard it would
  move the ``running`` -> ``pruning`` path every journal, trace and recorded history holds.

What may run beside a turn (a prompt or a manual compaction during a tree navigation, a second
manual compaction, closing while anything runs) is not this table's: every host asks the session
table first (``machines/session.toml``; :func:`~orchestrator._runtime.wiring.admit` in one
process).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator._core.entries import Message
from orchestrator._core.tokens import CompactionSettings, calculate_context_tokens, should_compact
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.names import OperationState, ReportOutcome, TurnEvent, TurnState
from orchestrator._runtime.delays import retry_delay_ms
from orchestrator._runtime.driver import Report
from orchestrator._runtime.operation.compact_hooks import overflow_failed_payload
from orchestrator._runtime.outcomes import turn_event
from orchestrator._runtime.turn.replies import (
    OVERFLOW_FAILED,
    Verdict,
    retry_after_hint_ms,
    retry_hint_s,
)
from orchestrator._runtime.turn.replies import still_over as still_over_message
from orchestrator._runtime.types import TurnCounters

ENDED = frozenset(
    {
        OperationState.COMMITTED,
        OperationState.SKIPPED,
        OperationState.CANCELLED,
        OperationState.FAILED,
        OperationState.CONFLICT,
    }
)
"""The statuses an operation ends in (anything else: it never ran to an end)."""

Effect = Callable[[], Awaitable[Report | None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnTerms:
    """The settings a turn's decisions and payloads read (the worker's, on the cluster).

    Attributes:
        compaction: The compaction settings (threshold, ``enabled``).
        context_window: The window the threshold is measured against.
        auto_continue: A threshold compaction continues the turn (D20).
        max_retries: Agent retries for a transient error (0: retries off).
        base_delay_ms: The first retry wait (D21).
        prune: Prune old tool outputs before a threshold compaction (D23).
    """

    compaction: CompactionSettings
    context_window: int
    auto_continue: bool
    max_retries: int
    base_delay_ms: int
    prune: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """How a compaction the turn started ended, as its ``auto_compaction_end`` reports it.

    Attributes:
        status: ``committed``, ``skipped``, ``cancelled``, ``failed`` or ``conflict``.
        reason: Why it was skipped.
        error: The failure as one line.
        result: The ``result`` field of ``auto_compaction_end`` (committed only).
        estimate_after: The context's estimated tokens right after the commit (D19).
    """

    status: str
    reason: str | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    estimate_after: int | None = None


class AgentSide(Protocol):
    """What a host performs on the agent's side of a turn, and what the core reads of it."""

    @property
    def state(self) -> str:
        """The turn machine's state."""
        ...

    def emit(self, type_: str, **payload: Any) -> None:
        """Emit an event (one process) or record it for the request's answer (the cluster)."""
        ...

    def terms(self) -> TurnTerms:
        """The settings the decisions read now."""
        ...

    async def append_user(self, text: str) -> None:
        """Append the user message (and emit its ``message`` event)."""
        ...

    async def call_agent(self) -> Report | None:
        """Run the agent in flight; the report of :meth:`TurnCore.take_reply`, or ``None``."""
        ...

    async def stop_agent(self) -> None:
        """Cancel the agent run and wait until it settled, keeping what it completed."""
        ...

    async def omit_failed_attempt(self) -> None:
        """Write the ``context_edit`` entries omitting the failed reply (D18, D21)."""
        ...

    async def prune(self) -> int:
        """Run one prune operation; the tokens it saved."""
        ...

    async def wait(self, delay_ms: int) -> Report | None:
        """Wait in flight; ``ok``, or ``None`` when a request came first."""
        ...

    async def stop_in_flight(self) -> None:
        """Cancel what is in flight and wait until it settled."""
        ...

    async def append_continue_message(self) -> None:
        """Append the D20 ``auto-continue`` custom message."""
        ...

    async def close_session(self) -> None:
        """Release the session."""
        ...


class CompactionSide(Protocol):
    """What a host performs for the compactions a turn starts."""

    async def compaction(self, reason: str) -> Report | None:
        """Run one compaction (``threshold``, ``overflow`` or ``manual``) in flight."""
        ...

    async def cancel_compaction(self) -> None:
        """Cancel the compaction and wait until it settled through its own table."""
        ...

    def ending(self) -> Ending | None:
        """How the last compaction ended (``None``: none ended)."""
        ...

    async def compact_failed(self, payload: Mapping[str, Any]) -> None:
        """Tell hooks and listeners an overflow recovery gave up (``session_compact_failed``)."""
        ...

    def hand_manual(self, *, never_ended: bool) -> None:
        """Hand the manual compaction's outcome to its caller (``cancelled`` when never ended)."""
        ...


class TurnCore:
    """A session's turn memory and the host-agnostic half of the turn table's effects.

    Args:
        agent: The host's agent side (it also emits and says the settings).
        compactions: The host's compaction side.
    """

    def __init__(self, agent: AgentSide, compactions: CompactionSide) -> None:
        self.agent = agent
        self.compactions = compactions
        self.counters = TurnCounters()
        self.prompt = ""  # what start_turn appends next
        self.follow_ups: deque[str] = deque()
        self.retry_wait_ms = 0

    def effects(self) -> Mapping[str, Effect]:
        """Every effect of the turn table, bound to what performs it (a new mapping)."""
        agent, compactions = self.agent, self.compactions
        return {
            "start_turn": self._start_turn,
            "call_agent": agent.call_agent,
            "stop_agent": agent.stop_agent,
            "omit_failed_attempt": agent.omit_failed_attempt,
            "prune_tool_outputs": self._prune_tool_outputs,
            "emit_retry_start": self._emit_retry_start,
            "emit_retry_end": self._emit_retry_end,
            "end_retry_streak": self._end_retry_streak,
            "fail_retry_streak": self._fail_retry_streak,
            "sleep_retry": self._sleep_retry,
            "cancel_retry_wait": agent.stop_in_flight,
            "append_continue_message": agent.append_continue_message,
            "resume_turn": self._resume_turn,
            "close_session": agent.close_session,
            "start_threshold_compaction": self._threshold,
            "start_overflow_compaction": self._overflow,
            "start_manual_compaction": self._manual,
            "cancel_compaction": compactions.cancel_compaction,
            "emit_compaction_end": self._emit_end,
            "emit_compaction_still_over": self._emit_still_over,
            "emit_compaction_aborted": self._emit_aborted,
            "emit_compaction_failed": self._emit_compaction_failed,
            "emit_recovery_failed": self._emit_recovery_failed,
            "emit_overflow_failed": self._emit_overflow_failed,
            "report_manual_result": self._report_manual_result,
        }

    def facts(self) -> TurnFacts:
        """What the turn table's guards read."""
        t, terms = self.counters, self.agent.terms()
        return TurnFacts(
            compaction_enabled=terms.compaction.enabled,
            over_threshold=t.over_threshold,
            context_full=t.context_full,
            overflow_attempted=t.overflow_attempted,
            auto_compactions=t.auto_compactions,
            retry_attempt=t.retry_attempt,
            max_retries=terms.max_retries,
            will_retry=t.will_retry,
            auto_continue=terms.auto_continue,
        )

    # -- the loop's words -------------------------------------------------------------------------

    async def perform(
        self,
        effects: tuple[str, ...],
        perform: Callable[[str], Awaitable[Report | None]],
        take_interrupt: Callable[[], str | None],
    ) -> str | None:
        """Perform a row's effects in order; the event to step next, if any.

        A request the state lists, arriving while an effect ran, is stepped before the row's
        remaining effects (its row's own stop effect settles what was in flight, D22).
        """
        event: str | None = None
        for name in effects:
            report = await perform(name)
            interrupt = take_interrupt()
            if interrupt is not None:
                return interrupt
            if report is not None:
                event = turn_event(name, report)
        return event

    def at_rest(self, interrupt: str | None, listed: Callable[[str], bool]) -> str | None:
        """What to step when the machine rests: a listed request, else the oldest follow-up.

        The queue of prompts sent while a run was in progress is the driver's: whether one
        starts a turn is the table's ``follow_up`` row (listed from ``idle``).
        """
        if interrupt is not None:
            return interrupt
        if self.follow_ups and listed(TurnEvent.FOLLOW_UP):
            self.prompt = self.follow_ups.popleft()
            return TurnEvent.FOLLOW_UP
        return None

    # -- the agent's side -------------------------------------------------------------------------

    def take_reply(self, last: tuple[str, Message] | None, verdict: Verdict) -> Report:
        """Record what the agent's last reply means for the counters; ``call_agent``'s report.

        Args:
            last: The last assistant reply's entry id and message, if the run yielded one.
            verdict: What the reply means (:func:`~orchestrator._runtime.turn.replies.classify`).
        """
        t = self.counters
        if last is not None:
            t.last_reply_id, t.last_reply = last
        t.over_threshold, t.context_full = verdict.over_threshold, verdict.context_full
        if verdict.error:
            t.last_error = verdict.error
            # The Retry-After header the route read, kept on the failed reply.
            t.last_retry_after_ms = retry_after_hint_ms(last[1] if last is not None else None)
        return Report(outcome=ReportOutcome(verdict.outcome), error=verdict.error or None)

    async def _end_retry_streak(self) -> None:
        # The row says a reply came back that ends the streak; there may be none open.
        t = self.counters
        if t.retry_attempt > 0:
            self.agent.emit("auto_retry_end", success=True, attempt=t.retry_attempt)
            t.retry_attempt = 0

    async def _fail_retry_streak(self) -> None:
        self.close_retry_streak()

    def close_retry_streak(self) -> None:
        """End a retry streak the turn stopped in without a verdict (``success: false``).

        An abort, a manual compaction or an overflow recovery that failed stopped it: its
        ``auto_retry_start`` still gets its ``auto_retry_end``.
        """
        if self.counters.retry_attempt > 0:
            self._retry_failed()

    async def _start_turn(self) -> None:
        self.close_retry_streak()  # the previous turn's, before its counters go
        self.counters = TurnCounters()
        text, self.prompt = self.prompt, ""
        await self.agent.append_user(text)

    async def _prune_tool_outputs(self) -> Report:
        t, terms = self.counters, self.agent.terms()
        if not terms.prune:
            return Report(outcome=ReportOutcome.OK)
        saved = await self.agent.prune()
        if saved and t.last_reply is not None:
            # Re-measured as the reply's usage less what the prune saved.
            usage = t.last_reply.get("usage") or {}
            tokens = max(0, calculate_context_tokens(usage) - saved)
            t.over_threshold = should_compact(tokens, terms.context_window, terms.compaction)
        return Report(outcome=ReportOutcome.OK)

    async def _emit_retry_start(self) -> None:
        t, terms = self.counters, self.agent.terms()
        hint = retry_hint_s(t.last_error, t.last_retry_after_ms)
        self.retry_wait_ms = retry_delay_ms(terms.base_delay_ms, t.retry_attempt, hint)
        t.retry_attempt += 1
        self.agent.emit(
            "auto_retry_start",
            attempt=t.retry_attempt,
            maxAttempts=terms.max_retries,
            delayMs=self.retry_wait_ms,
            errorMessage=t.last_error,
        )

    async def _emit_retry_end(self) -> None:
        self._retry_failed()

    def _retry_failed(self) -> None:
        t = self.counters
        self.agent.emit(
            "auto_retry_end",
            success=False,
            attempt=t.retry_attempt,
            finalError=t.last_error or "aborted",
        )
        t.retry_attempt = 0

    async def _sleep_retry(self) -> Report | None:
        return await self.agent.wait(self.retry_wait_ms)

    async def _resume_turn(self) -> Report:
        return Report(outcome=ReportOutcome.OK)

    # -- compactions ------------------------------------------------------------------------------

    async def _threshold(self) -> Report | None:
        return await self._automatic("threshold")

    async def _overflow(self) -> Report | None:
        return await self._automatic("overflow")

    async def _automatic(self, reason: str) -> Report | None:
        t = self.counters
        t.will_retry = reason == "overflow"
        t.overflow_attempted = t.overflow_attempted or reason == "overflow"
        t.auto_compactions += 1  # D19 counts every automatic compaction, whatever its reason
        self.agent.emit("auto_compaction_start", reason=reason)
        report = await self.compactions.compaction(reason)
        if report is not None:
            # Re-measured for the compaction_done rows: whether it got under the line (D19).
            t.over_threshold = self._still_over(self.compactions.ending())
        return report

    def _still_over(self, ending: Ending | None) -> bool:
        if ending is None or ending.status != "committed" or ending.estimate_after is None:
            return False
        terms = self.agent.terms()
        return should_compact(ending.estimate_after, terms.context_window, terms.compaction)

    async def _manual(self) -> Report | None:
        return await self.compactions.compaction("manual")

    async def _emit_end(self) -> None:
        self._end(still_over=False)

    async def _emit_still_over(self) -> None:
        self._end(still_over=True)

    def _end(self, *, still_over: bool) -> None:
        ending = self.compactions.ending()
        payload = end_payload(ending)
        if ending is not None and ending.status == OperationState.COMMITTED:
            payload["willRetry"] = self.counters.will_retry
            if still_over and ending.estimate_after is not None:
                # D19: no second compaction in this turn; the row says it did not get under.
                payload["stillOverThreshold"] = True
                payload["errorMessage"] = still_over_message(ending.estimate_after)
        elif ending is not None and ending.status == OperationState.SKIPPED:
            payload["skipped"] = True
            payload["reason"] = ending.reason
        self.agent.emit("auto_compaction_end", **payload)

    async def _emit_aborted(self) -> None:
        payload = {**end_payload(self.compactions.ending()), "aborted": True}
        self.agent.emit("auto_compaction_end", **payload)

    async def _emit_compaction_failed(self) -> None:
        self._emit_failure("Auto-compaction failed")

    async def _emit_recovery_failed(self) -> None:
        self._emit_failure("Context overflow recovery failed")

    def _emit_failure(self, what: str) -> None:
        ending = self.compactions.ending()
        error = ending.error if ending is not None and ending.error else "compaction failed"
        payload = {**end_payload(ending), "errorMessage": f"{what}: {error}"}
        self.agent.emit("auto_compaction_end", **payload)

    async def _emit_overflow_failed(self) -> None:
        self.agent.emit(
            "auto_compaction_end",
            result=None,
            aborted=False,
            willRetry=False,
            errorMessage=OVERFLOW_FAILED,
        )
        # No compaction ran, but pi tells its extensions the recovery failed all the same.
        await self.compactions.compact_failed(overflow_failed_payload())

    async def _report_manual_result(self) -> None:
        ending = self.compactions.ending()
        never_ended = self.agent.state == TurnState.IDLE and (
            ending is None or ending.status not in ENDED
        )
        self.compactions.hand_manual(never_ended=never_ended)


def result_fields(result: Any) -> dict[str, Any]:
    """``auto_compaction_end``'s ``result`` for a committed compaction.

    ``result`` is one process's ``CompactionResult`` or the cluster's ``CompressResult``: both
    name these four fields alike (duck-typed: a protocol of four properties said no more).
    """
    return {
        "summary": result.summary,
        "firstKeptEntryId": result.first_kept_entry_id,
        "tokensBefore": result.tokens_before,
        "details": result.details,
    }


def end_payload(ending: Ending | None) -> dict[str, Any]:
    """The ``auto_compaction_end`` fields every ending shares."""
    result = ending.result if ending is not None else None
    return {"result": result, "aborted": False, "willRetry": False}
