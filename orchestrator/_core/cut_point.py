"""Where a compaction cuts the path (pi's findCutPoint; decisions D9, D10).

Theory of operation. A compaction keeps the newest ``keep_recent_tokens`` of the window verbatim
and summarizes the rest. The first kept entry must be a *valid cut point*: an entry the context
can start with. A tool result never is, because it must follow the assistant message that made
the call; otherwise the kept context would open with an orphan result.

:func:`find_cut_point` walks the window newest-first and adds the estimate of every ``message``
entry until the budget is spent, then picks a cut point near there. Two places differ from pi:

* D9: when the budget runs out inside trailing tool results (no cut point at or after the
  position), pi falls back to the first cut point and keeps everything, so nothing is compacted
  (pi#7201). I cut at the last cut point before the position instead: the assistant that made the
  calls. The kept tail is then larger than the budget, which is the best that can be done without
  separating a result from its call.
* D10: the cut is pulled back over metadata entries (model or thinking changes, labels...) so they
  stay with what they describe. pi then asks "is the cut a user message?" of the metadata entry,
  answers no, and turns the whole previous turn into a "turn prefix". I look past the pulled
  metadata at the first real message instead.

I also report a turn as split only when its prefix is non-empty. pi can say "split" with an empty
prefix (a cut on a custom message, a branch summary or a bash execution); its executor treats that
exactly like an unsplit turn, so the flag carried no information, only noise in plans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import BRANCH_SUMMARY, COMPACTION, CUSTOM_MESSAGE, MESSAGE, role_of
from orchestrator._core.tokens import estimate_tokens

CUT_ROLES = frozenset(
    {
        "user",
        "assistant",
        "bashExecution",
        "branchSummary",
        "compactionSummary",
        "custom",
        "hookMessage",
    }
)
"""Message roles a kept region may start with (never ``toolResult``)."""

TURN_START_ROLES = frozenset({"user", "bashExecution"})
"""Message roles that open a turn (with ``branch_summary`` and ``custom_message`` entries)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CutPoint:
    """The result of :func:`find_cut_point`, as indices into the path.

    Attributes:
        first_kept_index: Index of the first entry kept verbatim.
        turn_start_index: Index of the entry that opens the split turn, ``-1`` when not split.
        is_split_turn: True when the cut falls inside a turn whose beginning is summarized
            separately (the entries ``[turn_start_index, first_kept_index)``).
    """

    first_kept_index: int
    turn_start_index: int
    is_split_turn: bool


def is_cut_point(entry: Mapping[str, Any]) -> bool:
    """True when a kept region may start at ``entry`` (pi's valid cut points)."""
    kind = entry.get("type")
    if kind in (CUSTOM_MESSAGE, BRANCH_SUMMARY):
        return True
    return role_of(entry) in CUT_ROLES


def is_turn_start(entry: Mapping[str, Any]) -> bool:
    """True when ``entry`` opens a turn: user or bash message, custom message, branch summary."""
    kind = entry.get("type")
    if kind in (CUSTOM_MESSAGE, BRANCH_SUMMARY):
        return True
    return role_of(entry) in TURN_START_ROLES


def valid_cut_points(entries: Sequence[Mapping[str, Any]], start: int, end: int) -> list[int]:
    """Indices in ``[start, end)`` where a kept region may start, ascending."""
    return [i for i in range(start, end) if is_cut_point(entries[i])]


def find_turn_start_index(entries: Sequence[Mapping[str, Any]], index: int, start: int) -> int:
    """Index of the turn start at or before ``index`` (not before ``start``), ``-1`` if none."""
    for i in range(index, start - 1, -1):
        if is_turn_start(entries[i]):
            return i
    return -1


def _budget_index(
    entries: Sequence[Mapping[str, Any]], start: int, end: int, keep_recent_tokens: int
) -> int | None:
    # Newest first, only `message` entries count (pi): the position where the budget runs out.
    accumulated = 0
    for i in range(end - 1, start - 1, -1):
        entry = entries[i]
        if entry.get("type") != MESSAGE or not isinstance(entry.get("message"), dict):
            continue
        accumulated += estimate_tokens(entry["message"])
        if accumulated >= keep_recent_tokens:
            return i
    return None


def _pull_metadata(entries: Sequence[Mapping[str, Any]], cut: int, start: int) -> int:
    # Keep metadata with the turn it precedes. Stops at messages and at compactions: a previous
    # compaction entry is never the first kept entry (D8).
    while cut > start and entries[cut - 1].get("type") not in (MESSAGE, COMPACTION):
        cut -= 1
    return cut


def _opens_with_user(entries: Sequence[Mapping[str, Any]], cut: int, end: int) -> bool:
    # D10: judge the first real entry at or after the cut, not the metadata pulled in front of it.
    for i in range(cut, end):
        if entries[i].get("type") in (MESSAGE, COMPACTION):
            return role_of(entries[i]) == "user"
    return False


_UNSET: object = object()


def _first_cut_point(entries: Sequence[Mapping[str, Any]], index: int, end: int) -> int | None:
    for i in range(index, end):
        if is_cut_point(entries[i]):
            return i
    return None


def _last_cut_point(entries: Sequence[Mapping[str, Any]], index: int, start: int) -> int | None:
    for i in range(index - 1, start - 1, -1):
        if is_cut_point(entries[i]):
            return i
    return None


def find_cut_point(
    entries: Sequence[Mapping[str, Any]],
    start: int,
    end: int,
    keep_recent_tokens: int,
    *,
    spent_at: int | None | object = _UNSET,
) -> CutPoint:
    """Find the first kept entry of the window ``entries[start:end]`` (pi's findCutPoint).

    Args:
        entries: The root-first path.
        start: First index of the window (the compaction boundary).
        end: One past the last index of the window.
        keep_recent_tokens: Estimated tokens of recent messages to keep verbatim.
        spent_at: Where the budget runs out, when the caller knows it already (planning reads
            it from the context's running sums); by default it is counted here.

    Returns:
        The cut. With no valid cut point the whole window is kept (``first_kept_index=start``).
    """
    if spent_at is _UNSET:
        spent_at = _budget_index(entries, start, end, keep_recent_tokens)
    # The first cut point at or after the position; D9: with none there (trailing tool
    # results), the last one before it, the assistant that made the calls, rather than keeping
    # everything. Only the entries between the position and those cut points are looked at.
    if isinstance(spent_at, int):
        cut = _first_cut_point(entries, spent_at, end)
        if cut is None:
            cut = _last_cut_point(entries, spent_at, start)
    else:
        cut = _first_cut_point(entries, start, end)
    if cut is None:
        return CutPoint(first_kept_index=start, turn_start_index=-1, is_split_turn=False)
    cut = _pull_metadata(entries, cut, start)
    if _opens_with_user(entries, cut, end):
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    turn_start = find_turn_start_index(entries, cut, start)
    if turn_start == -1 or turn_start == cut:
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    return CutPoint(first_kept_index=cut, turn_start_index=turn_start, is_split_turn=True)
