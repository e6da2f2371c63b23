"""Branch-summary planning (pi's collectEntriesForBranchSummary and prepareBranchEntries)."""

from __future__ import annotations

import pytest

from orchestrator._core.branch_plan import (
    collect_branch_entries,
    plan_branch_summary,
    prepare_branch_entries,
)
from orchestrator._core.errors import SessionError
from orchestrator._core.tokens import estimate_tokens
from tests.sessions import SessionBuilder


def _forked() -> tuple[SessionBuilder, dict[str, str]]:
    # root u1 - a1 - u2 - a2 (old leaf); a1 also has child u3 - a3 (target branch)
    s = SessionBuilder()
    ids = {"u1": s.user("start"), "a1": s.assistant("ok")}
    ids["u2"] = s.user("try A")
    ids["a2"] = s.assistant("did A", calls=[("edit", {"path": "a.py"})])
    ids["t2"] = s.tool_result("edited")
    ids["a2b"] = s.assistant("done A")
    s.branch(ids["a1"])
    ids["u3"] = s.user("try B")
    ids["a3"] = s.assistant("did B")
    return s, ids


def test_collect_entries_of_the_abandoned_branch() -> None:
    s, ids = _forked()
    entries, ancestor = collect_branch_entries(s.tree(), ids["a2b"], ids["a3"])
    assert ancestor == ids["a1"]
    assert [e["id"] for e in entries] == [ids["u2"], ids["a2"], ids["t2"], ids["a2b"]]


def test_collect_to_an_ancestor_and_to_a_descendant() -> None:
    s, ids = _forked()
    entries, ancestor = collect_branch_entries(s.tree(), ids["a2b"], ids["u1"])
    assert ancestor == ids["u1"]
    assert entries[0]["id"] == ids["a1"]
    assert collect_branch_entries(s.tree(), ids["u2"], ids["a2b"]) == ([], ids["u2"])


def test_collect_without_old_leaf_or_to_the_root() -> None:
    s, ids = _forked()
    assert collect_branch_entries(s.tree(), None, ids["a3"]) == ([], None)
    entries, ancestor = collect_branch_entries(s.tree(), ids["a3"], None)
    assert ancestor is None
    assert [e["id"] for e in entries] == [ids["u1"], ids["a1"], ids["u3"], ids["a3"]]


def test_collect_does_not_stop_at_compactions() -> None:
    s, ids = _forked()
    s.branch(ids["a2b"])
    c = s.compaction("sum", first_kept=ids["u2"])
    u = s.user("more")
    entries, _ = collect_branch_entries(s.tree(), u, ids["a3"])
    assert [e["id"] for e in entries][-3:] == [ids["a2b"], c, u]


def test_collect_unknown_ids_raise() -> None:
    s, ids = _forked()
    with pytest.raises(SessionError, match="Entry nope not found"):
        collect_branch_entries(s.tree(), "nope", ids["a3"])


def test_prepare_skips_tool_results_and_tracks_files() -> None:
    s, ids = _forked()
    plan = plan_branch_summary(s.tree(), ids["a2b"], ids["a3"])
    assert plan.summarized_entry_ids == (ids["u2"], ids["a2"], ids["a2b"])
    assert plan.entry_ids == (ids["u2"], ids["a2"], ids["t2"], ids["a2b"])
    assert plan.modified_files == ("a.py",)
    assert plan.total_tokens == sum(estimate_tokens(m) for m in plan.messages)
    assert all(m["role"] != "toolResult" for m in plan.messages)
    assert plan.as_json() == {
        "oldLeafId": ids["a2b"],
        "targetId": ids["a3"],
        "commonAncestorId": ids["a1"],
        "entryIds": list(plan.entry_ids),
        "summarizedEntryIds": list(plan.summarized_entry_ids),
        "totalTokens": plan.total_tokens,
        "readFiles": [],
        "modifiedFiles": ["a.py"],
    }


def test_compaction_becomes_a_summary_message_and_metadata_is_ignored() -> None:
    s = SessionBuilder()
    u = s.user("x")
    c = s.compaction("the summary", first_kept=u)
    s.model_change()
    s.label(u, "l")
    s.custom()
    b = s.branch_summary("elsewhere")
    m = s.custom_message("note")
    plan = prepare_branch_entries(s.path())
    assert plan.summarized_entry_ids == (u, c, b, m)
    assert [msg["role"] for msg in plan.messages] == [
        "user",
        "compactionSummary",
        "branchSummary",
        "custom",
    ]


def test_budget_takes_newest_first() -> None:
    s = SessionBuilder()
    s.user("a" * 400)  # 100 tokens each
    s.assistant("b" * 400)
    u = s.user("c" * 400)
    a = s.assistant("d" * 400)
    plan = prepare_branch_entries(s.path(), 250)
    assert plan.summarized_entry_ids == (u, a)
    assert plan.total_tokens == 200


def test_summary_over_budget_is_taken_under_ninety_percent() -> None:
    s = SessionBuilder()
    b = s.branch_summary("s" * 800)  # 200 tokens
    a = s.assistant("d" * 400)  # 100 tokens
    plan = prepare_branch_entries(s.path(), 250)
    assert plan.summarized_entry_ids == (b, a)
    assert plan.total_tokens == 300
    # At or above 90 % used, the summary is not taken.
    s2 = SessionBuilder()
    s2.branch_summary("s" * 800)
    a2 = s2.assistant("d" * 920)  # 230 tokens >= 0.9 * 250
    assert prepare_branch_entries(s2.path(), 250).summarized_entry_ids == (a2,)


def test_plain_message_over_budget_stops_but_still_harvests_files() -> None:
    s = SessionBuilder()
    s.assistant("x" * 4000, calls=[("read", {"path": "r.py"})])
    a = s.assistant("d" * 400)
    plan = prepare_branch_entries(s.path(), 150)
    assert plan.summarized_entry_ids == (a,)
    assert plan.read_files == ("r.py",)


def test_earlier_branch_summary_details_seed_files() -> None:
    s = SessionBuilder()
    s.branch_summary("x", details={"readFiles": ["r.py"], "modifiedFiles": ["m.py"]})
    s.branch_summary("y", details={"readFiles": ["e.py"]}, from_extension=True)
    s.compaction("z", first_kept="none", details={"readFiles": ["c.py"]})
    plan = prepare_branch_entries(s.path())
    assert plan.read_files == ("r.py",)
    assert plan.modified_files == ("m.py",)
