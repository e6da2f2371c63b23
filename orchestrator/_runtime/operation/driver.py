"""The operation machine's one driver: everything about an operation that is not I/O (D31).

Theory of operation. ``machines/operation.toml`` decides; a *host* performs. There are two hosts:
:class:`~orchestrator._runtime.operation.run.OperationRun` (one process, anyio) and
:class:`~orchestrator._cluster.operation.flow.OperationFlow` (a Temporal workflow, its effects
activities). Each host owns only the effects that touch the world: consulting the hooks, calling a
model, waiting, committing, telling the result hooks. Everything else is here, written once, as
httpcore keeps one implementation of a connection and derives its twin:

* the counter effects (``next_candidate``, ``next_part``, ``shrink_request``, ``ask_again``,
  ``use_fallback``) and the pure ``check_summary`` (the gate, D32), via :meth:`effects`;
* the translation of each effect's :class:`~orchestrator._runtime.driver.Report` into the next
  event and the facts its guards read (:meth:`OperationDriver.translate`);
* what an answer leaves behind for the commit (texts, models, provenance: :meth:`accept`);
* the journal data of a step (:meth:`journal_data`), the deadline's failure, and the ending
  (:meth:`ending`): which failure the caller hears, and the ``session_compact_failed`` payload.

So the two hosts cannot drift: after a transient error a retry cured, a commit conflict is
reported as the conflict on either host, because there is one place that says so.

Exceptions to the table (decisions made in Python, not by a row, and why; h11's ``_state.py``
keeps its exceptions the same way). Issue 34 listed these for the operation machine:

* **Which failure is reported.** An operation that ended ``failed`` reports the last model
  failure when there was one, else the commit's; a ``conflict`` always reports the commit's
  (the store's reason). This words an outcome the table chose; it chooses nothing.
* **The candidate list per reason (D21)** is given to the operation, not chosen by it: the
  one-process runner and the worker hand a manual compaction and a branch summary the current
  model's route only (:func:`~orchestrator._runtime.operation.runner.routes_for`), an automatic one
  every candidate; the table then walks whatever list it has (``more_candidates``). A row
  cannot make this choice today because the Python API's :func:`~orchestrator.compact` runs as
  ``manual`` with the caller's own candidate list, which it walks.
* **Speculative model calls.** A split turn's prefix request does not read the history
  summary, so the one-process host starts its first attempt alongside the history's
  (:meth:`~orchestrator._runtime.operation.ask_effects.AskEffects._start_early`). No row asked
  for it: the table still decides, in order, what that answer means once its ``call_model`` row
  is taken, and an answer no row reaches is cancelled and dropped. It is a latency optimisation
  with no visible effect on the journal; the cluster host does not make it.
* **``session_compact`` and ``session_compact_failed``.** The table decides how the operation
  ends and names ``emit_result`` on every final row; which of pi's events that is follows from the
  final state alone (:func:`~orchestrator._runtime.operation.compact_hooks.compact_failed`, pi's own
  wording), and only for a compaction that is not a dry run: a branch summary and a prune have no
  such events in pi, and an automatic compaction with nothing to do emits none, as in pi.
* **The "no room" refusal.** A summary request that cannot fit the summarizer's window is
  refused when the request is built (``Summarization refused: ...``), before any model is paid:
  it reaches the table as the attempt's ``fatal`` failure, and the ``attempt_failed`` rows
  decide (next candidate, else failed). The branch navigation's own "no room" check lives in
  the navigation machine's driver.
* **A manual result rewritten to ``cancelled``** is the turn machine's (its
  ``report_manual_result`` effect), not this machine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.errors import ConflictError, model_error
from orchestrator._core.gate import GateSpec
from orchestrator._lifecycle.guards import NO_OPERATION_FACTS, OperationFacts
from orchestrator._lifecycle.machine import Step
from orchestrator._lifecycle.names import OperationEvent, OperationState, ReportOutcome
from orchestrator._runtime.driver import Effect, Report
from orchestrator._runtime.operation.compact_hooks import compact_failed
from orchestrator._runtime.operation.retry import NO_MODEL, AttemptRecord, Outcome, RetryPolicy
from orchestrator._runtime.outcomes import (
    COMMIT_EVENTS,
    HOOK_EVENTS,
    Attempt,
    Attempts,
    call_event,
    check_event,
    check_report,
    past_deadline,
    step_data,
)

AWAITING = frozenset({"run_hooks", "call_model", "sleep_retry"})
"""Effects that await something slow: run in flight, so an interrupt can be stepped meanwhile."""
HOST_EFFECTS = frozenset(
    {
        "run_hooks",
        "call_model",
        "sleep_retry",
        "stop_work",
        "append_entry",
        "rewrite_entries",
        "rebuild_context",
        "emit_result",
        "drop_hook_result",
    }
)
"""The effects each host performs itself (the I/O); the driver performs the rest."""
STATUS: Mapping[str, str] = {
    OperationState.COMMITTED: "completed",
    OperationState.SKIPPED: "skipped",  # nothing was done: a client must not read it as success
    OperationState.FAILED: "failed",
    OperationState.CANCELLED: "cancelled",
    OperationState.CONFLICT: "failed",
}
"""A final state as the ``compaction_update`` event words it."""
_ATTEMPT_EVENTS = frozenset(
    {
        OperationEvent.SUMMARY_READY,
        OperationEvent.ATTEMPT_FAILED,
        OperationEvent.SUMMARY_OVERFLOW,
        OperationEvent.SUMMARY_PASSED,
        OperationEvent.SUMMARY_REFUSED,
    }
)


def commit_failure(error: BaseException) -> Report:
    """The commit's report when the store refused it: a conflict (D27) or a failure."""
    if isinstance(error, ConflictError):
        return Report(outcome=ReportOutcome.CONFLICT, error=f"{error}; nothing was applied")
    return Report(outcome=ReportOutcome.FAILED, error=str(error) or type(error).__name__)


@dataclass(frozen=True, slots=True)
class Ending:
    """How an operation ended, host-agnostic: each host builds its own record from it.

    Attributes:
        status: The final state.
        reason: Why it was skipped or cancelled by a hook.
        error: The failure as one line.
        error_kind: The model failure's kind, when one ended it.
        retry_after: That failure's retry-after hint, in seconds.
        commit_failed: The commit's failure ended it (not a model's).
    """

    status: OperationState
    reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    retry_after: float | None = None
    commit_failed: bool = False

    def fields(self) -> dict[str, Any]:
        """What each host's outcome record says alike: status, reason, error and its kind."""
        return {
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "error_kind": self.error_kind,
        }


@dataclass(slots=True)
class OperationDriver:
    """The host-agnostic memory and decisions of one operation (see the module docstring).

    Args:
        kind: ``compaction``, ``branch_summary`` or ``prune``.
        reason: Why it runs (``manual``, ``threshold``, ``overflow``; a branch's reason).
        policy: The retry policy of the routes (D21).
        gate: The summary gate is on (D32).
        fallback: The offline summarizer is the last candidate (D32).
        routes: How many candidate models each summary request has (set again once the hooks
            made the requests).
    """

    kind: str
    reason: str
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    gate: bool = False
    fallback: bool = False
    routes: list[int] = field(default_factory=list)
    at: Attempts = field(default_factory=Attempts)
    failure: Report | None = None
    delay_ms: int = 0
    texts: dict[str, str] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    answer: Attempt = field(
        default_factory=lambda: Attempt(Report(outcome=ReportOutcome.CANCELLED))
    )
    refused: list[tuple[int, str]] = field(default_factory=list)  # (request, failed check)
    skipped: str | None = None  # why skipped, or cancelled by a hook
    commit_error: str | None = None

    def effects(self, host: Mapping[str, Effect]) -> dict[str, Effect]:
        """The whole effect table: the host's I/O effects and the driver's own."""
        missing = HOST_EFFECTS - set(host)
        if missing:
            raise TypeError(f"the host performs no {', '.join(sorted(missing))}")
        return {
            **host,
            "next_candidate": self.at.next_candidate,
            "next_part": self.at.next_part,
            "shrink_request": self.at.shrink_request,
            "ask_again": self.at.ask_again,
            "use_fallback": self.at.use_fallback,
            "check_summary": self.check_summary,
            "check_hook_summary": self.check_summary,
        }

    # -- what the effects leave ----------------------------------------------------------------

    def no_model(self) -> Report | None:
        """``call_model``'s report when the request has no candidate left to ask, else None."""
        if self.at.offline or self.at.candidate < self.routes[self.at.part]:
            return None
        return Report(outcome=ReportOutcome.FATAL, error=NO_MODEL)

    def hook_supplied(self, text: str, gate: GateSpec) -> None:
        """Keep the summary a hook supplied: the gate may judge it next (D32)."""
        self.answer = Attempt(Report(outcome=ReportOutcome.SUPPLIED), text, gate)

    def accept(self, attempt: Attempt, purpose: str) -> Report:
        """Keep ``call_model``'s attempt (the gate judges it next); returns its report."""
        self.answer = attempt
        report = attempt.report
        if report.outcome == "ok":
            self.texts[purpose] = attempt.text
            self.models[purpose] = str(report.data.get("model", ""))
            self.written[purpose] = {
                **report.data,
                # Refusals of this request by any candidate: did the gate pass it first time?
                "refusals": sum(1 for index, _ in self.refused if index == self.at.part),
                "gate": self.gate,
            }
        return report

    async def check_summary(self) -> Report:
        """The ``check_summary`` effect: the gate's verdict on the last answer (pure, D32)."""
        return check_report(self.answer.text, self.answer.gate)

    def retry_wait_s(self) -> float:
        """``sleep_retry``: one retry more on this candidate; how long to wait first."""
        self.at.retries += 1
        return self.delay_ms / 1000

    def committed(self, report: Report) -> Report:
        """Keep the commit's failure, if it failed; returns ``report``."""
        if report.outcome != "ok":
            self.commit_error = report.error
        return report

    def deadline_passed(self, seconds: float) -> None:
        """Record the deadline's failure, with the last attempt's own (D22)."""
        what = f"{self.kind.replace('_', ' ')} did not finish within {seconds:g} s"
        self.failure = Report(
            outcome=ReportOutcome.TIMEOUT, error=past_deadline(what, self.failure)
        )

    # -- outcomes into events -------------------------------------------------------------------

    def translate(self, effect: str, report: Report) -> tuple[str, OperationFacts, dict[str, Any]]:
        """The event ``effect``'s report fires, the facts its guards read, and its data."""
        data = step_data(report)
        if effect == "run_hooks":
            if report.outcome == "cancelled":
                self.skipped = str(report.data.get("reason"))
            # Only the hook_supplied rows read the gate: the other journal lines stay as before.
            gate = self.gate and report.outcome == "supplied"
            facts = OperationFacts(needs_model=bool(self.routes), gate_enabled=gate)
            return HOOK_EVENTS[report.outcome], facts, data
        if effect == "check_hook_summary":
            return *self._after_hook_check(report), data
        if effect == "call_model":
            if report.outcome != "ok":
                self.failure = report
            event, facts, self.delay_ms = call_event(
                report,
                self.at,
                parts=len(self.routes),
                candidates=self.routes[self.at.part],
                policy=self.policy,
                gate=self.gate,
            )
            return event, facts, data
        if effect == "check_summary":
            if report.outcome != "passed":
                self.failure = report
                self.refused.append((self.at.part, str(report.data.get("check", ""))))
            event, facts = check_event(
                report,
                self.at,
                parts=len(self.routes),
                candidates=self.routes[self.at.part],
                fallback=self.fallback,
            )
            return event, facts, data
        if effect == "sleep_retry":
            return OperationEvent.WAIT_DONE, NO_OPERATION_FACTS, data
        return COMMIT_EVENTS[report.outcome], NO_OPERATION_FACTS, data

    def _after_hook_check(self, report: Report) -> tuple[OperationEvent, OperationFacts]:
        # The hook's summary judged (D32): a refusal is the operation's failure, should no
        # model be there to write one instead; the table decides which.
        if report.outcome == "passed":
            return OperationEvent.SUMMARY_PASSED, NO_OPERATION_FACTS
        check = str(report.data.get("check", ""))
        self.refused.append((self.at.part, check))
        error = f"the summary a hook supplied was refused ({check}): {report.error}"
        self.failure = Report(outcome=ReportOutcome.REFUSED, error=error, data=dict(report.data))
        can_ask = bool(self.routes) and self.routes[0] > 0
        return OperationEvent.SUMMARY_REFUSED, OperationFacts(
            refused_check=check, needs_model=can_ask
        )

    def journal_data(self, source: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """What a step's journal line keeps of its data (the first names the reason)."""
        kept = {k: v for k, v in data.items() if v is not None}
        if source == OperationState.PREPARING:
            kept.setdefault("reason", self.reason)
        return kept

    # -- the ending -----------------------------------------------------------------------------

    def ending(self, state: str) -> Ending:
        """How the operation ended in ``state``: which failure the caller hears.

        A model failure only when the operation *failed*: a conflict is the commit's (the
        store's reason), and a model failure retried away before it must not be reported
        instead (issue 34's drift).
        """
        status = OperationState(state)
        failure = self.failure if status == OperationState.FAILED else None
        if failure is not None:
            return Ending(
                status=status,
                reason=self.skipped,
                error=failure.error or None,
                error_kind=failure.outcome,
                retry_after=failure.retry_after,
            )
        return Ending(
            status=status,
            reason=self.skipped,
            error=self.commit_error or None,
            commit_failed=status == OperationState.FAILED,
        )

    def compact_failed(self, state: str, *, from_extension: bool) -> dict[str, Any] | None:
        """The ``session_compact_failed`` payload for a compaction ended in ``state``."""
        if self.kind != "compaction":
            return None
        return compact_failed(
            reason=self.reason,
            status=state,
            error=self.ending(state).error,
            skipped=self.skipped,
            from_extension=from_extension,
        )

    def attempt_record(self, taken: Step, candidate: str) -> AttemptRecord:
        """What the CLI's progress line and traces hear of an attempt (it :func:`ends_attempt`)."""
        outcome, delay = attempt_outcome(taken, self.delay_ms)
        failure = self.failure if outcome != "ok" else None
        error = None
        if failure is not None:
            error = model_error(
                failure.outcome, failure.error or "", retry_after=failure.retry_after
            )
        check = None
        if failure is not None and failure.outcome == "refused":
            check = str(failure.data.get("check"))
        return AttemptRecord(
            candidate=candidate,
            candidate_index=self.at.candidate,
            attempt=self.at.retries + self.at.refusals + 1,
            outcome=outcome,
            delay_ms=delay,
            error=error,
            check=check,
        )


def ends_attempt(taken: Step) -> bool:
    """Whether the step ends a model attempt; an answer is reported once the gate judged it."""
    judged_hook = taken.source == OperationState.CHECKING_HOOK
    return (
        taken.event in _ATTEMPT_EVENTS and taken.dest != OperationState.CHECKING and not judged_hook
    )


def attempt_outcome(taken: Step, delay_ms: int) -> tuple[Outcome, int]:
    """What followed an attempt, read from the row the table took."""
    if taken.event in (OperationEvent.SUMMARY_READY, OperationEvent.SUMMARY_PASSED):
        return "ok", 0
    if "sleep_retry" in taken.effects:
        return "retry", delay_ms
    if "ask_again" in taken.effects:
        return "retry", 0
    if "next_candidate" in taken.effects or "use_fallback" in taken.effects:
        return "next_candidate", 0
    return "failed", 0


def part_routes(parts: Sequence[Any]) -> list[int]:
    """How many candidate models each summary request has."""
    return [len(part.routes) for part in parts]
