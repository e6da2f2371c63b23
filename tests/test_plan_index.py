"""Planning through the context's index gives exactly what the full walk of the window gave.

The planner reads running sums, positions and file operations that the context builder keeps up
to date (issue 9). This module keeps the walk it replaced as the reference, and compares the two
over random sessions, through a fresh context and through a live one that grew entry by entry.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.compaction_plan import (
    CompactionPlan,
    NothingToCompact,
    last_compaction_index,
    plan_compaction,
    window_start,
)
from orchestrator._core.context import ContextBuilder, build_context
from orchestrator._core.cut_point import (
    TURN_START_ROLES,
    CutPoint,
    find_turn_start_index,
    valid_cut_points,
)
from orchestrator._core.entries import COMPACTION, Entry, Message, entry_message
from orchestrator._core.file_ops import (
    compute_file_lists,
    file_ops_from_details,
    file_ops_of_messages,
)
from orchestrator._core.tokens import (
    CompactionSettings,
    calculate_prompt_tokens,
    estimate_tokens,
    valid_usage,
)
from tests.test_planning_properties import KEEP, sessions

Path = list[Entry]


def _gives(entry: Entry) -> Message | None:
    # These sessions hold no context edit: an entry's message is its own (a compaction's none).
    return None if entry.get("type") == COMPACTION else entry_message(entry)


def reference_cut_point(path: Path, start: int, end: int, keep: int) -> CutPoint:
    cut_points = valid_cut_points(path, start, end)
    if not cut_points:
        return CutPoint(first_kept_index=start, turn_start_index=-1, is_split_turn=False)
    cut = cut_points[0]
    accumulated, spent_at = 0, None
    for i in range(end - 1, start - 1, -1):  # every message counts (pi 1.x), those of 0 aside
        message = _gives(path[i])
        tokens = estimate_tokens(message) if message is not None else 0
        if tokens:
            accumulated += tokens
            if accumulated >= keep:
                spent_at = i
                break
    if spent_at is not None:
        later = bisect.bisect_left(cut_points, spent_at)
        cut = cut_points[later] if later < len(cut_points) else cut_points[-1]
    latest = last_compaction_index(path)
    while True:  # entries that give no message stay with what follows
        at = cut - 1 if cut - 1 != latest else cut - 2  # the latest compaction is not there
        if at < start or path[at].get("type") == COMPACTION or _gives(path[at]) is not None:
            break
        cut = at
    shown = next((m for e in path[cut:end] if (m := _gives(e)) is not None), None)
    if shown is not None and shown.get("role") in TURN_START_ROLES:  # D10
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    turn_start = find_turn_start_index(path, cut, start)
    if turn_start in (-1, cut):
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    return CutPoint(first_kept_index=cut, turn_start_index=turn_start, is_split_turn=True)


def reference_keep(path: Path, settings: CompactionSettings) -> int:
    keep = settings.keep_recent_tokens
    if not settings.adaptive_keep:
        return keep
    context = build_context(path)
    index = context.tokens().last_usage_index
    if index is None:
        return keep
    previous = last_compaction_index(path)
    later = {path[i].get("id") for i in range(previous + 1, len(path))}
    if previous >= 0 and context.entry_ids[index] not in later:
        return keep
    usage = valid_usage(context.messages[index])
    estimate = sum(context.estimates[:index])
    if usage is None or estimate <= 0:
        return keep
    ratio = calculate_prompt_tokens(usage) / estimate
    if not math.isfinite(ratio) or ratio <= 1:
        return keep
    return max(1, math.floor(keep / ratio))


def _messages(entries: Sequence[Entry]) -> tuple[tuple[str, ...], tuple[Message, ...]]:
    pairs = [
        (e["id"], m)
        for e in entries
        if e.get("type") != COMPACTION and (m := entry_message(e)) is not None
    ]
    return tuple(i for i, _ in pairs), tuple(m for _, m in pairs)


def reference_plan(path: Path, settings: CompactionSettings) -> dict[str, Any] | str:
    """The plan as the window walk made it, as comparable fields (or the reason for none)."""
    if path and path[-1].get("type") == COMPACTION:
        return "Already compacted"
    previous_index = last_compaction_index(path)
    start, end = window_start(path, previous_index), len(path)
    keep = reference_keep(path, settings)
    cut = reference_cut_point(path, start, end, keep)
    if cut.first_kept_index >= end or not path[cut.first_kept_index].get("id"):
        return "Nothing to compact (session too small)"
    history_end = cut.turn_start_index if cut.is_split_turn else cut.first_kept_index
    ids, messages = _messages(path[start:history_end])
    prefix_ids, prefix = (
        _messages(path[cut.turn_start_index : cut.first_kept_index])
        if cut.is_split_turn
        else ((), ())
    )
    if not messages and not prefix:
        return "Nothing to compact (session too small)"
    previous = path[previous_index] if previous_index >= 0 else None
    seed = file_ops_from_details(previous) if previous is not None else None
    read, modified = compute_file_lists(file_ops_of_messages((*messages, *prefix), seed))
    return {
        "first_kept": path[cut.first_kept_index]["id"],
        "split": cut.is_split_turn,
        "ids": ids,
        "prefix_ids": prefix_ids,
        "messages": messages,
        "prefix": prefix,
        "read": read,
        "modified": modified,
        "keep": keep,
        "kept": tuple(e["id"] for e in path[cut.first_kept_index :]),
    }


def comparable(plan: CompactionPlan | NothingToCompact) -> dict[str, Any] | str:
    if isinstance(plan, NothingToCompact):
        return plan.reason
    return {
        "first_kept": plan.first_kept_entry_id,
        "split": plan.is_split_turn,
        "ids": plan.summarize_entry_ids,
        "prefix_ids": plan.turn_prefix_entry_ids,
        "messages": plan.messages_to_summarize,
        "prefix": plan.turn_prefix_messages,
        "read": plan.read_files,
        "modified": plan.modified_files,
        "keep": plan.effective_keep_recent_tokens,
        "kept": plan.kept_entry_ids,
    }


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sessions(branched=True), KEEP, st.booleans())
def test_the_index_plans_what_the_window_walk_planned(
    session: Any, keep: int, adaptive: bool
) -> None:
    path = session.path()
    settings = CompactionSettings(keep_recent_tokens=keep, adaptive_keep=adaptive)
    assert comparable(plan_compaction(path, settings)) == reference_plan(path, settings)


@SETTINGS
@given(sessions(branched=False), KEEP)
def test_a_live_context_grown_entry_by_entry_plans_the_same(session: Any, keep: int) -> None:
    # The builder kept across appends and compactions (as a Session keeps it) at every step.
    path = session.path()
    settings = CompactionSettings(keep_recent_tokens=keep)
    live = ContextBuilder()
    for end in range(1, len(path) + 1):
        live.push(path[end - 1])
        planned = plan_compaction(path[:end], settings, context=live.context())
        assert comparable(planned) == reference_plan(path[:end], settings)


def test_a_context_of_another_path_is_not_trusted() -> None:
    from tests.sessions import SessionBuilder

    s = SessionBuilder()
    s.user("u" * 4000)
    s.assistant("a" * 4000)
    s.user("v" * 4000)
    s.assistant("b" * 4000)
    settings = CompactionSettings(keep_recent_tokens=100)
    stale = build_context(s.path()[:2])  # a context of a shorter path
    assert comparable(plan_compaction(s.path(), settings, context=stale)) == reference_plan(
        s.path(), settings
    )


@SETTINGS
@given(sessions(branched=False), st.integers(min_value=-10, max_value=3000))
def test_the_kept_budget_is_reached_where_the_newest_first_walk_reaches_it(
    session: Any, keep: int
) -> None:
    # The index answers from running sums (a binary search); pi 1.x walks every message after
    # the compaction's own newest first, passing those that count 0, until their estimates
    # reach the budget. A budget of 0 or less: the newest that counts.
    path = session.path()
    context = build_context(path)
    index = context.index
    assert index is not None
    walked, accumulated = None, 0
    for k in range(index.count - 1, index.base - 1, -1):
        if context.estimates[k] == 0:
            continue
        accumulated += context.estimates[k]
        if accumulated >= keep:
            walked = index.positions[k]
            break
    assert index.budget_position(keep) == walked
