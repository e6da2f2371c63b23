"""One test per planning decision (D6-D12, D23; docs/decisions.md)."""

from __future__ import annotations

from orchestrator._core.compaction_plan import (
    ALREADY_COMPACTED,
    NOTHING_TO_COMPACT,
    CompactionPlan,
    NothingToCompact,
    effective_keep_recent_tokens,
    plan_compaction,
)
from orchestrator._core.context import build_context
from orchestrator._core.prune import apply_prune, plan_prune
from orchestrator._core.tokens import CompactionSettings
from tests.sessions import SessionBuilder, usage


def _settings(keep: int, adaptive: bool = False) -> CompactionSettings:
    return CompactionSettings(keep_recent_tokens=keep, adaptive_keep=adaptive)


def _plan(path: list[dict[str, object]], settings: CompactionSettings) -> CompactionPlan:
    plan = plan_compaction(path, settings)
    assert isinstance(plan, CompactionPlan), plan
    return plan


def test_d6_tokens_before_is_last_usage_plus_trailing_estimate() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400, usage=usage(5000))
    s.user("c" * 400)  # 100 tokens after the usage
    s.custom_message("d" * 400)  # custom messages are counted too (D6): 100 more
    s.assistant("e" * 400)  # no usage: estimated, 100 more
    s.user("f" * 400)
    assert _plan(s.path(), _settings(150)).tokens_before == 5000 + 400
    # With no usage anywhere, everything is estimated: never 0.
    bare = SessionBuilder()
    bare.user("a" * 400)
    bare.assistant("b" * 400)
    bare.user("c" * 400)
    bare.assistant("d" * 400)
    assert _plan(bare.path(), _settings(150)).tokens_before == 400


def test_d7_keep_recent_tokens_adapts_to_the_measured_ratio() -> None:
    s = SessionBuilder()
    s.user("a" * 400)  # estimated 100; the provider counted 400 for this request
    s.assistant("b" * 400, usage=usage(input=400, output=100))
    s.user("c" * 400)
    s.assistant("d" * 400)
    adaptive = _settings(200, adaptive=True)
    assert effective_keep_recent_tokens(s.path(), adaptive) == 50
    plan = _plan(s.path(), adaptive)
    assert plan.keep_recent_tokens == 200
    assert plan.effective_keep_recent_tokens == 50
    assert effective_keep_recent_tokens(s.path(), _settings(200)) == 200
    # A ratio at or below 1 changes nothing.
    cheap = SessionBuilder()
    cheap.user("a" * 400)
    cheap.assistant("b", usage=usage(input=50))
    assert effective_keep_recent_tokens(cheap.path(), adaptive) == 200
    # A usage measured before the last compaction describes a context that is gone.
    u = s.user("e" * 40)
    s.compaction("sum", first_kept=u)
    s.user("f" * 40)
    assert effective_keep_recent_tokens(s.path(), adaptive) == 200


def test_d8_entries_kept_by_the_previous_compaction_are_not_lost() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    kept_u = s.user("c" * 400)
    kept_a = s.assistant("d" * 400)
    first = s.compaction("first summary", first_kept=kept_u)
    new_u = s.user("e" * 400)
    new_a = s.assistant("f" * 400)
    plan = _plan(s.path(), _settings(150))
    # pi would start after the compaction and drop kept_u/kept_a from the context for good.
    assert plan.summarize_entry_ids == (kept_u, kept_a)
    assert plan.kept_entry_ids == (new_u, new_a)
    assert plan.first_kept_entry_id == new_u
    assert plan.previous_summary == "first summary"
    assert first not in plan.summarize_entry_ids


def test_d9_huge_trailing_tool_results_still_compact() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    u = s.user("c" * 400)
    caller = s.assistant("", calls=[("bash", {"command": "cat big"}), ("bash", {"command": "x"})])
    s.tool_result("x" * 40_000)  # 10000 tokens, more than the whole budget
    s.tool_result("y" * 40_000)
    plan = _plan(s.path(), _settings(1000))
    assert plan.first_kept_entry_id == caller
    assert plan.is_split_turn
    assert plan.turn_start_entry_id == u
    assert len(plan.summarize_entry_ids) == 2


def test_d10_metadata_before_a_user_message_is_no_split_turn() -> None:
    s = SessionBuilder()
    u1 = s.user("a" * 400)
    a1 = s.assistant("b" * 400)
    change = s.model_change()
    s.thinking("low")
    s.user("c" * 400)
    s.assistant("d" * 400)
    plan = _plan(s.path(), _settings(150))
    assert plan.first_kept_entry_id == change
    assert not plan.is_split_turn
    assert plan.turn_prefix_entry_ids == ()
    assert plan.summarize_entry_ids == (u1, a1)


def test_d11_split_turn_without_earlier_history_keeps_the_previous_summary() -> None:
    s = SessionBuilder()
    u = s.user("a" * 40)
    s.compaction("earlier work", first_kept=u)
    a1 = s.assistant("b" * 400)
    a2 = s.assistant("c" * 400)
    plan = _plan(s.path(), _settings(100))
    # The whole window is one turn: nothing before it to summarize, only the turn prefix.
    assert plan.is_split_turn
    assert plan.turn_start_entry_id == u
    assert plan.messages_to_summarize == ()
    assert plan.turn_prefix_entry_ids == (u, a1)
    assert plan.first_kept_entry_id == a2
    # The executor must build the history part from this, not from "No prior history.".
    assert plan.previous_summary == "earlier work"


def test_d12_nothing_to_compact_means_no_plan() -> None:
    s = SessionBuilder()
    s.model_change()
    s.thinking()
    s.user("hi")
    s.assistant("hello")
    assert plan_compaction(s.path(), _settings(20000)) == NothingToCompact(
        reason=NOTHING_TO_COMPACT
    )
    s.compaction("sum", first_kept=s.path()[2]["id"])
    assert plan_compaction(s.path(), _settings(1)) == NothingToCompact(reason=ALREADY_COMPACTED)
    # After a compaction, a window that fits the budget is "too small" too: no empty summary.
    s.user("x" * 400)
    assert plan_compaction(s.path(), _settings(20000)) == NothingToCompact(
        reason=NOTHING_TO_COMPACT
    )


def test_d23_pruning_keeps_the_original_output() -> None:
    s = SessionBuilder()
    s.user("go")
    for i in range(3):
        s.assistant("", calls=[("bash", {"command": str(i)})])
        s.tool_result(str(i) * 120_000)
    path = s.path()
    plan = plan_prune(path)
    [pruned] = apply_prune(plan, path, 1_800_000_000_000)
    original = s[pruned["id"]]["message"]["content"]
    assert pruned["prunedContent"] == original
    assert pruned["message"]["content"] == [
        {"type": "text", "text": "[Output truncated - 30000 tokens]"}
    ]
    replaced = [pruned if e["id"] == pruned["id"] else e for e in path]
    shown = build_context(replaced).messages
    assert {"type": "text", "text": "[Output truncated - 30000 tokens]"} in [
        block for m in shown if m["role"] == "toolResult" for block in m["content"]
    ]
