"""What the effects report, turned into their table's events (D31).

Both hosts of each table use these: the anyio drivers (:mod:`orchestrator._runtime.operation.run`,
:mod:`~orchestrator._runtime.turn.driver`, :mod:`~orchestrator._runtime.navigation.driver`) and the
Temporal workflow (:mod:`orchestrator._cluster.operation.flow`,
:mod:`~orchestrator._cluster.turn.flow`, :mod:`~orchestrator._cluster.navigation.flow`). An effect
performs and reports an outcome; these pure functions name the event that outcome fires and the
facts its guards read, so the table makes the same decision, and the journal reads the same, on
either host. :func:`attempt_summary` is the one model attempt both hosts make (the workflow makes it
inside an activity).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio

from orchestrator._core.errors import (
    MODEL_ERRORS,
    ContextOverflowError,
    FatalModelError,
    ModelError,
    ModelTimeoutError,
    TransientModelError,
)
from orchestrator._core.gate import (
    GateSpec,
    Verdict,
    check_summary,
    feedback_line,
    replaced_measure,
)
from orchestrator._core.model import Model, ModelRequest, ModelResponse
from orchestrator._core.redact import redact
from orchestrator._lifecycle.guards import (
    NO_NAVIGATION_FACTS,
    NavigationFacts,
    OperationFacts,
)
from orchestrator._lifecycle.names import NavigationEvent, OperationEvent, ReportOutcome, TurnEvent
from orchestrator._runtime.delays import retry_delay_ms
from orchestrator._runtime.driver import Report, cancel_scope
from orchestrator._runtime.operation.retry import RetryPolicy, check_summary_response
from orchestrator._runtime.operation.summarize import Part, request_for
from orchestrator._runtime.soon import next_pass

T = TypeVar("T")

_log = logging.getLogger("orchestrator.models")

RETRYABLE = frozenset(k for k, c in MODEL_ERRORS.items() if issubclass(c, TransientModelError))
"""Failure kinds a wait and another attempt may cure (D21): the :class:`TransientModelError`
kinds (``transient`` and ``timeout``), as a report carries them across a host's records."""
COMMIT_EVENTS: Mapping[str, OperationEvent] = {
    "ok": OperationEvent.ENTRY_APPENDED,
    "conflict": OperationEvent.APPEND_CONFLICT,
    "failed": OperationEvent.APPEND_FAILED,
}
"""The commit's outcome to its event."""
HOOK_EVENTS: Mapping[str, str] = {
    "done": "hooks_done",
    "supplied": "hook_supplied",
    "cancelled": "hooks_cancelled",
}
"""The hooks' outcome to its event (the operation and the navigation tables name them alike)."""
_AGENT_EVENTS: Mapping[str, TurnEvent] = {
    "ok": TurnEvent.AGENT_DONE,
    "overflow": TurnEvent.OVERFLOW,
    "truncated": TurnEvent.REPLY_TRUNCATED,
    "transient": TurnEvent.TRANSIENT_ERROR,
    "fatal": TurnEvent.FATAL_ERROR,
}
_COMPACTION_EVENTS: Mapping[str, TurnEvent] = {
    "committed": TurnEvent.COMPACTION_DONE,
    "skipped": TurnEvent.COMPACTION_SKIPPED,
    "cancelled": TurnEvent.COMPACTION_CANCELLED,
}
_COMPACTIONS = frozenset(
    {"start_threshold_compaction", "start_overflow_compaction", "start_manual_compaction"}
)
_TURN_EVENTS: Mapping[str, TurnEvent] = {
    "prune_tool_outputs": TurnEvent.PRUNED,
    "sleep_retry": TurnEvent.RETRY_WAIT_DONE,
    "resume_turn": TurnEvent.RESUME,
}
_SUMMARY_EVENTS: Mapping[str, NavigationEvent] = {
    "committed": NavigationEvent.SUMMARY_COMMITTED,
    "skipped": NavigationEvent.SUMMARY_SKIPPED,
    "cancelled": NavigationEvent.SUMMARY_CANCELLED,
}


def turn_event(effect: str, report: Report) -> TurnEvent:
    """The turn table's event for what a turn effect reported."""
    if effect == "call_agent":
        return _AGENT_EVENTS[report.outcome]
    if effect in _COMPACTIONS:
        return _COMPACTION_EVENTS.get(report.outcome, TurnEvent.COMPACTION_FAILED)
    return _TURN_EVENTS[effect]


def navigation_event(
    effect: str, report: Report, *, wants_summary: bool, has_entries: bool
) -> tuple[str, NavigationFacts]:
    """The navigation table's event for what a navigation effect reported, and its facts.

    Args:
        effect: The effect that reported.
        report: Its report.
        wants_summary: The request asks for a branch summary (read after the hooks).
        has_entries: The abandoned branch has entries to summarize (read after the hooks).
    """
    if effect == "collect_entries":
        return NavigationEvent.COLLECTED, NO_NAVIGATION_FACTS
    if effect == "run_hooks":
        facts = NavigationFacts(wants_summary=wants_summary, has_entries=has_entries)
        return HOOK_EVENTS[report.outcome], facts
    if effect == "start_summary":
        return _SUMMARY_EVENTS.get(
            report.outcome, NavigationEvent.SUMMARY_FAILED
        ), NO_NAVIGATION_FACTS
    return NavigationEvent.SWITCHED, NO_NAVIGATION_FACTS


@dataclass(slots=True)
class Attempts:
    """Where an operation's model attempts are; the counter effects move it (both hosts).

    Attributes:
        part: The summary request being made (an operation may make several, D15).
        candidate: The candidate model of that request being tried (D21).
        retries: Retries made on that candidate so far.
        halvings: Times that request was halved so far (D14).
        refusals: Times the gate refused that candidate's answer to that request (D32).
        offline: The request went to the fallback, the offline summarizer (D32).
        feedback: The line that tells the candidate what the gate refused last time.
        refused: The gate's last refusal, as :func:`~orchestrator._core.gate.feedback_line`
            words it (set by the translation of ``check_summary``'s report).
    """

    part: int = 0
    candidate: int = 0
    retries: int = 0
    halvings: int = 0
    refusals: int = 0
    offline: bool = False
    feedback: str = ""
    refused: str = ""

    async def next_candidate(self) -> None:
        """The ``next_candidate`` effect: the next model, its retries from 0."""
        self.candidate += 1
        self.retries = self.refusals = 0
        self.feedback = ""

    async def next_part(self) -> None:
        """The ``next_part`` effect: the next request, from its first candidate, whole."""
        self.part += 1
        self.candidate = self.retries = self.halvings = self.refusals = 0
        self.offline = False
        self.feedback = ""

    async def shrink_request(self) -> None:
        """The ``shrink_request`` effect: the request is halved once more."""
        self.halvings += 1

    async def ask_again(self) -> None:
        """The ``ask_again`` effect: the same candidate, told what the gate refused (D32)."""
        self.refusals += 1
        self.retries = 0
        self.feedback = self.refused

    async def use_fallback(self) -> None:
        """The ``use_fallback`` effect: the offline summarizer answers this request (D32)."""
        self.offline = True
        self.retries = self.refusals = 0
        self.feedback = ""


def past_deadline(what: str, last: Report | None) -> str:
    """The deadline's failure message, with the last attempt's own failure when there was one.

    "did not finish within 45 s" alone hides why: a provider answering 503 every time, retried
    until the deadline, is a different problem from one that never answers.
    """
    if last is not None and last.error:
        return f"{what}; the last attempt: {last.error}"
    return what


def step_data(report: Report) -> dict[str, Any]:
    """What a report gives its next step's journal line: its data, and its error if any."""
    data = dict(report.data)
    if report.error:
        data["error"] = report.error
    return data


def call_event(
    report: Report,
    at: Attempts,
    *,
    parts: int,
    candidates: int,
    policy: RetryPolicy,
    gate: bool = False,
) -> tuple[str, OperationFacts, int]:
    """The event a model attempt's report fires, its facts, and the wait a retry would take.

    Args:
        report: What ``call_model`` reported.
        at: Where the attempts are.
        parts: How many summary requests the operation makes.
        candidates: How many candidate models the current request has.
        policy: The retry policy of the routes.
        gate: The summary gate is on (D32).

    Returns:
        ``(event, facts, delay_ms)``; ``delay_ms`` is 0 unless the event is ``attempt_failed``.
    """
    if report.outcome == "ok":
        return (
            OperationEvent.SUMMARY_READY,
            OperationFacts(more_parts=at.part + 1 < parts, gate_enabled=gate),
            0,
        )
    if report.outcome == ContextOverflowError.kind:
        return OperationEvent.SUMMARY_OVERFLOW, OperationFacts(shrink_attempts=at.halvings), 0
    max_retries = policy.max_retries if policy.enabled else 0
    delay_ms = retry_delay_ms(policy.base_delay_ms, at.retries, report.retry_after)
    facts = OperationFacts(
        retryable=report.outcome in RETRYABLE,
        retry_attempt=at.retries,
        max_retries=max_retries,
        delay_ms=delay_ms,
        max_delay_ms=policy.switch_after_ms,
        delay_cap_ms=policy.max_delay_ms,
        more_candidates=not at.offline and at.candidate + 1 < candidates,
    )
    return OperationEvent.ATTEMPT_FAILED, facts, delay_ms


def check_event(
    report: Report, at: Attempts, *, parts: int, candidates: int, fallback: bool
) -> tuple[str, OperationFacts]:
    """The event ``check_summary``'s report fires, and its facts (D32).

    Args:
        report: ``passed``, or ``refused`` with the failed check in ``data["check"]``.
        at: Where the attempts are.
        parts: How many summary requests the operation makes.
        candidates: How many candidate models the current request has.
        fallback: The offline summarizer is configured as the last resort.
    """
    if report.outcome == "passed":
        return OperationEvent.SUMMARY_PASSED, OperationFacts(more_parts=at.part + 1 < parts)
    check = str(report.data.get("check", ""))
    # The words `ask_again` tells the candidate, should the table choose it.
    at.refused = feedback_line(Verdict(check=check, reason=report.error or ""))
    return OperationEvent.SUMMARY_REFUSED, OperationFacts(
        refused_check=check,
        refusals=at.refusals,
        more_candidates=not at.offline and at.candidate + 1 < candidates,
        fallback_left=fallback and not at.offline,
    )


def check_report(text: str, spec: GateSpec | None) -> Report:
    """The ``check_summary`` effect, on either host: the gate's verdict as a report (D32)."""
    verdict = check_summary(text, spec or GateSpec(purpose="history"))
    if verdict.passed:
        return Report(outcome=ReportOutcome.PASSED)
    return Report(
        outcome=ReportOutcome.REFUSED, error=verdict.reason, data={"check": verdict.check}
    )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One model attempt's report, the summary text and what the gate checks it against.

    Attributes:
        report: ``ok`` (its data: the model, the prompt and input hashes) or the failure.
        text: The summary (empty unless ``ok``).
        gate: What the request asked for (``None`` unless ``ok``).
    """

    report: Report
    text: str = ""
    gate: GateSpec | None = None


async def attempt_summary(
    part: Part,
    model: Model,
    halvings: int,
    texts: Mapping[str, str],
    timeout_s: float | None,
    feedback: str = "",
    *,
    idle_s: float | None = None,
) -> Attempt:
    """Make one attempt at one summary request and report it (no retry here: the table decides).

    Args:
        part: The summary request.
        model: The candidate asked.
        halvings: Times the request was halved (D14).
        texts: The texts of the earlier requests.
        timeout_s: The attempt's time limit, for a route that answers in one piece.
        feedback: What the gate refused in this candidate's last answer (D32).
        idle_s: For a route that streams (``streams``): the longest silence it allows, and
            then no total limit (a long answer that keeps coming is not cut).

    Returns:
        The report (``ok`` with the model's name and the prompt and input hashes, or the
        failure's kind and text), the summary text and what the gate checks it against.
    """
    try:
        # Building the request may refuse (a window too small for anything useful): that is
        # a failure of this attempt like any other, and no model is paid for it.
        request = request_for(part, model, halvings, texts, feedback)
        measure = _Measure(request)
        next_pass(measure.run)  # while the model is asked, not after it answered
        limit = timeout_s
        if getattr(model, "streams", False):
            request = replace(request, idle_timeout_s=idle_s)
            limit = None
        sibling = bool(getattr(model, "needs_sibling_timer", False))
        response = await within(limit, answer_of(model, request), sibling_timer=sibling)
        if response is None:
            failure = f"{model.name}: no answer after {limit:g} s"
            return Attempt(Report(outcome=ReportOutcome(ModelTimeoutError.kind), error=failure))
        response = check_summary_response(response, request.max_tokens)
    except ModelError as error:
        report = Report(
            outcome=ReportOutcome(error.kind), retry_after=error.retry_after, error=str(error)
        )
        return Attempt(report)
    except Exception as error:  # noqa: BLE001 - cancellation (a BaseException) passes untouched
        # A route that raises anything else is broken (an IndexError on an odd answer, a bug):
        # a fatal failure of this attempt, so the table ends the operation (failed, nothing
        # applied, its journal closed, its events final) instead of the exception leaving it
        # open in `summarizing` until the session is reopened. Logged with its traceback: a
        # bug must not hide behind the failure's one line.
        _log.exception("summary route %s raised", model.name)
        failure = redact(f"{model.name}: {type(error).__name__}: {error}")
        return Attempt(Report(outcome=ReportOutcome(FatalModelError.kind), error=failure))
    input_chars, input_hash = measure.result()
    gate = GateSpec(
        purpose=part.purpose,
        headings=part.headings,
        input_chars=input_chars,
        focus=part.focus,
        read_files=part.read_files,
        modified_files=part.modified_files,
    )
    data = {
        "model": model.name,
        "promptHash": part.prompt_hash,
        "inputHash": input_hash,
        "usage": response.usage.as_pi(),  # written on the entry, as pi 1.x writes it
    }
    return Attempt(Report(outcome=ReportOutcome.OK, data=data), response.text.strip(), gate)


class _Measure:
    """The size and hash of what a request's summary replaces, made once (the gate's input).

    They depend on the request only, and at 10k entries take about a millisecond and a half of
    the event loop (issue 37): :func:`attempt_summary` has them made in the loop's next pass,
    once the model call has started waiting, rather than after its answer, where they delayed
    the commit. A model that answers without waiting gets them made when they are read.
    """

    __slots__ = ("request", "value")

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self.value: tuple[int, str] | None = None

    def run(self) -> None:
        if self.request.messages:  # a request without messages fails where it is read
            self.result()

    def result(self) -> tuple[int, str]:
        if self.value is None:
            self.value = replaced_measure(str(self.request.messages[-1].get("content", "")))
        return self.value


async def answer_of(model: Model, request: ModelRequest) -> ModelResponse:
    """``model.complete(request)``, refused unless it is a :class:`ModelResponse`.

    A route that returns nothing (``None``) or something else is a broken route, not a model
    that took too long: a fatal failure naming what came back, never read as a timeout.
    """
    response: object = await model.complete(request)
    if not isinstance(response, ModelResponse):
        raise FatalModelError(
            f"{model.name}: returned {type(response).__name__}, not a ModelResponse"
        )
    return response


async def within(
    seconds: float | None, call: Awaitable[T], *, sibling_timer: bool = False
) -> T | None:
    """Await ``call``; give up after ``seconds`` (``None``: no limit) and return ``None``.

    A deadline on a cancel scope around the call, with no task of its own (issue 9: a task
    group and a timer task per attempt were a tenth of a compaction's scheduling). With
    ``sibling_timer`` a timer task cancels the call instead: litellm leaves a coroutine
    un-awaited when it runs under a scope that has a deadline.
    """
    if seconds is None:
        return await call
    if not sibling_timer:
        with anyio.move_on_after(seconds):
            return await call
        return None
    box: list[T] = []
    errors: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def timer() -> None:
            await anyio.sleep(seconds)
            cancel_scope(group.cancel_scope)

        group.start_soon(timer)
        try:
            box.append(await call)
        except Exception as error:  # noqa: BLE001 - re-raised below, outside the group
            errors.append(error)
        cancel_scope(group.cancel_scope)
    if errors:
        raise errors[0]
    return box[0] if box else None
