"""One process's agent side of the turn table: the user message, the agent, waits, omissions.

The host-agnostic half of the turn (counters, retry waits, event payloads, the effect binding)
is :mod:`~orchestrator._runtime.turn.core`; this is what one process performs for it
(:class:`~orchestrator._runtime.turn.core.AgentSide`). ``call_agent`` runs
the agent on the live context, appends what it yields, and reports how its last reply ended
(:func:`~orchestrator._runtime.turn.replies.classify`); ``wait`` sleeps and reports ``ok``.
``omit_failed_attempt`` appends the
``context_edit`` entries that hide a failed attempt from the context, in the file, as pi 1.6 does
before its overflow compaction (D18) and before a transient-error retry (D21): the retry's request
is then the file's context, and a row without the effect sends the failed reply again. Which row
follows is the table's choice. They perform through the driver's narrow
:class:`~orchestrator._runtime.turn.host.Host` interface, never the façade.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from orchestrator._core.entries import CONTEXT_EDIT, MESSAGE, Message
from orchestrator._core.errors import ConflictError, OrchestratorError
from orchestrator._core.prompts import render
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.agent import AgentInput
from orchestrator._runtime.driver import Report
from orchestrator._runtime.turn.core import TurnTerms
from orchestrator._runtime.turn.host import Host
from orchestrator._runtime.turn.replies import AUTO_CONTINUE_TYPE, classify, failed_attempt
from orchestrator._store.session import Session

_log = logging.getLogger("orchestrator.runtime")


class TurnAgent:
    """One process's agent side of the turn table.

    Args:
        host: The turn driver it performs for.
    """

    def __init__(self, host: Host) -> None:
        # The driver holds these effects; holding the driver back strongly would make a cycle
        # that keeps it and its whole session alive until a full collection (see
        # orchestrator._runtime.scheduler.weakly).
        self.host: Host = weakref.proxy(host)

    @property
    def state(self) -> str:
        """The turn machine's state."""
        return self.host.machine.state

    def emit(self, type_: str, **payload: Any) -> None:
        """Emit an event to the session's listeners."""
        self.host.ports.events.emit(type_, **payload)

    def terms(self) -> TurnTerms:
        """The settings the turn's decisions read."""
        settings = self.host.settings
        return TurnTerms(
            compaction=settings.compaction,
            context_window=settings.context_window,
            auto_continue=settings.compaction.auto_continue,
            max_retries=settings.retry.max_retries if settings.retry.enabled else 0,
            base_delay_ms=settings.retry.base_delay_ms,
            prune=settings.prune,
        )

    async def append_user(self, text: str) -> None:
        """Append the user message, conditional on where the file ended (D27)."""
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
        self.emit("message", entryId=entry["id"], role="user")

    @staticmethod
    def _read_again(session: Session) -> None:
        try:
            session.reload()
        except OrchestratorError as error:
            _log.info("%s; the session stays as it was read", error)

    async def call_agent(self) -> Report | None:
        """Run the agent in flight, appending what it yields; how its last reply ended."""
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
            self.emit("message", entryId=entry["id"], role=message.get("role"))
            if message.get("role") == "assistant":
                last = (entry["id"], message)
        session.store.sync()
        stale = last is not None and self._is_stale(last[1])
        verdict = classify(last[1] if last else None, self.host.settings, stale=stale)
        return self.host.core.take_reply(last, verdict)

    def _is_stale(self, reply: Message) -> bool:
        # A reply from before the latest compaction measured a context that no longer exists.
        # The live context opens with that compaction's summary when there is one: O(1).
        messages = self.host.session().context().messages
        if not messages or messages[0].get("role") != "compactionSummary":
            return False
        return int(reply.get("timestamp") or 0) <= int(messages[0].get("timestamp") or 0)

    async def stop_agent(self) -> None:
        """Cancel the agent run and wait until it settled (what it appended stays)."""
        await self.host.machine.stop_in_flight()

    async def stop_in_flight(self) -> None:
        """Cancel the retry wait in flight."""
        await self.host.machine.stop_in_flight()

    async def omit_failed_attempt(self) -> None:
        """Write the ``context_edit`` entries omitting the failed reply and its tool results."""
        # Written, not only left out of the next request: a reopened session, another process
        # and pi itself then build the context this turn goes on with (D18, D21). Each edit is
        # conditional on where this session last saw the file end (D27), as the user message
        # is: a target must be on the branch the file goes on from.
        reply_id = self.host.core.counters.last_reply_id
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

    async def prune(self) -> int:
        """Run one prune operation; the tokens it saved."""
        # The prune goes on with the turn's start slot, if still held (turn.py hand_slot).
        outcome = await self.host.operations.prune(slot=self.host.hand_slot())
        return outcome.tokens_saved

    async def wait(self, delay_ms: int) -> Report | None:
        """Sleep in flight before the retry."""

        async def wait() -> Report:
            await self.host.ports.sleep(delay_ms / 1000)
            return Report(outcome=ReportOutcome.OK)

        return await self.host.in_flight(wait)

    async def append_continue_message(self) -> None:
        """Append the D20 ``auto-continue`` message."""
        self.host.session().append_custom_message(
            AUTO_CONTINUE_TYPE, render("auto_continue"), display=False
        )

    async def close_session(self) -> None:
        """Make the journal durable and release the session."""
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
