"""Whole operations on a session: compact it, or navigate it with an optional branch summary.

Each operation is plan → summarize → commit, and the commit is one appended entry (D24), made
only after the model answered and the answer passed its checks. A failure or a cancellation
before that point leaves the session exactly as it was (D15, D22). The lifecycle runtime wraps
these same steps in its operation machine; the command line and the RPC server call them
through the runtime or directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._branch_plan import collect_branch_entries, prepare_branch_entries
from ._compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from ._entries import Entry, entry_message
from ._navigation import NavigationTarget, apply_navigation, navigation_target
from ._session import Session
from ._summarize import BranchSummaryResult, CompactionResult, Summarizer, compact, summarize_branch
from ._summary_request import FALLBACK_CONTEXT_WINDOW
from ._tokens import CompactionSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactOutcome:
    """What a compaction request did.

    Attributes:
        reason: Why nothing was done (D12), else ``None``.
        plan: The plan, when there was one.
        result: The summary result, when the model answered.
        entry: The committed compaction entry (``None`` on a dry run or when nothing was done).
        tokens_before: Context tokens before.
        tokens_after: Estimated context tokens after (``None`` when nothing was done).
    """

    reason: str | None
    plan: CompactionPlan | None = None
    result: CompactionResult | None = None
    entry: Entry | None = None
    tokens_before: int = 0
    tokens_after: int | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON form for the command line and RPC."""
        return {
            "compacted": self.entry is not None,
            "reason": self.reason,
            "entryId": self.entry["id"] if self.entry else None,
            "summary": self.result.summary if self.result else None,
            "firstKeptEntryId": self.result.first_kept_entry_id if self.result else None,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
            "model": self.result.model if self.result else None,
        }


def kept_messages(session: Session, plan: CompactionPlan) -> list[dict[str, Any]]:
    """The messages a compaction keeps (for the short summary)."""
    out = []
    for entry_id in plan.kept_entry_ids:
        message = entry_message(session.tree.get(entry_id))
        if message is not None:
            out.append(message)
    return out


def tokens_after(plan: CompactionPlan, result: CompactionResult, session: Session) -> int:
    """Estimated context tokens once ``result`` is committed (no usage exists yet for it)."""
    from ._tokens import estimate_tokens

    total = estimate_tokens({"role": "compactionSummary", "summary": result.summary})
    for message in kept_messages(session, plan):
        total += estimate_tokens(message)
    return total


async def compact_session(
    session: Session,
    summarizer: Summarizer,
    *,
    settings: CompactionSettings | None = None,
    focus: str | None = None,
    dry_run: bool = False,
) -> CompactOutcome:
    """Plan, summarize and (unless ``dry_run``) commit a compaction of the active branch.

    Returns:
        The outcome; ``reason`` is set when there was nothing to compact (no model call, D12).

    Raises:
        ModelError: every summarizer route failed; the session is unchanged.
    """
    path = session.path()
    plan = plan_compaction(path, settings or CompactionSettings())
    tokens_before = session.context().tokens().tokens
    if isinstance(plan, NothingToCompact):
        return CompactOutcome(reason=plan.reason, tokens_before=tokens_before)
    result = await compact(
        plan, summarizer, focus=focus, kept_messages=kept_messages(session, plan)
    )
    entry = None
    if not dry_run:
        entry = commit_compaction(session, result)
    return CompactOutcome(
        reason=None,
        plan=plan,
        result=result,
        entry=entry,
        tokens_before=plan.tokens_before,
        tokens_after=tokens_after(plan, result, session),
    )


def commit_compaction(session: Session, result: CompactionResult) -> Entry:
    """Append the compaction entry: the operation's single commit point (D24)."""
    entry = session.append_compaction(
        summary=result.summary,
        first_kept_entry_id=result.first_kept_entry_id,
        tokens_before=result.tokens_before,
        details=result.details,
        from_extension=result.from_extension,
        short_summary=result.short_summary,
        preserve_data=result.preserve_data,
    )
    session.flush()
    return entry


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigateOutcome:
    """What a navigation did.

    Attributes:
        target: The decision (new leaf, editor text).
        old_leaf_id: The leaf before.
        summary_entry: The branch summary attached, if any.
        result: The branch summary result, if one was made.
        no_op: The target was already the leaf.
    """

    target: NavigationTarget
    old_leaf_id: str | None
    summary_entry: Entry | None = None
    result: BranchSummaryResult | None = None
    no_op: bool = False

    def as_json(self) -> dict[str, Any]:
        """A JSON form for the command line and RPC."""
        return {
            "oldLeafId": self.old_leaf_id,
            "newLeafId": self.target.new_leaf_id,
            "targetId": self.target.target_id,
            "editorText": self.target.editor_text,
            "summaryEntryId": self.summary_entry["id"] if self.summary_entry else None,
            "summary": self.summary_entry.get("summary") if self.summary_entry else None,
            "cancelled": False,
            "noOp": self.no_op,
        }


def branch_budget(summarizer: Summarizer, reserve_tokens: int) -> int:
    """The branch summary's token budget: the summarizer's window minus the reserve (§7.3)."""
    window = summarizer.candidates[0].context_window if summarizer.candidates else 0
    return max(1, (window or FALLBACK_CONTEXT_WINDOW) - reserve_tokens)


async def navigate_session(
    session: Session,
    target_id: str,
    *,
    summarize: bool = False,
    summarizer: Summarizer | None = None,
    instructions: str | None = None,
    replace_instructions: bool = False,
    reserve_tokens: int = 16384,
) -> NavigateOutcome:
    """Navigate to ``target_id``, summarizing the abandoned branch when asked.

    Raises:
        SessionError: unknown target.
        ModelError: the summary failed; leaf and history are unchanged.
    """
    old_leaf = session.leaf_id
    target = navigation_target(session.tree, target_id)
    if target_id == old_leaf:
        return NavigateOutcome(target=target, old_leaf_id=old_leaf, no_op=True)
    result = None
    if summarize and summarizer is not None:
        entries, ancestor = collect_branch_entries(session.tree, old_leaf, target_id)
        if entries:
            plan = prepare_branch_entries(
                entries,
                branch_budget(summarizer, reserve_tokens),
                old_leaf_id=old_leaf,
                target_id=target_id,
                common_ancestor_id=ancestor,
            )
            result = await summarize_branch(
                plan,
                summarizer,
                instructions=instructions,
                replace_instructions=replace_instructions,
            )
    entry = apply_navigation(
        session,
        target,
        old_leaf_id=old_leaf,
        summary=result.summary if result else None,
        details=result.details if result else None,
    )
    return NavigateOutcome(target=target, old_leaf_id=old_leaf, summary_entry=entry, result=result)
