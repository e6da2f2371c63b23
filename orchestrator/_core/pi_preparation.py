"""Plans from the preparations pi hands its extensions (``session_before_compact`` / ``_tree``).

Theory of operation. When pi compacts or summarizes a branch with our extension loaded
(``integrations/pi``), pi has already planned: its ``CompactionPreparation`` says what to
summarize and where the kept part starts, its ``TreePreparation`` lists the abandoned entries.
pi owns the session file and appends the entry itself; we only write the summary. So I do not
plan again from a file: I turn pi's preparation, as JSON, into the frozen plan our executor
takes, and check its shape on the way, because it comes over a socket. A wrong shape is a
:class:`PreparationError` naming the field (the server answers it ``-32602``).

What pi's preparation does not carry is left empty, and nothing downstream needs it: the entry
ids of the summarized messages (the journal and the plan report count them only), the kept
messages (read for the short summary only) and the previous compaction's id (pi gives its
summary, ``previousSummary``, which is what the summarizer updates). pi sends ``fileOps`` as
three sets; the extension sends them as arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator._core.branch_plan import BranchPlan, prepare_branch_entries
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.entries import Entry, Message
from orchestrator._core.file_ops import FileOperations, compute_file_lists
from orchestrator._core.tokens import CompactionSettings


class PreparationError(ValueError):
    """pi's preparation, as the client sent it, has a field of the wrong shape (its fault)."""


def _field(values: Mapping[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = values.get(name)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise PreparationError(f"'preparation.{name}' must be {what}")
    return value


def _objects(values: Mapping[str, Any], name: str, what: str) -> tuple[dict[str, Any], ...]:
    items = _field(values, name, (list,), f"an array of {what}")
    if not all(isinstance(item, dict) for item in items):
        raise PreparationError(f"'preparation.{name}' must be an array of {what}")
    return tuple(items)


def _messages(values: Mapping[str, Any], name: str) -> tuple[Message, ...]:
    messages = _objects(values, name, "messages (objects with a 'role')")
    if not all(isinstance(m.get("role"), str) for m in messages):
        raise PreparationError(f"'preparation.{name}' must be an array of messages with a 'role'")
    return messages


def _paths(values: Mapping[str, Any], name: str) -> frozenset[str]:
    listed = values.get(name, [])
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise PreparationError(f"'preparation.fileOps.{name}' must be an array of paths")
    return frozenset(p for p in listed if p)


def _file_ops(preparation: Mapping[str, Any]) -> FileOperations:
    ops = preparation.get("fileOps", {})
    if not isinstance(ops, dict):
        raise PreparationError(
            "'preparation.fileOps' must be an object of path arrays (read, written, edited)"
        )
    return FileOperations(
        read=_paths(ops, "read"), written=_paths(ops, "written"), edited=_paths(ops, "edited")
    )


def _count(values: Mapping[str, Any], name: str) -> int:
    number = _field(values, name, (int,), "a non-negative integer")
    if number < 0:
        raise PreparationError(f"'preparation.{name}' must be a non-negative integer")
    return int(number)


def compaction_plan_from_pi(preparation: Mapping[str, Any]) -> CompactionPlan:
    """The plan of pi's ``CompactionPreparation`` (as JSON, ``fileOps`` as arrays).

    Args:
        preparation: ``firstKeptEntryId``, ``messagesToSummarize``, ``turnPrefixMessages``,
            ``isSplitTurn``, ``tokensBefore``, ``previousSummary?``, ``fileOps?``,
            ``settings?`` (its ``keepRecentTokens`` is recorded in the plan).

    Returns:
        The plan, with pi's cut: nothing is planned again.

    Raises:
        PreparationError: A field is missing or of the wrong type.
    """
    first_kept = _field(preparation, "firstKeptEntryId", (str,), "a non-empty string")
    if not first_kept:
        raise PreparationError("'preparation.firstKeptEntryId' must be a non-empty string")
    previous = preparation.get("previousSummary")
    if previous is not None and not isinstance(previous, str):
        raise PreparationError("'preparation.previousSummary' must be a string or absent")
    settings = preparation.get("settings", {})
    if not isinstance(settings, dict):
        raise PreparationError("'preparation.settings' must be an object")
    keep = settings.get("keepRecentTokens", CompactionSettings().keep_recent_tokens)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise PreparationError("'preparation.settings.keepRecentTokens' must be an integer")
    read_files, modified_files = compute_file_lists(_file_ops(preparation))
    return CompactionPlan(
        first_kept_entry_id=first_kept,
        is_split_turn=_field(preparation, "isSplitTurn", (bool,), "a boolean"),
        turn_start_entry_id=None,
        summarize_entry_ids=(),
        turn_prefix_entry_ids=(),
        messages_to_summarize=_messages(preparation, "messagesToSummarize"),
        turn_prefix_messages=_messages(preparation, "turnPrefixMessages"),
        kept_entry_ids=(),
        kept_messages=(),
        tokens_before=_count(preparation, "tokensBefore"),
        previous_summary=previous,
        previous_compaction_id=None,
        read_files=read_files,
        modified_files=modified_files,
        keep_recent_tokens=keep,
        effective_keep_recent_tokens=keep,
        previous_preserve_data=None,
    )


def _optional_id(values: Mapping[str, Any], name: str) -> str | None:
    value = values.get(name)
    if value is not None and not isinstance(value, str):
        raise PreparationError(f"'preparation.{name}' must be an entry id or null")
    return value


def branch_plan_from_pi(preparation: Mapping[str, Any], token_budget: int) -> BranchPlan:
    """The plan of pi's ``TreePreparation``: its abandoned entries, fitted to the budget.

    pi collects the entries (``collectEntriesForBranchSummary``); choosing the messages that
    fit (``prepareBranchEntries``) is part of summarizing, so it is ours, with our budget.

    Args:
        preparation: ``entriesToSummarize`` (session entries, oldest first), ``oldLeafId``,
            ``targetId``, ``commonAncestorId``.
        token_budget: Estimated tokens the summarizer may read (0: no limit).

    Raises:
        PreparationError: A field is missing or of the wrong type.
    """
    entries: Sequence[Entry] = _objects(
        preparation, "entriesToSummarize", "session entries (objects with an 'id')"
    )
    if not all(isinstance(e.get("id"), str) for e in entries):
        raise PreparationError("'preparation.entriesToSummarize' must be entries with an 'id'")
    return prepare_branch_entries(
        entries,
        token_budget,
        old_leaf_id=_optional_id(preparation, "oldLeafId"),
        target_id=_optional_id(preparation, "targetId"),
        common_ancestor_id=_optional_id(preparation, "commonAncestorId"),
    )
