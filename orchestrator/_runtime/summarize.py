"""Execution: turn a plan into a compaction or branch summary through model routes.

Theory of operation. Planning (:mod:`orchestrator._core.compaction_plan`,
:mod:`orchestrator._core.branch_plan`) decided *what* to summarize; this module only asks models and
assembles text. It never touches the session: it returns a result record, and the caller commits it
as one appended entry (D24). So a failure or a cancellation applies nothing (D22): there is nothing
partial to undo.

Each call goes through :func:`~orchestrator._runtime.retry.call_with_candidates` (ordered
candidates, retries, D21) and every reply is checked (empty, truncated or error summaries are
failures, D15). If the summarizer reports an overflow although the request was budgeted (the
estimate is only an estimate), the prompt allowance is halved and the call made again, at most three
times (D14). A split turn's two summaries run concurrently in one anyio task group, so a split
compaction costs about one model latency, not two.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.entries import Message
from orchestrator._core.errors import ModelError
from orchestrator._core.model import Model, ModelRequest, Purpose
from orchestrator._core.summary_request import (
    MAX_HALVINGS,
    PromptBudget,
    branch_request,
    branch_summary_text,
    history_request,
    merge_split_turn,
    short_summary_request,
    turn_prefix_request,
    upsert_file_tags,
)
from orchestrator._runtime.retry import AttemptRecord, RetryPolicy, call_with_candidates
from orchestrator._store.session import compaction_fields

NO_PRIOR_HISTORY = "No prior history."
NO_BRANCH_CONTENT = "No content to summarize"


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryRoutes:
    """The routes and settings summaries use.

    Attributes:
        candidates: Models to try in order (the current model first, D21).
        reserve_tokens: The compaction reserve; output budgets derive from it (pi's rule).
        retry: Retry policy per candidate.
        remote: The remote summary endpoint; when set, history and short summaries go there
            (the turn prefix always uses the candidates, as in OMP).
        short_summary: Also produce a one-or-two sentence ``shortSummary`` (OMP), for
            compactions and branch summaries alike.
        reasoning: Reasoning effort for history and turn-prefix summaries, where supported.
        sleep: Awaited between retries (inject a fake clock's sleep in tests).
        on_attempt: Called for every model attempt with the request's purpose (traces,
            the operation machine, the CLI's progress line).
    """

    candidates: tuple[Model, ...]
    reserve_tokens: int = 16384
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    remote: Model | None = None
    short_summary: bool = False
    reasoning: str | None = "high"
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    on_attempt: Callable[[AttemptRecord, Purpose], None] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionResult:
    """A compaction ready to commit (pi ``CompactionResult``).

    Attributes:
        summary: The text stored in the entry (with file lists, D16).
        first_kept_entry_id: Where the kept region starts.
        tokens_before: Context tokens before compacting.
        details: ``{"readFiles": [...], "modifiedFiles": [...]}``, full lists.
        short_summary: The short summary, when asked for.
        preserve_data: Hook data carried on the entry (OMP ``preserveData``).
        from_extension: A hook supplied this compaction.
        model: The route that wrote the summary.
    """

    summary: str
    first_kept_entry_id: str
    tokens_before: int
    details: dict[str, Any]
    short_summary: str | None = None
    preserve_data: dict[str, Any] | None = None
    from_extension: bool = False
    model: str = ""

    def entry_fields(self) -> dict[str, Any]:
        """The fields of the compaction entry that commits this result."""
        return compaction_fields(
            summary=self.summary,
            first_kept_entry_id=self.first_kept_entry_id,
            tokens_before=self.tokens_before,
            details=self.details,
            from_extension=self.from_extension,
            short_summary=self.short_summary,
            preserve_data=self.preserve_data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchSummaryResult:
    """A branch summary ready to attach (pi ``generateBranchSummary`` result).

    Attributes:
        summary: Preamble, the model's text and file lists (D16).
        details: ``{"readFiles": [...], "modifiedFiles": [...]}``.
        model: The route that wrote it ("" when no model was called).
        short_summary: The short summary, when asked for.
    """

    summary: str
    details: dict[str, Any]
    model: str = ""
    short_summary: str | None = None


async def _summarize(
    purpose: Purpose,
    routes: Sequence[Model],
    build: Callable[[PromptBudget], ModelRequest],
    summarizer: SummaryRoutes,
) -> tuple[str, str]:
    # D14: halve the prompt allowance after a reported overflow, at most MAX_HALVINGS times.
    halvings = 0
    report = summarizer.on_attempt

    def on_attempt(record: AttemptRecord) -> None:
        if report is not None:
            report(record, purpose)

    while True:

        def request_for(model: Model, halvings: int = halvings) -> ModelRequest:
            budget = PromptBudget(context_window=model.context_window)
            for _ in range(halvings):
                budget = budget.halve()
            return build(budget)

        try:
            response, model = await call_with_candidates(
                routes,
                request_for,
                policy=summarizer.retry,
                sleep=summarizer.sleep,
                on_attempt=on_attempt,
            )
        except ModelError as error:
            if error.kind != "overflow" or halvings >= MAX_HALVINGS:
                raise
            halvings += 1
            continue
        return response.text.strip(), model.name


def _one_model_error(failures: BaseExceptionGroup[BaseException]) -> BaseException:
    # Both halves of a split turn may fail at once; the caller expects one ModelError, not a
    # group. Anything else in the group (a bug, a cancellation) is re-raised as it is.
    errors, rest = failures.split(ModelError)
    if rest is not None or errors is None:
        return failures
    first = errors.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def _history_routes(summarizer: SummaryRoutes) -> tuple[Model, ...]:
    return (summarizer.remote,) if summarizer.remote is not None else summarizer.candidates


async def compact(
    plan: CompactionPlan,
    summarizer: SummaryRoutes,
    *,
    focus: str | None = None,
    additional_context: Sequence[str] = (),
    prompt_override: str | None = None,
    preserve_data: dict[str, Any] | None = None,
    kept_messages: Sequence[Message] = (),
) -> CompactionResult:
    """Summarize a compaction plan.

    Args:
        plan: From :func:`~orchestrator._core.compaction_plan.plan_compaction`.
        summarizer: Routes and settings.
        focus: The user's instructions ("Additional focus").
        additional_context: Lines a ``session.compacting`` hook added.
        prompt_override: A hook's prompt replacing the default one.
        preserve_data: Hook data to carry (merged over the previous compaction's).
        kept_messages: The messages the compaction keeps (for the short summary).

    Returns:
        The result to commit.

    Raises:
        ModelError: every route failed (the session is unchanged).
    """
    reserve = summarizer.reserve_tokens
    history_routes = _history_routes(summarizer)

    async def history() -> tuple[str, str]:
        if not plan.messages_to_summarize:
            # D11: a split turn with nothing older keeps the previous summary.
            return plan.previous_summary or NO_PRIOR_HISTORY, ""
        return await _summarize(
            "history",
            history_routes,
            lambda budget: history_request(
                plan.messages_to_summarize,
                reserve_tokens=reserve,
                previous_summary=plan.previous_summary,
                additional_context=additional_context,
                prompt_override=prompt_override,
                focus=focus,
                budget=budget,
                reasoning=summarizer.reasoning,
            ),
            summarizer,
        )

    async def turn_prefix() -> tuple[str, str]:
        return await _summarize(
            "turn_prefix",
            summarizer.candidates,
            lambda budget: turn_prefix_request(
                plan.turn_prefix_messages, reserve_tokens=reserve, budget=budget
            ),
            summarizer,
        )

    if plan.is_split_turn and plan.turn_prefix_messages:
        results: dict[str, tuple[str, str]] = {}

        async def run(key: str, job: Callable[[], Awaitable[tuple[str, str]]]) -> None:
            results[key] = await job()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(run, "history", history)
                group.start_soon(run, "prefix", turn_prefix)
        except BaseExceptionGroup as failures:
            raise _one_model_error(failures) from None
        text = merge_split_turn(results["history"][0], results["prefix"][0])
        model = results["history"][1] or results["prefix"][1]
    else:
        text, model = await history()

    short = None
    if summarizer.short_summary:
        short, _ = await _summarize(
            "short",
            history_routes,
            lambda budget: short_summary_request(
                kept_messages,
                summary=text,
                reserve_tokens=reserve,
                additional_context=additional_context,
                budget=budget,
            ),
            summarizer,
        )
    inherited = {
        k: v
        for k, v in (plan.previous_preserve_data or {}).items()
        if k != "openaiRemoteCompaction"
    }
    merged = {**inherited, **(preserve_data or {})}
    return CompactionResult(
        summary=upsert_file_tags(text, plan.read_files, plan.modified_files),
        first_kept_entry_id=plan.first_kept_entry_id,
        tokens_before=plan.tokens_before,
        details={"readFiles": list(plan.read_files), "modifiedFiles": list(plan.modified_files)},
        short_summary=short,
        preserve_data=merged or None,
        model=model,
    )


async def summarize_branch(
    plan: BranchPlan,
    summarizer: SummaryRoutes,
    *,
    instructions: str | None = None,
    replace_instructions: bool = False,
) -> BranchSummaryResult:
    """Summarize an abandoned branch (pi's generateBranchSummary, D16, D17).

    With no messages to summarize no model is called and the summary is
    ``No content to summarize``.

    Raises:
        ModelError: every route failed (the session is unchanged).
    """
    details = {"readFiles": list(plan.read_files), "modifiedFiles": list(plan.modified_files)}
    if not plan.messages:
        return BranchSummaryResult(summary=NO_BRANCH_CONTENT, details=details)
    text, model = await _summarize(
        "branch",
        summarizer.candidates,
        lambda budget: branch_request(
            plan.messages, instructions=instructions, replace=replace_instructions, budget=budget
        ),
        summarizer,
    )
    short = None
    if summarizer.short_summary:
        short, _ = await _summarize(
            "short",
            summarizer.candidates,
            lambda budget: short_summary_request(
                plan.messages, summary=text, reserve_tokens=summarizer.reserve_tokens, budget=budget
            ),
            summarizer,
        )
    return BranchSummaryResult(
        summary=branch_summary_text(text, plan.read_files, plan.modified_files),
        details=details,
        model=model,
        short_summary=short,
    )
