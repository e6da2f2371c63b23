"""Plan a branch summary without calling a model (as pi does it; D16, D17).

Theory of operation. When the user navigates from one leaf to another entry, the entries of the
abandoned branch (from the old leaf up to, not including, the common ancestor) can be summarized
and the summary attached at the new position. :func:`collect_branch_entries` finds those entries;
:func:`prepare_branch_entries` turns them into the messages that fit the summarizer's budget,
newest first, because the end of an abandoned branch is what the user most needs to remember.

Two pi rules shape the budget: tool results are left out entirely (the assistant's calls say what
was done, and results are the bulk of the tokens), and an earlier summary (compaction or branch
summary) that does not fit is still taken while less than 90 % of the budget is used, because one
summary carries more than the few messages that would fit in its place.

The plan records the old leaf, which the executor writes as the summary's ``fromId`` (D17), and
the full file lists for ``details`` (D16: the text may cap them, the details never do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.entries import (
    BRANCH_SUMMARY,
    COMPACTION,
    CONTEXT_EDIT,
    Entry,
    Message,
    compaction_message,
    entry_message,
    project,
)
from orchestrator._core.file_ops import (
    FileOperations,
    compute_file_lists,
    file_ops_from_details,
    file_ops_of_messages,
)
from orchestrator._core.tokens import estimate_tokens
from orchestrator._core.tree import SessionTree

SUMMARY_OVERRUN_RATIO = 0.9
"""An earlier summary that overruns the budget is still taken while under 90 % is used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchPlan:
    """What a branch summary covers (pi ``TreePreparation`` plus ``prepareBranchEntries``).

    Attributes:
        old_leaf_id: The abandoned leaf (the summary's ``fromId``, D17).
        target_id: The navigation target.
        common_ancestor_id: Deepest entry on both paths, ``None`` if they are disjoint.
        entry_ids: The abandoned entries, oldest first.
        summarized_entry_ids: Those that fit the budget and produce a message, oldest first,
            one per message.
        messages: The messages to summarize, oldest first.
        total_tokens: Estimated tokens of ``messages``.
        read_files: Files read and never modified (sorted).
        modified_files: Files written or edited (sorted).
    """

    old_leaf_id: str | None
    target_id: str | None
    common_ancestor_id: str | None
    entry_ids: tuple[str, ...] = field(repr=False)
    summarized_entry_ids: tuple[str, ...] = field(repr=False)
    messages: tuple[Message, ...] = field(repr=False)
    total_tokens: int
    read_files: tuple[str, ...]
    modified_files: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """The branch object of ``orchestrator plan --from --to --json`` (inspection-json.md)."""
        return {
            "oldLeafId": self.old_leaf_id,
            "targetId": self.target_id,
            "commonAncestorId": self.common_ancestor_id,
            "entryIds": list(self.entry_ids),
            "summarizedEntryIds": list(self.summarized_entry_ids),
            "totalTokens": self.total_tokens,
            "readFiles": list(self.read_files),
            "modifiedFiles": list(self.modified_files),
        }


def collect_branch_entries(
    tree: SessionTree, old_leaf_id: str | None, target_id: str | None
) -> tuple[list[Entry], str | None]:
    """The entries abandoned by navigating from ``old_leaf_id`` to ``target_id``.

    The same entries as pi's ``collectEntriesForBranchSummary``.

    Args:
        tree: The session tree.
        old_leaf_id: The leaf being left; ``None`` abandons nothing.
        target_id: The entry navigated to; ``None`` means the root position (a new root).

    Returns:
        ``(entries oldest first, common ancestor id or None)``. Walking stops at the ancestor or
        at a missing parent; it does not stop at compactions.

    Raises:
        SessionError: ``Entry <id> not found`` for an unknown id.
    """
    if old_leaf_id is None:
        return [], None
    old_path = tree.path(old_leaf_id)
    on_old_path = {e["id"] for e in old_path}
    target_path = tree.path(target_id) if target_id is not None else []
    ancestor = next((e["id"] for e in reversed(target_path) if e["id"] in on_old_path), None)
    entries: list[Entry] = []
    for entry in reversed(old_path):
        if entry["id"] == ancestor:
            break
        entries.append(entry)
    entries.reverse()
    return entries, ancestor


def _branch_message(entry: Entry, edit: Entry | None) -> Message | None:
    # Tool results are left out; a compaction reads as its summary message (as in pi). The
    # latest context edit of an entry in the branch applies to it (pi 1.5).
    if entry.get("type") == COMPACTION:
        return compaction_message(entry)
    message = entry_message(entry)
    if message is None or message.get("role") == "toolResult":
        return None
    return project(message, edit) if edit is not None else message


def prepare_branch_entries(
    entries: Sequence[Entry],
    token_budget: int = 0,
    *,
    old_leaf_id: str | None = None,
    target_id: str | None = None,
    common_ancestor_id: str | None = None,
) -> BranchPlan:
    """Choose the messages of ``entries`` that fit ``token_budget``, newest first (as pi does).

    Args:
        entries: The abandoned entries, oldest first (from :func:`collect_branch_entries`).
        token_budget: Estimated tokens the summarizer may read; 0 means no limit.
        old_leaf_id: Recorded in the plan.
        target_id: Recorded in the plan.
        common_ancestor_id: Recorded in the plan.

    Returns:
        The plan. File operations cover earlier pi-made branch summaries' details, every taken
        message, and the message that first overran the budget (pi harvests before checking).
    """
    ops = FileOperations()
    edits: dict[object, Entry] = {}
    for entry in entries:
        kind = entry.get("type")
        if kind == BRANCH_SUMMARY:
            ops = ops.union(file_ops_from_details(entry))
        elif kind == CONTEXT_EDIT:
            edits[entry.get("targetId")] = entry
    taken: list[tuple[str, Message]] = []
    total = 0
    for entry in reversed(entries):
        message = _branch_message(entry, edits.get(entry["id"]) if edits else None)
        if message is None:
            continue
        ops = file_ops_of_messages((message,), ops)
        tokens = estimate_tokens(message)
        if token_budget > 0 and total + tokens > token_budget:
            is_summary = entry.get("type") in (COMPACTION, BRANCH_SUMMARY)
            if is_summary and total < SUMMARY_OVERRUN_RATIO * token_budget:
                taken.append((entry["id"], message))
                total += tokens
            break
        taken.append((entry["id"], message))
        total += tokens
    taken.reverse()
    read_files, modified_files = compute_file_lists(ops)
    return BranchPlan(
        old_leaf_id=old_leaf_id,
        target_id=target_id,
        common_ancestor_id=common_ancestor_id,
        entry_ids=tuple(e["id"] for e in entries),
        summarized_entry_ids=tuple(i for i, _ in taken),
        messages=tuple(m for _, m in taken),
        total_tokens=total,
        read_files=read_files,
        modified_files=modified_files,
    )


def plan_branch_summary(
    tree: SessionTree, old_leaf_id: str | None, target_id: str | None, token_budget: int = 0
) -> BranchPlan:
    """Collect and prepare in one call: what navigating with a summary would summarize.

    Raises:
        SessionError: ``Entry <id> not found`` for an unknown id.
    """
    entries, ancestor = collect_branch_entries(tree, old_leaf_id, target_id)
    return prepare_branch_entries(
        entries,
        token_budget,
        old_leaf_id=old_leaf_id,
        target_id=target_id,
        common_ancestor_id=ancestor,
    )
