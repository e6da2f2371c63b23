"""Tool-output pruning (oh-my-pi's pruneToolOutputs, D23)."""

from __future__ import annotations

import copy

from orchestrator._core.context import build_context
from orchestrator._core.prune import (
    PruneCandidate,
    PrunePlan,
    apply_prune,
    plan_prune,
    prune_notice,
)
from tests.sessions import SessionBuilder

NOW = 1_800_000_000_000


def _session(results: list[tuple[str, int]]) -> tuple[SessionBuilder, list[str]]:
    """One assistant call + result per item: (tool name, result tokens)."""
    s = SessionBuilder()
    s.user("go")
    ids = []
    for name, tokens in results:
        s.assistant("", calls=[(name, {"path": "f"})])
        ids.append(s.tool_result("x" * (tokens * 4)))
    return s, ids


def test_newest_tokens_are_protected_and_older_results_pruned() -> None:
    s, ids = _session([("bash", 30_000), ("bash", 30_000), ("bash", 30_000)])
    plan = plan_prune(s.path())
    # newest (30k) protected: acc 0 < 40k; second: acc 30k < 40k protected; oldest: candidate.
    notice_tokens = -(-len(prune_notice(30_000)) // 4)
    assert plan == PrunePlan(
        candidates=(
            PruneCandidate(entry_id=ids[0], tokens=30_000, savings=30_000 - notice_tokens),
        ),
        tokens_saved=30_000 - notice_tokens,
    )
    assert plan.pruned_count == 1


def test_protected_tools_are_never_pruned() -> None:
    s, _ = _session([("read", 30_000), ("skill", 30_000), ("bash", 50_000)])
    assert plan_prune(s.path()) == PrunePlan()


def test_savings_below_the_minimum_change_nothing() -> None:
    s, _ = _session([("bash", 10_000), ("bash", 45_000)])
    assert plan_prune(s.path()) == PrunePlan()
    assert plan_prune(s.path(), minimum_savings=5_000).pruned_count == 1


def test_custom_thresholds() -> None:
    s, ids = _session([("bash", 100), ("bash", 100), ("bash", 100)])
    plan = plan_prune(s.path(), protect_tokens=150, minimum_savings=1, protected_tools=())
    assert [c.entry_id for c in plan.candidates] == [ids[0]]


def test_apply_builds_new_entries_and_keeps_the_original() -> None:
    s, ids = _session([("bash", 30_000), ("bash", 30_000), ("bash", 30_000)])
    path = s.path()
    before = copy.deepcopy(path)
    plan = plan_prune(path)
    [new] = apply_prune(plan, path, NOW)
    assert path == before  # nothing mutated
    old = s[ids[0]]
    assert new["id"] == old["id"]
    assert new["parentId"] == old["parentId"]
    assert new["message"]["content"] == [
        {"type": "text", "text": "[Output truncated - 30000 tokens]"}
    ]
    assert new["message"]["prunedAt"] == NOW
    assert new["prunedContent"] == old["message"]["content"]  # D23: nothing lost
    assert new["message"]["toolCallId"] == old["message"]["toolCallId"]


def test_pruned_results_count_toward_protection_and_are_not_pruned_again() -> None:
    s, ids = _session([("bash", 30_000), ("bash", 30_000), ("bash", 30_000)])
    plan = plan_prune(s.path())
    replaced = {e["id"]: e for e in apply_prune(plan, s.path(), NOW)}
    path = [replaced.get(e["id"], e) for e in s.path()]
    assert plan_prune(path, minimum_savings=0) == PrunePlan()
    # An already pruned result counts toward the protected tokens with its notice's estimate.
    s2 = SessionBuilder()
    s2.assistant("", calls=[("bash", {})])
    old = s2.tool_result("x" * 400)
    s2.assistant("", calls=[("bash", {})])
    s2.tool_result("y" * 40, pruned_at=NOW)
    plan2 = plan_prune(s2.path(), protect_tokens=5, minimum_savings=0)
    assert [c.entry_id for c in plan2.candidates] == [old]


def test_context_shows_the_notice_after_pruning() -> None:
    s, ids = _session([("bash", 30_000), ("bash", 30_000), ("bash", 30_000)])
    plan = plan_prune(s.path())
    replaced = {e["id"]: e for e in apply_prune(plan, s.path(), NOW)}
    path = [replaced.get(e["id"], e) for e in s.path()]
    before = build_context(s.path()).tokens().tokens
    after = build_context(path).tokens().tokens
    assert before - after == plan.tokens_saved


def test_empty_plan_applies_nothing() -> None:
    s, _ = _session([("bash", 10)])
    assert apply_prune(plan_prune(s.path()), s.path(), NOW) == []
