"""A compaction as one call, without the lifecycle machines: plan, summarize, commit.

The commit is one appended entry (D24), made only after the model answered and the answer passed
its checks; a failure or a cancellation before that point leaves the session exactly as it was
(D15, D22). The runtime (:class:`~orchestrator.AgentSession`) runs the same steps inside its
journaled operation machine; this direct form serves ``orchestrator compact --dry-run`` (which
writes nothing, not even a journal), benchmarks, and embedders who want no lifecycle at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator._core.compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from orchestrator._core.entries import COMPACTION, Entry, entry_message
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.summarize import CompactionResult, SummaryRoutes, compact
from orchestrator._store.session import Session


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
            "shortSummary": self.result.short_summary if self.result else None,
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
    from orchestrator._core.tokens import estimate_tokens

    total = estimate_tokens({"role": "compactionSummary", "summary": result.summary})
    for message in kept_messages(session, plan):
        total += estimate_tokens(message)
    return total


async def compact_session(
    session: Session,
    summarizer: SummaryRoutes,
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
    context = session.context()
    plan = plan_compaction(path, settings or CompactionSettings(), context=context)
    tokens_before = context.tokens().tokens
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
    entry = session.append_entry(COMPACTION, result.entry_fields())
    session.flush()
    return entry
