"""The runtime's operations: compaction, prune and branch summary, each through its machine.

These functions are the effects the turn and navigation machines ask for. Each runs one
:class:`~orchestrator._runtime.operation.Operation` (machine + journal + ``compaction_update``),
calls hooks (D25), summarizes through the summarizer routes, and commits one entry (D24). They
return an :class:`OperationOutcome`; they never raise for a model failure or a cancellation (the
outcome says so), because the calling machine turns the outcome into its next event.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from orchestrator._core.entries import BRANCH_SUMMARY, COMPACTION, Entry
from orchestrator._core.errors import ModelError, OrchestratorError
from orchestrator._core.prune import apply_prune, plan_prune
from orchestrator._lifecycle.guards import Facts
from orchestrator._runtime.compaction import kept_messages
from orchestrator._runtime.operation import Operation
from orchestrator._runtime.summarize import CompactionResult, compact, summarize_branch
from orchestrator._store.session import branch_summary_fields

if TYPE_CHECKING:
    from orchestrator._runtime.session import AgentSession


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationOutcome:
    """How an operation ended.

    Attributes:
        operation_id: The journal's id for it.
        status: ``committed``, ``skipped``, ``cancelled`` or ``failed``.
        reason: Why it was skipped (D12) or cancelled by a hook.
        error: The failure as one line.
        entry: The committed entry (compaction or branch summary).
        result: The compaction result, when there is one.
        plan: The compaction plan, when there is one.
        tokens_saved: Tokens a prune saved in the live context.
        from_extension: A hook supplied the summary.
    """

    operation_id: str
    status: str
    reason: str | None = None
    error: str | None = None
    entry: Entry | None = None
    result: CompactionResult | None = None
    plan: CompactionPlan | None = None
    tokens_saved: int = 0
    from_extension: bool = False


def _outcome(op: Operation, **fields: Any) -> OperationOutcome:
    return OperationOutcome(operation_id=op.id, status=op.state, **fields)


def _compaction_from_hook(value: Any, plan: CompactionPlan) -> CompactionResult | None:
    if not isinstance(value, dict) or not isinstance(value.get("summary"), str):
        return None
    return CompactionResult(
        summary=value["summary"],
        first_kept_entry_id=str(value.get("firstKeptEntryId") or plan.first_kept_entry_id),
        tokens_before=int(value.get("tokensBefore", plan.tokens_before)),
        details=value.get("details") or {},
        short_summary=value.get("shortSummary"),
        preserve_data=value.get("preserveData"),
        from_extension=True,
        model="hook",
    )


async def run_compaction(
    runtime: AgentSession, *, reason: str, focus: str | None = None
) -> OperationOutcome:
    """Compact the active branch through one operation machine, inside its span."""
    op = runtime.new_operation("compaction", reason=reason)
    with runtime.tracer.operation_span("compaction", op.id, reason) as span:
        outcome = await _compaction(runtime, op, reason, focus)
        _describe(span, outcome)
    return outcome


def _describe(span: Any, outcome: OperationOutcome) -> None:
    attrs: dict[str, Any] = {"outcome": outcome.status}
    if outcome.plan is not None:
        attrs["tokens_before"] = outcome.plan.tokens_before
        attrs["summarized"] = len(outcome.plan.summarize_entry_ids)
        attrs["kept"] = len(outcome.plan.kept_entry_ids)
    if outcome.result is not None:
        attrs["model"] = outcome.result.model
    if outcome.tokens_saved:
        attrs["tokens_saved"] = outcome.tokens_saved
    if outcome.error:
        attrs["error"] = outcome.error
    span.set(**attrs)


async def _compaction(
    runtime: AgentSession, op: Operation, reason: str, focus: str | None
) -> OperationOutcome:
    plan: CompactionPlan | None = None
    result: CompactionResult | None = None
    try:
        with op.scope:
            path = runtime.session.path()
            planned = plan_compaction(
                path, runtime.settings.compaction, context=runtime.session.context()
            )
            if isinstance(planned, NothingToCompact):
                op.fire("prepared", Facts(has_work=False), reason=planned.reason)
                return _outcome(op, reason=planned.reason)
            plan = planned
            op.fire(
                "prepared",
                Facts(has_work=True),
                firstKeptEntryId=plan.first_kept_entry_id,
                tokensBefore=plan.tokens_before,
            )
            hook = await runtime.run_hook(
                "session_before_compact",
                {
                    "type": "session_before_compact",
                    "preparation": plan.as_json(),
                    "branchEntries": path,
                    "customInstructions": focus,
                    "reason": reason,
                },
            )
            if hook and hook.get("cancel"):
                op.fire("hooks_cancelled", reason="Compaction cancelled")
                return _outcome(op, reason="Compaction cancelled", plan=plan)
            result = _compaction_from_hook(hook.get("compaction") if hook else None, plan)
            if result is None:
                result = await _summarize_plan(runtime, op, plan, focus, path)
                event = "summary_ready"
            else:
                event = "hook_supplied"
            entry = runtime.session.new_entry(COMPACTION, result.entry_fields())
            _commit(runtime, op, event, entry, lambda: runtime.session.add_entry(entry))
        if op.scope.cancelled_caught:
            op.settle_cancel()
            return _outcome(op, plan=plan)
    except (ModelError, OrchestratorError, OSError) as error:
        op.settle_error(error)
        return _outcome(op, error=op.error_text(), plan=plan)
    finally:
        if not op.runner.done:
            op.settle_cancel()
    assert result is not None
    await runtime.run_hook(
        "session_compact",
        {
            "type": "session_compact",
            "compactionEntry": entry,
            "fromExtension": result.from_extension,
        },
    )
    runtime.events.emit("session_compact", entryId=entry["id"], fromExtension=result.from_extension)
    return _outcome(op, entry=entry, result=result, plan=plan, from_extension=result.from_extension)


async def _summarize_plan(
    runtime: AgentSession,
    op: Operation,
    plan: CompactionPlan,
    focus: str | None,
    path: Sequence[Entry],
) -> CompactionResult:
    extra: dict[str, Any] = {}
    messages = list(plan.messages_to_summarize) + list(plan.turn_prefix_messages)
    shaping = await runtime.run_hook(
        "session.compacting",
        {
            "type": "session.compacting",
            "sessionId": runtime.session.session_id,
            "messages": messages,
        },
    )
    if shaping:
        extra = dict(shaping)
    op.fire("hooks_done")
    summarizer = dataclasses.replace(
        runtime.summarizer,
        # D21: automatic compaction walks the candidate list; a manual one uses the current
        # model's route (the first candidate), with retries.
        candidates=runtime.routes_for(op.reason),
        on_attempt=runtime.attempt_observer(op),
    )
    return await compact(
        plan,
        summarizer,
        focus=focus,
        additional_context=[str(line) for line in extra.get("context") or ()],
        prompt_override=extra.get("prompt"),
        preserve_data=extra.get("preserveData"),
        kept_messages=kept_messages(runtime.session, plan),
    )


def _commit(
    runtime: AgentSession, op: Operation, event: str, entry: Entry, apply: Callable[[], Any]
) -> None:
    # The commit has no await inside: once the id is journaled, the append happens or raises.
    op.fire(event, entryId=entry["id"])
    apply()
    runtime.session.flush()
    op.fire("entry_appended", entryId=entry["id"])


async def run_prune(runtime: AgentSession) -> OperationOutcome:
    """Prune old tool outputs (D23) as one journaled operation; no model is called."""
    op = runtime.new_operation("prune", reason="threshold")
    with runtime.tracer.operation_span("prune", op.id, "threshold") as span:
        outcome = _prune(runtime, op)
        _describe(span, outcome)
    return outcome


def _prune(runtime: AgentSession, op: Operation) -> OperationOutcome:
    try:
        path = runtime.session.path()
        plan = plan_prune(path)
        if not plan.candidates:
            op.fire("prepared", Facts(has_work=False), reason="nothing to prune")
            return _outcome(op)
        op.fire("prepared", Facts(has_work=True), tokensSaved=plan.tokens_saved)
        op.fire("hooks_done")
        pruned = apply_prune(plan, path, runtime.now_ms())
        ids = [e["id"] for e in pruned]
        op.fire("summary_ready", entryIds=ids)
        runtime.session.replace_entries(pruned)
        op.fire("entry_appended", entryIds=ids)
    except (OrchestratorError, OSError) as error:
        op.settle_error(error)
        return _outcome(op, error=op.error_text())
    live = set(runtime.session.context().entry_ids)
    saved = sum(c.savings for c in plan.candidates if c.entry_id in live)
    return _outcome(op, tokens_saved=saved)


async def run_branch_summary(
    runtime: AgentSession,
    plan: BranchPlan,
    *,
    new_leaf_id: str | None,
    old_leaf_id: str | None,
    instructions: str | None,
    replace_instructions: bool,
) -> OperationOutcome:
    """Summarize an abandoned branch and attach the summary at the new position."""
    op = runtime.new_operation("branch_summary", reason="navigation")
    runtime.branch_operation = op
    with runtime.tracer.operation_span("branch_summary", op.id, "navigation") as span:
        outcome = await _branch_summary(
            runtime, op, plan, new_leaf_id, old_leaf_id, instructions, replace_instructions
        )
        _describe(span, outcome)
    return outcome


async def _branch_summary(
    runtime: AgentSession,
    op: Operation,
    plan: BranchPlan,
    new_leaf_id: str | None,
    old_leaf_id: str | None,
    instructions: str | None,
    replace_instructions: bool,
) -> OperationOutcome:
    try:
        with op.scope:
            op.fire("prepared", Facts(has_work=True), oldLeafId=old_leaf_id)
            op.fire("hooks_done")
            summarizer = dataclasses.replace(
                runtime.summarizer,
                candidates=runtime.routes_for(op.reason),
                on_attempt=runtime.attempt_observer(op),
            )
            result = await summarize_branch(
                plan,
                summarizer,
                instructions=instructions,
                replace_instructions=replace_instructions,
            )
            entry = runtime.session.new_entry(
                BRANCH_SUMMARY,
                branch_summary_fields(
                    summary=result.summary,
                    from_id=old_leaf_id,
                    details=result.details,
                    short_summary=result.short_summary,
                ),
                parent_id=new_leaf_id,
            )
            _commit(
                runtime,
                op,
                "summary_ready",
                entry,
                lambda: runtime.session.attach_branch_summary(entry),
            )
        if op.scope.cancelled_caught:
            op.settle_cancel()
            return _outcome(op)
    except (ModelError, OrchestratorError, OSError) as error:
        op.settle_error(error)
        return _outcome(op, error=op.error_text())
    finally:
        runtime.branch_operation = None
        if not op.runner.done:
            op.settle_cancel()
    return _outcome(op, entry=entry)
