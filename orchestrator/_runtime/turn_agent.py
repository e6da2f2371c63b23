"""The turn table's effects on the agent's side: the user message, the agent, retries, resuming.

Split from the turn driver (:mod:`orchestrator._runtime.turn`) by concept. ``call_agent`` runs
the agent on the live context, appends what it yields, and reports how its last reply ended
(:func:`~orchestrator._runtime.replies.classify`); ``sleep_retry`` waits and reports ``ok``;
``resume_turn`` reports that the agent may go on. ``omit_failed_attempt`` appends the
``context_edit`` entries that hide a failed attempt from the context, in the file, as pi 1.6 does
before its overflow compaction (D18) and before a transient-error retry (D21): the retry's request
is then the file's context, and a row without the effect sends the failed reply again. Which row
follows is the table's choice. They perform through the driver's narrow
:class:`~orchestrator._runtime.turn_host.Host` interface, never the façade.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

from orchestrator._core.entries import CONTEXT_EDIT, MESSAGE, Message
from orchestrator._core.errors import ConflictError, OrchestratorError
from orchestrator._core.prompts import render
from orchestrator._core.tokens import calculate_context_tokens, should_compact
from orchestrator._runtime.agent import AgentInput
from orchestrator._runtime.driver import Effect, Report
from orchestrator._runtime.replies import (
    AUTO_CONTINUE_TYPE,
    classify,
    failed_attempt,
    retry_after_hint_ms,
    retry_delay_ms,
)
from orchestrator._runtime.turn_host import Host
from orchestrator._runtime.types import TurnCounters
from orchestrator._store.session import Session

_log = logging.getLogger("orchestrator.runtime")


class TurnAgent:
    """The agent-side effects of the turn table, and what only they remember.

    Args:
        host: The turn driver they perform for.

    Attributes:
        prompt: The text ``start_turn`` appends next (set by the driver's requests).
    """

    def __init__(self, host: Host) -> None:
        # The driver holds these effects; holding the driver back strongly would make a cycle
        # that keeps it and its whole session alive until a full collection (see
        # orchestrator._runtime.driver.weakly).
        self.host: Host = weakref.proxy(host)
        self.prompt = ""
        self._retry_wait_ms = 0

    def effects(self) -> Mapping[str, Effect]:
        """The effect table's entries these perform (a new mapping: this object keeps none)."""
        return {
            "start_turn": self._start_turn,
            "call_agent": self._call_agent,
            "stop_agent": self._stop_in_flight,
            "omit_failed_attempt": self._omit_failed_attempt,
            "prune_tool_outputs": self._prune_tool_outputs,
            "emit_retry_start": self._emit_retry_start,
            "emit_retry_end": self._emit_retry_end,
            "sleep_retry": self._sleep_retry,
            "cancel_retry_wait": self._stop_in_flight,
            "append_continue_message": self._append_continue_message,
            "resume_turn": self._resume_turn,
            "close_session": self._close_session,
        }

    def close_retry_streak(self) -> None:
        """End a retry streak the turn stopped in without a verdict (``success: false``).

        An abort, a manual compaction or an overflow recovery that failed stopped it: its
        ``auto_retry_start`` still gets its ``auto_retry_end``. A streak that ended on a reply
        has none left.
        """
        if self.host.counters.retry_attempt > 0:
            self._retry_failed()

    async def _start_turn(self) -> None:
        self.close_retry_streak()  # the previous turn's, before its counters go
        self.host.counters = TurnCounters()
        text, self.prompt = self.prompt, ""
        session = self.host.session()
        message: Message = {
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "timestamp": self.host.ports.clock_ms(),
        }
        try:
            # Conditional on where this session last saw the file end (D27): pi appending
            # between turns, or the file replaced by a rename, made the turn go on from the old
            # leaf (pi's message an abandoned branch the model never saw) or write into the
            # replaced file's old inode (lost). Refused instead, nothing written, and the file
            # read again, so the next prompt starts from what is there.
            entry = session.append_message(message, expect=session.tail())
        except ConflictError:
            self._read_again(session)
            raise
        self.host.ports.events.emit("message", entryId=entry["id"], role="user")

    @staticmethod
    def _read_again(session: Session) -> None:
        try:
            session.reload()
        except OrchestratorError as error:
            _log.info("%s; the session stays as it was read", error)

    async def _call_agent(self) -> Report | None:
        return await self.host.in_flight(self._run_agent)

    async def _run_agent(self) -> Report:
        agent, session = self.host.ports.agent, self.host.session()
        assert agent is not None, "a turn needs an agent"
        context = session.context()
        turn = AgentInput(
            messages=list(context.messages),
            model=context.model,
            thinking_level=context.thinking_level,
            now_ms=self.host.ports.clock_ms,
        )
        last: tuple[str, Message] | None = None
        async for message in agent.run(turn):
            entry = session.append_message(message)
            self.host.ports.events.emit("message", entryId=entry["id"], role=message.get("role"))
            if message.get("role") == "assistant":
                last = (entry["id"], message)
        session.store.sync()
        return self._classified(last)

    def _classified(self, last: tuple[str, Message] | None) -> Report:
        t = self.host.counters
        reply = None
        if last is not None:
            t.last_reply_id, reply = last
            t.last_reply = reply
        stale = reply is not None and self._is_stale(reply)
        verdict = classify(reply, self.host.settings, stale=stale)
        t.over_threshold, t.context_full = verdict.over_threshold, verdict.context_full
        if verdict.error:
            t.last_error = verdict.error
            t.last_retry_after_ms = retry_after_hint_ms(reply)
        if verdict.retries_ended is not None and t.retry_attempt > 0:
            payload: dict[str, Any] = {"success": verdict.retries_ended, "attempt": t.retry_attempt}
            if not verdict.retries_ended:
                payload["finalError"] = t.last_error
            self.host.ports.events.emit("auto_retry_end", **payload)
            t.retry_attempt = 0
        return Report(outcome=verdict.outcome, error=verdict.error or None)

    def _is_stale(self, reply: Message) -> bool:
        # A reply from before the latest compaction measured a context that no longer exists.
        # The live context opens with that compaction's summary when there is one: O(1).
        messages = self.host.session().context().messages
        if not messages or messages[0].get("role") != "compactionSummary":
            return False
        return int(reply.get("timestamp") or 0) <= int(messages[0].get("timestamp") or 0)

    async def _stop_in_flight(self) -> None:
        await self.host.machine.stop_in_flight()

    async def _omit_failed_attempt(self) -> None:
        # Written, not only left out of the next request: a reopened session, another process
        # and pi itself then build the context this turn goes on with (D18, D21). Each edit is
        # conditional on where this session last saw the file end (D27), as the user message
        # is: a target must be on the branch the file goes on from.
        reply_id = self.host.counters.last_reply_id
        if reply_id is None:
            return
        session = self.host.session()
        path = session.path()
        after = next((i for i, e in enumerate(path) if e["id"] == reply_id), len(path))
        messages = [(e["id"], e["message"]) for e in path[after:] if e.get("type") == MESSAGE]
        try:
            for target in failed_attempt(messages, reply_id):
                session.append_entry(
                    CONTEXT_EDIT,
                    {"targetId": target, "replacement": None},
                    expect=session.tail(),
                )
        except ConflictError:
            self._read_again(session)
            raise
        session.store.sync()

    async def _prune_tool_outputs(self) -> Report:
        t = self.host.counters
        if not self.host.settings.prune:
            return Report(outcome="ok")
        # The prune goes on with the turn's start slot, if still held (turn.py hand_slot).
        outcome = await self.host.operations.prune(slot=self.host.hand_slot())
        if outcome.tokens_saved and t.last_reply is not None:
            usage = t.last_reply.get("usage") or {}
            tokens = max(0, calculate_context_tokens(usage) - outcome.tokens_saved)
            t.over_threshold = should_compact(
                tokens, self.host.settings.context_window, self.host.settings.compaction
            )
        return Report(outcome="ok")

    async def _emit_retry_start(self) -> None:
        t = self.host.counters
        delay = retry_delay_ms(
            self.host.settings.retry, t.retry_attempt, t.last_error, t.last_retry_after_ms
        )
        t.retry_attempt += 1
        self._retry_wait_ms = delay
        self.host.ports.events.emit(
            "auto_retry_start",
            attempt=t.retry_attempt,
            maxAttempts=self.host.settings.retry.max_retries,
            delayMs=delay,
            errorMessage=t.last_error,
        )

    async def _emit_retry_end(self) -> None:
        self._retry_failed()

    def _retry_failed(self) -> None:
        t = self.host.counters
        self.host.ports.events.emit(
            "auto_retry_end",
            success=False,
            attempt=t.retry_attempt,
            finalError=t.last_error or "aborted",
        )
        t.retry_attempt = 0

    async def _sleep_retry(self) -> Report | None:
        async def wait() -> Report:
            await self.host.ports.sleep(self._retry_wait_ms / 1000)
            return Report(outcome="ok")

        return await self.host.in_flight(wait)

    async def _append_continue_message(self) -> None:
        self.host.session().append_custom_message(
            AUTO_CONTINUE_TYPE, render("auto_continue"), display=False
        )

    async def _resume_turn(self) -> Report:
        return Report(outcome="ok")

    async def _close_session(self) -> None:
        session = self.host.session()
        journal = self.host.ports.journal
        try:
            if journal is not None:
                # The journal's last records (an operation's final state, the turns since)
                # become durable here, once, not with an fsync per operation (issue 9). A
                # session never written (a new one) takes the journal it made with it. Both
                # before the session's lock goes: nobody else may open the journal meanwhile.
                journal.close(durable=session.persisted, unwritten=not session.persisted)
        finally:
            session.close()
