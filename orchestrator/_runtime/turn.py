"""The turn driver: an agent session's turns, run by ``machines/turn.toml`` (D31).

Theory of operation. The table decides; this module performs. A run starts from a request
(``user_prompt`` or ``manual_compact``) and loops

    step(table, state, event, facts) -> Step(dest, effects)    # the only decision
    for each effect: report = await effects[name]()             # performs one thing, reports
    event = translate(effect, report)                           # the turn machine's words

until the effects report nothing and no request is waiting: the machine rests. Each effect
reports an outcome and never picks a state: ``call_agent`` reports how the agent's last reply
ended (``ok``, ``overflow``, ``truncated``, ``transient``, ``fatal``, see
:mod:`~orchestrator._runtime.replies`), a compaction its operation's status, a wait ``ok``, and
``resume_turn`` that the agent may go on. Whether that means prune, compact, retry, resume or stop
is the row's choice, with guards reading :meth:`TurnDriver.facts` (the per-turn counters of D18
and D19 and the last reply's measurements).

Requests. ``abort`` and ``manual_compact`` only record the request and wake the loop; the loop
steps them through the table at the next point (between effects, or while an effect such as the
agent, a retry wait or a compaction is in flight), and the row's own stop effect (``stop_agent``,
``cancel_retry_wait``, ``cancel_compaction``) cancels the work in flight and waits until it has
settled (D22). A request the current state does not list is dropped. A prompt sent while a run is
in progress is queued; when the machine rests, the oldest queued prompt is stepped as
``follow_up`` if the state lists it (the table says a follow-up starts the next turn from
``idle``); a prompt the table never takes is dropped when the run ends. ``close`` is a row too:
its ``close_session`` effect releases the session.

A run cancelled from outside (the server shutting down) settles through the table's ``abort``
row, shielded, so the machine rests in a state the next request can use.

The driver takes the ports record, the operation runner and the settings, never the session
façade; nothing here reads a clock or makes an id except through the ports.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from orchestrator._core.entries import Message
from orchestrator._core.errors import Cancelled, SessionError
from orchestrator._core.prompts import render
from orchestrator._core.tokens import calculate_context_tokens, should_compact
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import Step
from orchestrator._runtime.agent import AgentInput
from orchestrator._runtime.driver import Effect, Interpreter, Report
from orchestrator._runtime.operations import OperationRunner, raise_for
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.replies import (
    AUTO_CONTINUE_TYPE,
    OVERFLOW_FAILED,
    classify,
    end_payload,
    outcome_error,
    retry_delay_ms,
)
from orchestrator._runtime.types import (
    OperationOutcome,
    RuntimeSettings,
    TurnCounters,
    TurnResult,
)
from orchestrator._store.session import Session
from orchestrator._telemetry.tracing import facts_delta

__all__ = ["OVERFLOW_FAILED", "ManualRequest", "TurnDriver"]

_AGENT_EVENTS = {
    "ok": "agent_done",
    "overflow": "overflow",
    "truncated": "reply_truncated",
    "transient": "transient_error",
    "fatal": "fatal_error",
}
_COMPACTION_EVENTS = {
    "committed": "compaction_done",
    "skipped": "compaction_skipped",
    "cancelled": "compaction_cancelled",
}
_COMPACTIONS = frozenset(
    {"start_threshold_compaction", "start_overflow_compaction", "start_manual_compaction"}
)
_ENDED = frozenset({"committed", "skipped", "cancelled", "failed"})


@dataclass(slots=True)
class ManualRequest:
    """A manual compaction asked for: its options, and where its outcome is handed over."""

    focus: str | None
    dry_run: bool
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: OperationOutcome | None = None


class TurnDriver:
    """Runs an agent session's turns through the turn table.

    Args:
        ports: What the effects perform through (the session and the agent among them).
        operations: Runs the prunes and compactions.
        settings: The runtime settings (window, compaction, retry, prune).

    Raises:
        DefinitionError: The effect table does not match the turn table.
    """

    def __init__(
        self,
        ports: Ports,
        operations: OperationRunner,
        settings: RuntimeSettings,
        *,
        navigating: Callable[[], bool] = lambda: False,
    ) -> None:
        self.ports = ports
        self.operations = operations
        self.settings = settings
        self.navigating = navigating
        self.effects: Mapping[str, Effect] = {
            "start_turn": self._start_turn,
            "call_agent": self._call_agent,
            "stop_agent": self._stop_in_flight,
            "drop_failed_reply": self._drop_failed_reply,
            "prune_tool_outputs": self._prune_tool_outputs,
            "start_threshold_compaction": lambda: self._auto_compaction("threshold"),
            "start_overflow_compaction": lambda: self._auto_compaction("overflow"),
            "cancel_compaction": self._cancel_compaction,
            "emit_compaction_end": self._emit_compaction_end,
            "emit_compaction_aborted": self._emit_compaction_aborted,
            "emit_compaction_failed": lambda: self._emit_failure("Auto-compaction failed"),
            "emit_recovery_failed": lambda: self._emit_failure("Context overflow recovery failed"),
            "emit_overflow_failed": self._emit_overflow_failed,
            "emit_retry_start": self._emit_retry_start,
            "emit_retry_end": self._emit_retry_end,
            "sleep_retry": self._sleep_retry,
            "cancel_retry_wait": self._stop_in_flight,
            "append_continue_message": self._append_continue_message,
            "resume_turn": self._resume_turn,
            "start_manual_compaction": self._start_manual_compaction,
            "report_manual_result": self._report_manual_result,
            "close_session": self._close_session,
        }
        self.machine = Interpreter(ports.tables("turn"), self.effects, observers=(self._record,))
        self.counters = TurnCounters()
        self._dropped: set[str] = set()  # failed replies the live context leaves out (D18)
        self._prompt = ""  # what start_turn appends
        self._follow_ups: deque[str] = deque()
        self._manual: ManualRequest | None = None
        self._lock = anyio.Lock()
        self._group: TaskGroup | None = None
        self._turns = 0
        self._retry_wait_ms = 0

    def rewire(
        self,
        ports: Ports,
        operations: OperationRunner,
        settings: RuntimeSettings,
        navigating: Callable[[], bool],
    ) -> None:
        """Perform later effects through new ports (the session's routes or settings changed)."""
        self.ports, self.operations, self.settings = ports, operations, settings
        self.navigating = navigating

    @property
    def state(self) -> str:
        """The turn machine's state."""
        return self.machine.state

    @property
    def busy(self) -> bool:
        """A run (a turn, or a manual compaction) is in progress."""
        return self._lock.locked()

    def facts(self) -> Facts:
        """What the turn table's guards read."""
        t, settings = self.counters, self.settings
        return Facts(
            compaction_enabled=settings.compaction.enabled,
            over_threshold=t.over_threshold,
            context_full=t.context_full,
            overflow_attempted=t.overflow_attempted,
            auto_compactions=t.auto_compactions,
            retry_attempt=t.retry_attempt,
            max_retries=settings.retry.max_retries if settings.retry.enabled else 0,
            will_retry=t.will_retry,
            auto_continue=settings.compaction.auto_continue,
        )

    # -- requests ---------------------------------------------------------------------------------

    async def prompt(self, text: str) -> TurnResult:
        """Run a turn for ``text`` to its end; while a run is in progress, queue it instead.

        Raises:
            SessionError: There is no agent, or a tree navigation is in progress.
        """
        if self.ports.agent is None:
            raise SessionError("this session has no agent; pass agent= to AgentSession")
        self._refuse_during_navigation("prompt")
        if self.busy:
            self._follow_ups.append(text)
            return TurnResult(queued=True, state=self.state)
        await self._run("user_prompt", text)
        return TurnResult(reply=self.counters.last_reply, state=self.state)

    async def compact(self, focus: str | None, *, dry_run: bool) -> OperationOutcome:
        """Ask for a manual compaction and wait for its outcome.

        Raises:
            SessionError: A manual compaction or a tree navigation is already running, or the
                commit conflicted.
            Cancelled: It was cancelled, or it never ran (the run ended first).
            ModelError: It failed.
        """
        self._refuse_during_navigation("compact")
        if self._manual is not None or self.state == "manual_compacting":
            raise SessionError("A manual compaction is already running")
        request = ManualRequest(focus=focus, dry_run=dry_run)
        self._manual = request
        if self.busy:
            self.machine.interrupt("manual_compact")
            await request.done.wait()
        else:
            await self._run("manual_compact")
        if request.outcome is None:
            raise Cancelled("Compaction cancelled: the session closed before it ran")
        return raise_for(request.outcome)

    def _refuse_during_navigation(self, what: str) -> None:
        if self.navigating():
            raise SessionError(f"Cannot {what} while a tree navigation is in progress")

    def abort(self) -> None:
        """Ask the run in progress to stop; the table decides what that means now (D22)."""
        if self.busy:
            self.machine.interrupt("abort")

    def close(self) -> None:
        """Step ``close`` through the table; its effect releases the session.

        Raises:
            SessionError: A run is in progress (abort it first).
            TransitionError: The table does not list ``close`` in the current state.
        """
        if self.machine.done:
            return
        if self.busy:
            raise SessionError("Cannot close the session while a turn is running; abort it first")
        taken = self.machine.step("close", self.facts())
        for name in taken.effects:
            self.machine.perform_now(name)

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self, event: str, prompt: str = "") -> None:
        async with self._lock:
            self._prompt = prompt
            self._turns += 1
            session = self._session()
            try:
                with self.ports.tracer.turn_span(session.session_id, self._turns):
                    await self._drive(event)
            finally:
                self.machine.drop_interrupts()
                self._follow_ups.clear()
                request, self._manual = self._manual, None
                if request is not None:
                    request.done.set()

    async def _drive(self, event: str) -> None:
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                await self._loop(event)
        except BaseExceptionGroup as errors:
            raise _first(errors) from None
        except anyio.get_cancelled_exc_class():
            # Cancelled from outside: settle through the table so the machine can be used again.
            with anyio.CancelScope(shield=True):
                if self.machine.listed("abort"):
                    await self._loop("abort")
            raise
        finally:
            self._group = None

    async def _loop(self, event: str | None) -> None:
        while event is not None:
            taken = self.machine.step(event, self.facts())
            event = await self._perform(taken.effects)
            if event is None:
                event = self._at_rest()

    async def _perform(self, effects: tuple[str, ...]) -> str | None:
        event: str | None = None
        for name in effects:
            report = await self.machine.perform(name)
            interrupt = self.machine.take_listed_interrupt()
            if interrupt is not None:
                return interrupt
            if report is not None:
                event = _translate(name, report)
        return event

    def _at_rest(self) -> str | None:
        interrupt = self.machine.take_listed_interrupt()
        if interrupt is not None:
            return interrupt
        if self._follow_ups and self.machine.listed("follow_up"):
            self._prompt = self._follow_ups.popleft()
            return "follow_up"
        return None

    async def _in_flight(self, work: Callable[[], Awaitable[Report]]) -> Report | None:
        # Slow work runs in a child task so a request can be stepped meanwhile (None: it was).
        if self._group is None:
            return await work()
        return await self.machine.in_flight(self._group, work)

    def _record(self, step: Step, data: Mapping[str, Any]) -> None:
        del data
        journal = self.ports.journal
        # Closing is traced and announced but not journaled: a session opened and closed again
        # leaves no journal beside it.
        if journal is not None and step.event != "close":
            # What the guards read, so the journal replays through the table (D31).
            facts = facts_delta(step.facts) if step.facts is not None else {}
            journal.record(step, data={"facts": facts})
        self.ports.observe(step)

    def _session(self) -> Session:
        session = self.ports.session
        assert session is not None, "a turn needs a session"
        return session

    # -- the effect table -------------------------------------------------------------------------

    async def _start_turn(self) -> None:
        self.counters = TurnCounters()
        self._dropped.clear()
        text, self._prompt = self._prompt, ""
        entry = self._session().append_message(
            {
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": self.ports.clock_ms(),
            }
        )
        self.ports.events.emit("message", entryId=entry["id"], role="user")

    async def _call_agent(self) -> Report | None:
        return await self._in_flight(self._run_agent)

    async def _run_agent(self) -> Report:
        agent, session = self.ports.agent, self._session()
        assert agent is not None, "a turn needs an agent"
        context = session.context()
        messages = [
            m
            for m, i in zip(context.messages, context.entry_ids, strict=True)
            if i not in self._dropped
        ]
        turn = AgentInput(
            messages=messages,
            model=context.model,
            thinking_level=context.thinking_level,
            now_ms=self.ports.clock_ms,
        )
        last: tuple[str, Message] | None = None
        async for message in agent.run(turn):
            entry = session.append_message(message)
            self.ports.events.emit("message", entryId=entry["id"], role=message.get("role"))
            if message.get("role") == "assistant":
                last = (entry["id"], message)
        session.store.sync()
        return self._classified(last)

    def _classified(self, last: tuple[str, Message] | None) -> Report:
        t = self.counters
        reply = None
        if last is not None:
            t.last_reply_id, reply = last
            t.last_reply = reply
        stale = reply is not None and self._is_stale(reply)
        verdict = classify(reply, self.settings, stale=stale)
        t.over_threshold, t.context_full = verdict.over_threshold, verdict.context_full
        if verdict.error:
            t.last_error = verdict.error
        if verdict.retries_ended is not None and t.retry_attempt > 0:
            payload: dict[str, Any] = {"success": verdict.retries_ended, "attempt": t.retry_attempt}
            if not verdict.retries_ended:
                payload["finalError"] = t.last_error
            self.ports.events.emit("auto_retry_end", **payload)
            t.retry_attempt = 0
        return Report(outcome=verdict.outcome, error=verdict.error or None)

    def _is_stale(self, reply: Message) -> bool:
        # A reply from before the latest compaction measured a context that no longer exists.
        # The live context opens with that compaction's summary when there is one: O(1).
        messages = self._session().context().messages
        if not messages or messages[0].get("role") != "compactionSummary":
            return False
        return int(reply.get("timestamp") or 0) <= int(messages[0].get("timestamp") or 0)

    async def _stop_in_flight(self) -> None:
        await self.machine.stop_in_flight()

    async def _drop_failed_reply(self) -> None:
        if self.counters.last_reply_id is not None:
            self._dropped.add(self.counters.last_reply_id)

    async def _prune_tool_outputs(self) -> Report:
        t = self.counters
        if not self.settings.prune:
            return Report(outcome="ok")
        outcome = await self.operations.prune()
        if outcome.tokens_saved and t.last_reply is not None:
            usage = t.last_reply.get("usage") or {}
            tokens = max(0, calculate_context_tokens(usage) - outcome.tokens_saved)
            t.over_threshold = should_compact(
                tokens, self.settings.context_window, self.settings.compaction
            )
        return Report(outcome="ok")

    async def _auto_compaction(self, reason: str) -> Report | None:
        t = self.counters
        t.will_retry = reason == "overflow"
        t.overflow_attempted = t.overflow_attempted or reason == "overflow"
        t.auto_compactions += 1  # D19 counts every automatic compaction, whatever its reason
        self.ports.events.emit("auto_compaction_start", reason=reason)
        return await self._compaction(reason, None, dry_run=False)

    async def _start_manual_compaction(self) -> Report | None:
        request = self._manual
        focus, dry_run = (request.focus, request.dry_run) if request else (None, False)
        return await self._compaction("manual", focus, dry_run=dry_run)

    async def _compaction(self, reason: str, focus: str | None, *, dry_run: bool) -> Report | None:
        self.counters.outcome = None

        async def work() -> Report:
            outcome = await self.operations.compaction(reason=reason, focus=focus, dry_run=dry_run)
            self.counters.outcome = outcome
            return Report(outcome=outcome.status)

        return await self._in_flight(work)

    async def _cancel_compaction(self) -> None:
        # The operation settles through its own table's cancel row when its task is cancelled.
        run = self.operations.current
        await self.machine.stop_in_flight()
        if run is not None and run.machine.done:
            self.counters.outcome = run.outcome()

    async def _emit_compaction_end(self) -> None:
        outcome = self.counters.outcome
        payload = end_payload(outcome)
        if outcome is not None and outcome.status == "committed":
            payload["willRetry"] = self.counters.will_retry
            # D19: no second compaction in this turn; say so when it did not get under the line.
            estimate = sum(self._session().context().estimates)
            settings = self.settings
            if should_compact(estimate, settings.context_window, settings.compaction):
                payload["stillOverThreshold"] = True
                payload["errorMessage"] = (
                    f"Context is still over the compaction threshold after compacting "
                    f"(~{estimate} tokens); not compacting again in this turn."
                )
        elif outcome is not None and outcome.status == "skipped":
            payload["skipped"] = True
            payload["reason"] = outcome.reason
        self.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_compaction_aborted(self) -> None:
        payload = {**end_payload(self.counters.outcome), "aborted": True}
        self.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_failure(self, what: str) -> None:
        outcome = self.counters.outcome
        payload = {**end_payload(outcome), "errorMessage": f"{what}: {outcome_error(outcome)}"}
        self.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_overflow_failed(self) -> None:
        self.ports.events.emit(
            "auto_compaction_end",
            result=None,
            aborted=False,
            willRetry=False,
            errorMessage=OVERFLOW_FAILED,
        )

    async def _emit_retry_start(self) -> None:
        t = self.counters
        delay = retry_delay_ms(self.settings.retry, t.retry_attempt, t.last_error)
        t.retry_attempt += 1
        self._retry_wait_ms = delay
        self.ports.events.emit(
            "auto_retry_start",
            attempt=t.retry_attempt,
            maxAttempts=self.settings.retry.max_retries,
            delayMs=delay,
            errorMessage=t.last_error,
        )

    async def _emit_retry_end(self) -> None:
        t = self.counters
        self.ports.events.emit(
            "auto_retry_end",
            success=False,
            attempt=t.retry_attempt,
            finalError=t.last_error or "aborted",
        )
        t.retry_attempt = 0

    async def _sleep_retry(self) -> Report | None:
        # The failed reply stays in the file; the retry does not send it again.
        if self.counters.last_reply_id is not None:
            self._dropped.add(self.counters.last_reply_id)

        async def wait() -> Report:
            await self.ports.sleep(self._retry_wait_ms / 1000)
            return Report(outcome="ok")

        return await self._in_flight(wait)

    async def _append_continue_message(self) -> None:
        self._session().append_custom_message(
            AUTO_CONTINUE_TYPE, render("auto_continue"), display=False
        )

    async def _resume_turn(self) -> Report:
        return Report(outcome="ok")

    async def _report_manual_result(self) -> None:
        outcome = self.counters.outcome
        if self.state == "idle" and (outcome is None or outcome.status not in _ENDED):
            operation_id = outcome.operation_id if outcome else ""
            outcome = OperationOutcome(operation_id=operation_id, status="cancelled")
            self.counters.outcome = outcome
        request, self._manual = self._manual, None
        if request is not None:
            request.outcome = outcome
            request.done.set()

    async def _close_session(self) -> None:
        self._session().close()


def _translate(effect: str, report: Report) -> str:
    if effect == "call_agent":
        return _AGENT_EVENTS[report.outcome]
    if effect in _COMPACTIONS:
        return _COMPACTION_EVENTS.get(report.outcome, "compaction_failed")
    return {
        "prune_tool_outputs": "pruned",
        "sleep_retry": "retry_wait_done",
        "resume_turn": "resume",
    }[effect]


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    # The loop's own error (an agent that raised, a refused step) comes back grouped: unwrap it.
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup) and first.exceptions:
        first = first.exceptions[0]
    return first
