"""The turn machine's effects: what each effect name in ``machines/turn.toml`` does.

A mixin of :class:`~orchestrator._runtime.session.AgentSession`, split out to keep each module
small. Each ``_fx_<effect>`` method performs one effect; one that produces an outcome returns the
turn machine's next event (the agent's classified reply, ``retry_wait_done``, a compaction's
result).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from orchestrator._core.classify import (
    is_context_overflow_text,
    is_transient_text,
    retry_after_from_text,
    silent_overflow,
)
from orchestrator._core.entries import Message
from orchestrator._core.model import Usage
from orchestrator._core.prompts import render
from orchestrator._core.tokens import calculate_context_tokens, should_compact
from orchestrator._lifecycle.machine import Runner
from orchestrator._runtime.agent import Agent, AgentInput
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.operations import OperationRunner
from orchestrator._runtime.types import OperationOutcome
from orchestrator._store.session import Session

if TYPE_CHECKING:
    from orchestrator._runtime.session import AgentSession
    from orchestrator._runtime.types import RuntimeSettings, TurnCounters

OVERFLOW_FAILED = (
    "Context overflow recovery failed after one compact-and-retry attempt. "
    "Try reducing context or switching to a larger-context model."
)
AUTO_CONTINUE_TYPE = "auto-continue"
ENDED = frozenset({"committed", "skipped", "cancelled", "failed"})


def _usage(usage: Mapping[str, Any]) -> Usage:
    return Usage(
        input=int(usage.get("input") or 0),
        output=int(usage.get("output") or 0),
        cache_read=int(usage.get("cacheRead") or 0),
        cache_write=int(usage.get("cacheWrite") or 0),
    )


class TurnEffects:
    """The effect methods of the turn machine (mixed into ``AgentSession``)."""

    session: Session
    agent: Agent | None
    settings: RuntimeSettings
    events: EventBus
    turn: Runner
    _turn_state: TurnCounters
    _dropped: set[str]
    _pending_prompt: str | None
    _retry_wait_ms: int
    _manual_focus: str | None
    _manual_waiters: list[Any]
    _sleep: Callable[[float], Awaitable[None]]
    _manual_dry_run: bool
    operations: OperationRunner

    def _runtime(self) -> AgentSession:
        return cast("AgentSession", self)

    def now_ms(self) -> int:  # pragma: no cover - provided by AgentSession
        raise NotImplementedError

    async def _interruptible(  # pragma: no cover - provided by AgentSession
        self, work: Callable[[], Awaitable[str | None]]
    ) -> str | None:
        raise NotImplementedError

    async def _fx_start_turn(self) -> None:
        self._turn_state = type(self._turn_state)()
        self._dropped.clear()
        text, self._pending_prompt = self._pending_prompt or "", None
        entry = self.session.append_message(
            {
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": self.now_ms(),
            }
        )
        self.events.emit("message", entryId=entry["id"], role="user")

    async def _fx_call_agent(self) -> str | None:
        return await self._interruptible(self._call_agent)

    async def _call_agent(self) -> str | None:
        assert self.agent is not None
        context = self.session.context()
        messages = [
            m
            for m, i in zip(context.messages, context.entry_ids, strict=True)
            if i not in self._dropped
        ]
        turn = AgentInput(
            messages=messages,
            model=context.model,
            thinking_level=context.thinking_level,
            now_ms=self.now_ms,
        )
        last: tuple[str, Message] | None = None
        async for message in self.agent.run(turn):
            entry = self.session.append_message(message)
            self.events.emit("message", entryId=entry["id"], role=message.get("role"))
            if message.get("role") == "assistant":
                last = (entry["id"], message)
        self.session.store.sync()
        return self._classify(last)

    def _classify(self, last: tuple[str, Message] | None) -> str:
        t = self._turn_state
        t.over_threshold = t.context_full = False
        if last is None:
            return "agent_done"
        t.last_reply_id, t.last_reply = last
        reply = last[1]
        stop = reply.get("stopReason")
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        window = self.settings.context_window
        if stop == "error":
            t.last_error = str(reply.get("errorMessage") or "Unknown error")
            if is_context_overflow_text(t.last_error):
                return "overflow"
            if is_transient_text(t.last_error):
                return "transient_error"
            self._retry_finished(success=False)
            return "fatal_error"
        self._retry_finished(success=True)
        if usage and silent_overflow(_usage(usage), window, str(stop)):
            t.last_error = "context overflow (usage exceeds the context window)"
            return "overflow"
        tokens = calculate_context_tokens(usage) if usage else 0
        fresh = not self._is_stale(reply)
        t.over_threshold = fresh and should_compact(tokens, window, self.settings.compaction)
        if stop == "length":
            t.context_full = t.over_threshold
            t.last_error = "reply stopped by the length limit with the context full"
            return "reply_truncated"
        return "agent_done"

    def _is_stale(self, reply: Message) -> bool:
        # A reply from before the latest compaction measured a context that no longer exists.
        # The live context opens with that compaction's summary when there is one: O(1).
        messages = self.session.context().messages
        if not messages or messages[0].get("role") != "compactionSummary":
            return False
        return int(reply.get("timestamp") or 0) <= int(messages[0].get("timestamp") or 0)

    def _retry_finished(self, *, success: bool) -> None:
        t = self._turn_state
        if t.retry_attempt > 0:
            payload: dict[str, Any] = {"success": success, "attempt": t.retry_attempt}
            if not success:
                payload["finalError"] = t.last_error
            self.events.emit("auto_retry_end", **payload)
            t.retry_attempt = 0

    async def _fx_stop_agent(self) -> None:
        # The agent ran inside the effect's cancel scope, which the interrupt cancelled; by the
        # time this effect runs the agent has settled.
        return None

    async def _fx_drop_failed_reply(self) -> None:
        if self._turn_state.last_reply_id is not None:
            self._dropped.add(self._turn_state.last_reply_id)

    async def _fx_prune_tool_outputs(self) -> str:
        t = self._turn_state
        if not self.settings.prune:
            return "pruned"
        outcome = await self.operations.prune()
        if outcome.tokens_saved and t.last_reply is not None:
            usage = t.last_reply.get("usage") or {}
            tokens = max(0, calculate_context_tokens(usage) - outcome.tokens_saved)
            t.over_threshold = should_compact(
                tokens, self.settings.context_window, self.settings.compaction
            )
        return "pruned"

    async def _auto_compaction(self, reason: str) -> str | None:
        t = self._turn_state
        t.will_retry = reason == "overflow"
        t.overflow_attempted = t.overflow_attempted or reason == "overflow"
        t.auto_compactions += 1  # D19 counts every automatic compaction, whatever its reason
        self.events.emit("auto_compaction_start", reason=reason)
        outcome = await self._interruptible(lambda: self._compaction_event(reason, None))
        return outcome

    async def _compaction_event(self, reason: str, focus: str | None, dry_run: bool = False) -> str:
        outcome = await self.operations.compaction(reason=reason, focus=focus, dry_run=dry_run)
        self._turn_state.outcome = outcome
        return {
            "committed": "compaction_done",
            "skipped": "compaction_skipped",
            "cancelled": "compaction_cancelled",
        }.get(outcome.status, "compaction_failed")

    async def _fx_start_threshold_compaction(self) -> str | None:
        return await self._auto_compaction("threshold")

    async def _fx_start_overflow_compaction(self) -> str | None:
        return await self._auto_compaction("overflow")

    async def _fx_cancel_compaction(self) -> None:
        # Cancelled through the effect scope; the operation settled itself as cancelled.
        return None

    def _end_payload(self) -> dict[str, Any]:
        outcome = self._turn_state.outcome
        result = None
        if outcome is not None and outcome.result is not None:
            result = {
                "summary": outcome.result.summary,
                "firstKeptEntryId": outcome.result.first_kept_entry_id,
                "tokensBefore": outcome.result.tokens_before,
                "details": outcome.result.details,
            }
        return {"result": result, "aborted": False, "willRetry": False}

    async def _fx_emit_compaction_end(self) -> None:
        payload = self._end_payload()
        outcome = self._turn_state.outcome
        if outcome is not None and outcome.status == "committed":
            payload["willRetry"] = self._turn_state.will_retry
            # D19: no second compaction in this turn; say so when it did not get under the line.
            context = self.session.context()
            estimate = sum(context.estimates)
            if should_compact(estimate, self.settings.context_window, self.settings.compaction):
                payload["stillOverThreshold"] = True
                payload["errorMessage"] = (
                    f"Context is still over the compaction threshold after compacting "
                    f"(~{estimate} tokens); not compacting again in this turn."
                )
        elif outcome is not None and outcome.status == "skipped":
            payload["skipped"] = True
            payload["reason"] = outcome.reason
        self.events.emit("auto_compaction_end", **payload)

    async def _fx_emit_compaction_aborted(self) -> None:
        self.events.emit("auto_compaction_end", **{**self._end_payload(), "aborted": True})

    async def _fx_emit_compaction_failed(self) -> None:
        error = self._outcome_error()
        self.events.emit(
            "auto_compaction_end",
            **{**self._end_payload(), "errorMessage": f"Auto-compaction failed: {error}"},
        )

    async def _fx_emit_recovery_failed(self) -> None:
        error = self._outcome_error()
        self.events.emit(
            "auto_compaction_end",
            **{**self._end_payload(), "errorMessage": f"Context overflow recovery failed: {error}"},
        )

    def _outcome_error(self) -> str:
        outcome = self._turn_state.outcome
        return outcome.error if outcome is not None and outcome.error else "compaction failed"

    async def _fx_emit_overflow_failed(self) -> None:
        self.events.emit(
            "auto_compaction_end",
            result=None,
            aborted=False,
            willRetry=False,
            errorMessage=OVERFLOW_FAILED,
        )

    def _retry_delay_ms(self) -> int:
        policy = self.settings.retry
        delay = int(policy.base_delay_ms * 2**self._turn_state.retry_attempt)
        hint = retry_after_from_text(self._turn_state.last_error)
        if hint is not None:
            delay = max(delay, int(hint * 1000))
        return delay

    async def _fx_emit_retry_start(self) -> None:
        t = self._turn_state
        delay = self._retry_delay_ms()
        t.retry_attempt += 1
        self._retry_wait_ms = delay
        self.events.emit(
            "auto_retry_start",
            attempt=t.retry_attempt,
            maxAttempts=self.settings.retry.max_retries,
            delayMs=delay,
            errorMessage=t.last_error,
        )

    async def _fx_emit_retry_end(self) -> None:
        t = self._turn_state
        self.events.emit(
            "auto_retry_end",
            success=False,
            attempt=t.retry_attempt,
            finalError=t.last_error or "aborted",
        )
        t.retry_attempt = 0

    async def _fx_sleep_retry(self) -> str | None:
        # The failed reply stays in the file; the retry does not send it again.
        if self._turn_state.last_reply_id is not None:
            self._dropped.add(self._turn_state.last_reply_id)

        async def wait() -> str:
            await self._sleep(self._retry_wait_ms / 1000)
            return "retry_wait_done"

        return await self._interruptible(wait)

    async def _fx_cancel_retry_wait(self) -> None:
        return None

    async def _fx_append_continue_message(self) -> None:
        self.session.append_custom_message(
            AUTO_CONTINUE_TYPE, render("auto_continue"), display=False
        )

    async def _fx_start_manual_compaction(self) -> str | None:
        focus, self._manual_focus = self._manual_focus, None
        dry_run, self._manual_dry_run = self._manual_dry_run, False
        return await self._interruptible(lambda: self._compaction_event("manual", focus, dry_run))

    async def _fx_report_manual_result(self) -> None:
        outcome = self._turn_state.outcome
        if self.turn.state == "idle" and (outcome is None or outcome.status not in ENDED):
            outcome = OperationOutcome(
                operation_id=outcome.operation_id if outcome else "", status="cancelled"
            )
            self._turn_state.outcome = outcome
        for done, box in self._manual_waiters:
            if outcome is not None:
                box.append(outcome)
            done.set()
        self._manual_waiters.clear()

    async def _fx_close_session(self) -> None:
        self.session.close()
