"""Properties of compaction planning over random linear and branched sessions (D8, D9, D10).

Sessions are written the way pi writes them: tool results always follow the assistant that made
the calls, and every compaction on a path was planned by :func:`plan_compaction` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.compaction_plan import (
    CompactionPlan,
    last_compaction_index,
    plan_compaction,
    window_start,
)
from orchestrator._core.context import build_context
from orchestrator._core.cut_point import find_cut_point, valid_cut_points
from orchestrator._core.entries import COMPACTION, entry_message, role_of
from orchestrator._core.tokens import CompactionSettings
from tests.sessions import SessionBuilder, usage

TEXT = st.integers(min_value=0, max_value=1600)
KEEP = st.integers(min_value=1, max_value=1500)


def _text(char: str, size: int) -> str:
    return char * size


def _turn(draw: st.DrawFn, s: SessionBuilder) -> None:
    calls = draw(st.integers(min_value=0, max_value=3))
    measured = draw(st.none() | st.integers(min_value=1, max_value=20_000))
    s.assistant(
        _text("a", draw(TEXT)),
        calls=[("read", {"path": f"f{i}.py"}) for i in range(calls)],
        usage=usage(measured) if measured else None,
    )
    for _ in range(calls):
        s.tool_result(_text("r", draw(st.integers(min_value=0, max_value=8000))))


def _compact(draw: st.DrawFn, s: SessionBuilder) -> None:
    plan = plan_compaction(s.path(), CompactionSettings(keep_recent_tokens=draw(KEEP)))
    if isinstance(plan, CompactionPlan):
        s.compaction(
            "summary",
            first_kept=plan.first_kept_entry_id,
            details={"readFiles": list(plan.read_files), "modifiedFiles": []},
        )


def _branch(draw: st.DrawFn, s: SessionBuilder) -> None:
    if s.entries:
        s.branch(draw(st.sampled_from([e["id"] for e in s.entries])))


def _meta(draw: st.DrawFn, s: SessionBuilder) -> None:
    makers: list[Callable[[], str]] = [s.model_change, s.thinking, s.custom]
    draw(st.sampled_from(makers))()


ACTIONS: dict[str, Callable[[st.DrawFn, SessionBuilder], object]] = {
    "user": lambda draw, s: s.user(_text("u", draw(TEXT))),
    "turn": _turn,
    "bash": lambda draw, s: s.bash("ls", _text("o", draw(TEXT))),
    "custom_message": lambda draw, s: s.custom_message(_text("c", draw(TEXT))),
    "meta": _meta,
    "compact": _compact,
    "branch": _branch,
    "branch_summary": lambda draw, s: s.branch_summary(_text("s", draw(TEXT))),
}


@st.composite
def sessions(draw: st.DrawFn, *, branched: bool) -> SessionBuilder:
    """A random session; with ``branched``, the leaf also jumps back to earlier entries."""
    s = SessionBuilder()
    kinds = ["user", "turn", "turn", "bash", "custom_message", "meta", "compact"]
    if branched:
        kinds += ["branch", "branch_summary"]
    for _ in range(draw(st.integers(min_value=1, max_value=24))):
        ACTIONS[draw(st.sampled_from(kinds))](draw, s)
    return s


def _message_ids(entries: list[dict[str, Any]]) -> list[str]:
    return [
        e["id"] for e in entries if e.get("type") != COMPACTION and entry_message(e) is not None
    ]


def _check_plan(path: list[dict[str, Any]], keep: int) -> None:
    plan = plan_compaction(path, CompactionSettings(keep_recent_tokens=keep))
    if not isinstance(plan, CompactionPlan):
        return
    ids = [e["id"] for e in path]
    first_kept = ids.index(plan.first_kept_entry_id)
    # A cut never lands on a tool result (nor on a compaction).
    assert role_of(path[first_kept]) != "toolResult"
    assert path[first_kept].get("type") != COMPACTION
    assert plan.kept_entry_ids == tuple(ids[first_kept:])
    # The kept messages the plan holds are those the kept entries give (issue 9: not a walk).
    kept = [entry_message(e) for e in path[first_kept:]]
    assert plan.kept_messages == tuple(m for m in kept if m is not None)
    # Summarized + turn prefix + kept partition the window's messages, in order (D8).
    start = window_start(path, last_compaction_index(path))
    kept_messages = _message_ids(path[first_kept:])
    parts = [*plan.summarize_entry_ids, *plan.turn_prefix_entry_ids, *kept_messages]
    assert parts == _message_ids(path[start:])
    assert len(plan.messages_to_summarize) == len(plan.summarize_entry_ids)
    assert len(plan.turn_prefix_messages) == len(plan.turn_prefix_entry_ids)
    # Nothing in the current context is lost: every message is summarized or kept.
    context = build_context(path)
    compaction_ids = {e["id"] for e in path if e.get("type") == COMPACTION}
    assert {i for i in context.entry_ids if i not in compaction_ids} <= set(parts)
    # After applying the plan, no tool result is without its call before it.
    compaction = {
        "type": COMPACTION,
        "id": "new-compaction",
        "parentId": ids[-1],
        "timestamp": path[-1]["timestamp"],
        "summary": "s",
        "firstKeptEntryId": plan.first_kept_entry_id,
        "tokensBefore": plan.tokens_before,
    }
    _assert_results_follow_calls(build_context([*path, compaction]).messages)


def _assert_results_follow_calls(messages: Sequence[dict[str, Any]]) -> None:
    seen_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "assistant":
            for block in message.get("content", []):
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    seen_calls.add(block["id"])
        elif message.get("role") == "toolResult":
            assert message["toolCallId"] in seen_calls


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sessions(branched=False), KEEP)
def test_linear_plans_are_sound(session: SessionBuilder, keep: int) -> None:
    _check_plan(session.path(), keep)


@SETTINGS
@given(sessions(branched=True), KEEP)
def test_branched_plans_are_sound(session: SessionBuilder, keep: int) -> None:
    _check_plan(session.path(), keep)


@SETTINGS
@given(sessions(branched=True), KEEP, st.data())
def test_cut_point_is_never_a_tool_result(
    session: SessionBuilder, keep: int, data: st.DataObject
) -> None:
    path = session.path()
    start = data.draw(st.integers(min_value=0, max_value=len(path)))
    cut = find_cut_point(path, start, len(path), keep)
    if not valid_cut_points(path, start, len(path)):
        assert cut.first_kept_index == start
        return
    assert start <= cut.first_kept_index < len(path)
    assert role_of(path[cut.first_kept_index]) != "toolResult"
    if cut.is_split_turn:
        assert start <= cut.turn_start_index < cut.first_kept_index
        assert role_of(path[cut.first_kept_index]) != "user"
