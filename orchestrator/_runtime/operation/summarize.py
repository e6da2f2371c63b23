"""Summary requests and results: what an operation asks models for, and what it commits.

Theory of operation. Planning (``_core.compaction_plan``, ``_core.branch_plan``) decided *what*
to summarize; this module turns a plan into the operation's summary requests (:class:`Part`:
the history, a split turn's prefix, the optional short summary, or the branch) and assembles the
texts the models returned into the record the commit appends. It calls no model and touches no
session: the operation machine (``machines/operation.toml``) decides which candidate answers
each part, when to retry, when to halve a request (D14) and when to give up (D21).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.entries import Message
from orchestrator._core.gate import layout_headings, prompt_hash, text_hash
from orchestrator._core.model import Model, ModelRequest, Purpose
from orchestrator._core.summary_request import (
    PromptBudget,
    branch_request,
    branch_summary_text,
    history_request,
    merge_split_turn,
    short_summary_request,
    turn_prefix_request,
    upsert_file_tags,
)
from orchestrator._core.tokens import is_token_count
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._runtime.operation.retry import AttemptRecord, RetryPolicy
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
        gate: Check every summary before it is committed (D32), on by default here as in
            every route the settings build. ``gate=False`` is the explicit opt-out: the table
            then commits any summary that is not empty and not truncated (D15). Scripted
            models answer with :func:`orchestrator.testing.summary_text` to pass it.
        fallback: The last candidate after the gate refused every other one (D32): the offline
            summarizer, or ``None`` (``--no-offline-fallback``): then the operation fails.
    """

    candidates: tuple[Model, ...]
    reserve_tokens: int = 16384
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    remote: Model | None = None
    short_summary: bool = False
    reasoning: str | None = "high"
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    on_attempt: Callable[[AttemptRecord, Purpose], None] | None = None
    gate: bool = True
    fallback: Model | None = field(default_factory=OfflineSummarizer)


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
        usage: What the summary calls cost, summed (pi's usage object), when a model was called.
    """

    summary: str
    first_kept_entry_id: str
    tokens_before: int
    details: dict[str, Any]
    short_summary: str | None = None
    preserve_data: dict[str, Any] | None = None
    from_extension: bool = False
    model: str = ""
    usage: dict[str, Any] | None = None

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
            usage=self.usage,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchSummaryResult:
    """A branch summary ready to attach (pi ``generateBranchSummary`` result).

    Attributes:
        summary: Preamble, the model's text and file lists (D16).
        details: ``{"readFiles": [...], "modifiedFiles": [...]}``.
        model: The route that wrote it ("" when no model was called).
        short_summary: The short summary, when asked for.
        usage: What the summary calls cost, summed (pi's usage object), when a model was called.
    """

    summary: str
    details: dict[str, Any]
    model: str = ""
    short_summary: str | None = None
    usage: dict[str, Any] | None = None


Build = Callable[[PromptBudget, Mapping[str, str]], ModelRequest]


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One summary request of an operation.

    Attributes:
        purpose: ``history``, ``turn_prefix``, ``short`` or ``branch``.
        routes: The candidate models for it, best first.
        build: Builds the request for a prompt budget and the texts of the earlier parts.
        independent: The request does not read an earlier part's text, so its first attempt
            may start while an earlier part is still being asked (a split turn's prefix).
        headings: The sections its prompt asks for (the gate requires them, D32).
        focus: The focus the summary must name (a compaction's ``--focus``, D32).
        read_files: The read-files list appended to its text (the gate checks it, D16).
        modified_files: The modified-files list appended to its text.
        prompt_hash: A hash of the prompts it is built from (provenance).
    """

    purpose: Purpose
    routes: tuple[Model, ...]
    build: Build
    independent: bool = True
    headings: tuple[str, ...] = ()
    focus: str | None = None
    read_files: tuple[str, ...] = ()
    modified_files: tuple[str, ...] = ()
    prompt_hash: str = ""


def request_for(
    part: Part, model: Model, halvings: int, texts: Mapping[str, str], feedback: str = ""
) -> ModelRequest:
    """The request ``part`` sends to ``model`` after ``halvings`` halvings (D14).

    ``feedback`` (what the gate refused in this candidate's last answer, D32) is added to the
    instructions as one more line.
    """
    budget = PromptBudget(
        context_window=model.context_window, output_limit=getattr(model, "output_limit", 0)
    )
    for _ in range(halvings):
        budget = budget.halve()
    request = part.build(budget, texts)
    if not feedback:
        return request
    *earlier, last = request.messages
    told = {**last, "content": f"{last['content']}\n\n{feedback}"}
    return dataclasses.replace(request, messages=(*earlier, told))


def _prompts(names: Sequence[str], override: str | None = None) -> str:
    # Which prompts wrote a summary: the shipped files' hash, or the replacing text's.
    if override:
        return text_hash(prompt_hash("summarizer_system") + override)
    return prompt_hash("summarizer_system", *names)


def _history_routes(summarizer: SummaryRoutes) -> tuple[Model, ...]:
    return (summarizer.remote,) if summarizer.remote is not None else summarizer.candidates


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionInputs:
    """What shapes a compaction's requests besides the plan.

    Attributes:
        focus: The user's instructions ("Additional focus").
        additional_context: Lines a ``session.compacting`` hook added.
        prompt_override: A hook's prompt replacing the default one.
        preserve_data: Hook data to carry (merged over the previous compaction's).
        kept_messages: The messages the compaction keeps (for the short summary).
    """

    focus: str | None = None
    additional_context: tuple[str, ...] = ()
    prompt_override: str | None = None
    preserve_data: dict[str, Any] | None = None
    kept_messages: Sequence[Message] = ()


def compaction_parts(
    plan: CompactionPlan, summarizer: SummaryRoutes, inputs: CompactionInputs
) -> tuple[Part, ...]:
    """The summary requests a compaction makes, in order.

    The history summary (unless a split turn has nothing older, D11), the turn prefix of a split
    turn, and the short summary when asked for (it reads the history text).
    """
    reserve = summarizer.reserve_tokens
    parts: list[Part] = []
    if plan.messages_to_summarize:
        prompt = "compaction_update" if plan.previous_summary else "compaction_summary"
        parts.append(
            Part(
                purpose="history",
                routes=_history_routes(summarizer),
                headings=() if inputs.prompt_override else layout_headings(prompt),
                focus=inputs.focus,
                read_files=tuple(plan.read_files),
                modified_files=tuple(plan.modified_files),
                prompt_hash=_prompts([prompt], inputs.prompt_override),
                build=lambda budget, _texts: history_request(
                    plan.messages_to_summarize,
                    reserve_tokens=reserve,
                    previous_summary=plan.previous_summary,
                    additional_context=inputs.additional_context,
                    prompt_override=inputs.prompt_override,
                    focus=inputs.focus,
                    budget=budget,
                    reasoning=summarizer.reasoning,
                ),
            )
        )
    if plan.is_split_turn and plan.turn_prefix_messages:
        parts.append(
            Part(
                purpose="turn_prefix",
                routes=summarizer.candidates,
                headings=layout_headings("turn_prefix"),
                prompt_hash=_prompts(["turn_prefix"]),
                build=lambda budget, _texts: turn_prefix_request(
                    plan.turn_prefix_messages, reserve_tokens=reserve, budget=budget
                ),
            )
        )
    if summarizer.short_summary:
        parts.append(
            Part(
                purpose="short",
                routes=_history_routes(summarizer),
                independent=False,
                prompt_hash=_prompts(["short_summary"]),
                build=lambda budget, texts: short_summary_request(
                    inputs.kept_messages,
                    summary=compaction_text(plan, texts),
                    reserve_tokens=reserve,
                    additional_context=inputs.additional_context,
                    budget=budget,
                ),
            )
        )
    return tuple(parts)


def compaction_text(plan: CompactionPlan, texts: Mapping[str, str]) -> str:
    """The summary text from the parts' texts (before file tags)."""
    # D11: a split turn with nothing older keeps the previous summary.
    history = texts.get("history") or plan.previous_summary or NO_PRIOR_HISTORY
    if plan.is_split_turn and "turn_prefix" in texts:
        return merge_split_turn(history, texts["turn_prefix"])
    return history


def combined_usage(written: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """The usage of every summary call an entry took, summed (pi's ``combineUsage``).

    ``written``: what each request's attempt reported, its ``usage`` among it. ``None`` when no
    call reported one (a hook's summary).
    """
    usages = [w["usage"] for w in (written or {}).values() if isinstance(w.get("usage"), dict)]
    if not usages:
        return None
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, amount in value.items():
                    if is_token_count(amount):
                        inner[name] = inner.get(name, 0) + amount
            elif is_token_count(value):
                total[key] = total.get(key, 0) + value
    return total or None


def provenance(written: Mapping[str, Mapping[str, Any]], model: str) -> dict[str, Any] | None:
    """Where a summary came from, for its entry's ``details`` (D32), or ``None`` (no model).

    Args:
        written: For each request's purpose, what its attempt reported: ``promptHash``,
            ``inputHash``, ``refusals`` (times the gate refused an answer first) and ``gate``
            (whether the gate checked it).
        model: The route that wrote the summary.

    Returns:
        ``model``, ``promptHash`` (the prompt files used), ``inputHash`` (the serialized input
        summarized) and ``gatePassedFirstTime`` (``None`` with the gate off). With several
        requests (a split turn, a short summary), each hash covers all of them, in order.
    """
    if not written:
        return None

    def joined(key: str) -> str:
        values = [f"{purpose}={part.get(key, '')}" for purpose, part in written.items()]
        return (
            str(next(iter(written.values())).get(key, ""))
            if len(values) == 1
            else (text_hash("\n".join(values)))
        )

    gated = all(part.get("gate", False) for part in written.values())
    return {
        "model": model,
        "promptHash": joined("promptHash"),
        "inputHash": joined("inputHash"),
        "gatePassedFirstTime": (
            all(not part.get("refusals") for part in written.values()) if gated else None
        ),
    }


def compaction_result(
    plan: CompactionPlan,
    texts: Mapping[str, str],
    models: Mapping[str, str],
    inputs: CompactionInputs,
    written: Mapping[str, Mapping[str, Any]] | None = None,
) -> CompactionResult:
    """Assemble the result to commit from the parts' texts and the models that wrote them.

    ``written`` is what each request's attempt reported (see :func:`provenance`).
    """
    inherited = {
        k: v
        for k, v in (plan.previous_preserve_data or {}).items()
        if k != "openaiRemoteCompaction"
    }
    merged = {**inherited, **(inputs.preserve_data or {})}
    model = models.get("history") or models.get("turn_prefix") or ""
    details: dict[str, Any] = {
        "readFiles": list(plan.read_files),
        "modifiedFiles": list(plan.modified_files),
    }
    if (origin := provenance(written or {}, model)) is not None:
        details["provenance"] = origin
    return CompactionResult(
        summary=upsert_file_tags(
            compaction_text(plan, texts), plan.read_files, plan.modified_files
        ),
        first_kept_entry_id=plan.first_kept_entry_id,
        tokens_before=plan.tokens_before,
        details=details,
        short_summary=texts.get("short"),
        preserve_data=merged or None,
        model=model,
        usage=combined_usage(written),
    )


def branch_parts(
    plan: BranchPlan,
    summarizer: SummaryRoutes,
    *,
    instructions: str | None = None,
    replace_instructions: bool = False,
) -> tuple[Part, ...]:
    """The branch summary's request (and its short summary), or none without messages."""
    if not plan.messages:
        return ()
    replaced = replace_instructions and bool(instructions)
    branch = Part(
        purpose="branch",
        routes=summarizer.candidates,
        headings=() if replaced else layout_headings("branch_summary"),
        read_files=tuple(plan.read_files),
        modified_files=tuple(plan.modified_files),
        prompt_hash=_prompts(["branch_summary"], instructions if replaced else None),
        build=lambda budget, _texts: branch_request(
            plan.messages,
            instructions=instructions,
            replace=replace_instructions,
            budget=budget,
        ),
    )
    if not summarizer.short_summary:
        return (branch,)
    short = Part(
        purpose="short",
        routes=summarizer.candidates,
        prompt_hash=_prompts(["short_summary"]),
        build=lambda budget, texts: short_summary_request(
            plan.messages,
            summary=texts["branch"],
            reserve_tokens=summarizer.reserve_tokens,
            budget=budget,
        ),
        independent=False,
    )
    return (branch, short)


def branch_result(
    plan: BranchPlan,
    texts: Mapping[str, str],
    models: Mapping[str, str],
    written: Mapping[str, Mapping[str, Any]] | None = None,
) -> BranchSummaryResult:
    """Assemble the branch summary (``No content to summarize`` when no model was asked).

    ``written`` is what each request's attempt reported (see :func:`provenance`).
    """
    details: dict[str, Any] = {
        "readFiles": list(plan.read_files),
        "modifiedFiles": list(plan.modified_files),
    }
    if "branch" not in texts:
        return BranchSummaryResult(summary=NO_BRANCH_CONTENT, details=details)
    if (origin := provenance(written or {}, models.get("branch", ""))) is not None:
        details["provenance"] = origin
    return BranchSummaryResult(
        summary=branch_summary_text(texts["branch"], plan.read_files, plan.modified_files),
        details=details,
        model=models.get("branch", ""),
        short_summary=texts.get("short"),
        usage=combined_usage(written),
    )
