"""plan_compaction / plan_report and buildSessionContext with compactions (pi's rules)."""

from __future__ import annotations

from orchestrator._core.compaction_plan import (
    ALREADY_COMPACTED,
    NOTHING_TO_COMPACT,
    CompactionPlan,
    NothingToCompact,
    plan_compaction,
    plan_report,
    window_start,
)
from orchestrator._core.context import build_context
from orchestrator._core.tokens import CompactionSettings
from tests.sessions import SessionBuilder

SMALL = CompactionSettings(keep_recent_tokens=150, adaptive_keep=False)


def _plan(path: list[dict[str, object]], settings: CompactionSettings = SMALL) -> CompactionPlan:
    plan = plan_compaction(path, settings)
    assert isinstance(plan, CompactionPlan), plan
    return plan


def _two_turns() -> tuple[SessionBuilder, list[str]]:
    s = SessionBuilder()
    ids = [
        s.user("a" * 400),
        s.assistant("b" * 400),
        s.user("c" * 400),
        s.assistant("d" * 400),
    ]
    return s, ids


# -- buildSessionContext with compactions (pi compaction.test.ts) -----------------------------


def test_context_without_compaction() -> None:
    s, _ = _two_turns()
    s.thinking("high")
    context = build_context(s.path())
    assert len(context.messages) == 4
    assert context.thinking_level == "high"
    assert context.model is not None
    assert context.model.provider == "anthropic"


def test_context_single_compaction_is_summary_kept_and_after() -> None:
    s = SessionBuilder()
    s.user("1")
    s.assistant("a")
    u2 = s.user("2")
    s.assistant("b")
    s.compaction("Summary of 1,a,2,b", first_kept=u2)
    s.user("3")
    s.assistant("c")
    messages = build_context(s.path()).messages
    assert len(messages) == 5
    assert messages[0]["role"] == "compactionSummary"
    assert "Summary of 1,a,2,b" in messages[0]["summary"]


def test_context_multiple_compactions_only_latest() -> None:
    s = SessionBuilder()
    u1 = s.user("1")
    s.assistant("a")
    s.compaction("First summary", first_kept=u1)
    s.user("2")
    s.assistant("b")
    u3 = s.user("3")
    s.assistant("c")
    s.compaction("Second summary", first_kept=u3)
    s.user("4")
    s.assistant("d")
    messages = build_context(s.path()).messages
    assert len(messages) == 5
    assert messages[0]["summary"] == "Second summary"


def test_context_first_kept_is_first_entry_keeps_all() -> None:
    s = SessionBuilder()
    u1 = s.user("1")
    s.assistant("a")
    s.compaction("First summary", first_kept=u1)
    s.user("2")
    s.assistant("b")
    assert len(build_context(s.path()).messages) == 5


# -- prepareCompaction --------------------------------------------------------------------------


def test_reasons() -> None:
    assert plan_compaction([], SMALL) == NothingToCompact(reason=NOTHING_TO_COMPACT)
    s, ids = _two_turns()
    s.compaction("sum", first_kept=ids[2])
    assert plan_compaction(s.path(), SMALL) == NothingToCompact(reason=ALREADY_COMPACTED)
    small = SessionBuilder()
    small.user("hi")
    small.assistant("hello")
    assert plan_compaction(small.path(), SMALL) == NothingToCompact(reason=NOTHING_TO_COMPACT)


def test_basic_plan_summarizes_the_old_turn_and_keeps_the_new() -> None:
    s, ids = _two_turns()
    plan = _plan(s.path())
    assert plan.first_kept_entry_id == ids[2]
    assert not plan.is_split_turn
    assert plan.turn_start_entry_id is None
    assert plan.summarize_entry_ids == (ids[0], ids[1])
    assert [m["content"] for m in plan.messages_to_summarize][0] == "a" * 400
    assert plan.turn_prefix_entry_ids == ()
    assert plan.turn_prefix_messages == ()
    assert plan.kept_entry_ids == (ids[2], ids[3])
    assert plan.previous_summary is None
    assert plan.previous_compaction_id is None
    assert plan.keep_recent_tokens == plan.effective_keep_recent_tokens == 150


def test_the_kept_ids_read_like_the_tuple_they_stand_for() -> None:
    """Issue 9: the kept ids are read from the path when asked, not copied at planning."""
    s, ids = _two_turns()
    kept = _plan(s.path()).kept_entry_ids
    assert len(kept) == 2
    assert list(kept) == [ids[2], ids[3]]
    assert (kept[0], kept[-1]) == (ids[2], ids[3])
    assert kept[1:] == (ids[3],)
    assert kept != (ids[2],)
    assert kept != "not a sequence of ids"
    assert hash(kept) == hash((ids[2], ids[3]))
    assert repr(kept).endswith(f"([{ids[2]!r}, {ids[3]!r}])")


def test_split_turn_plan() -> None:
    s = SessionBuilder()
    u1 = s.user("a" * 400)
    a1 = s.assistant("b" * 400)
    u2 = s.user("c" * 400)
    a2 = s.assistant("d" * 400, calls=[("read", {"path": "p.py"})])
    t2 = s.tool_result("e" * 40)
    a3 = s.assistant("f" * 400, calls=[("edit", {"path": "q.py"})])
    t3 = s.tool_result("g" * 40)
    a4 = s.assistant("h" * 400)
    plan = _plan(s.path(), CompactionSettings(keep_recent_tokens=200, adaptive_keep=False))
    assert plan.first_kept_entry_id == a3
    assert plan.is_split_turn
    assert plan.turn_start_entry_id == u2
    assert plan.summarize_entry_ids == (u1, a1)
    assert plan.turn_prefix_entry_ids == (u2, a2, t2)
    assert plan.kept_entry_ids == (a3, t3, a4)
    # File ops come from summarized and prefix messages only, not from kept ones.
    assert plan.read_files == ("p.py",)
    assert plan.modified_files == ()


def test_plan_after_a_previous_compaction_carries_its_summary_and_files() -> None:
    s, ids = _two_turns()
    details = {"readFiles": ["r.py"], "modifiedFiles": ["m.py"]}
    c = s.compaction("old summary", first_kept=ids[2], details=details, preserveData={"k": 1})
    s.user("e" * 400)
    s.assistant("f" * 400, calls=[("read", {"path": "m.py"}), ("read", {"path": "n.py"})])
    s.user("g" * 400)
    s.assistant("h" * 400)
    plan = _plan(s.path())
    # D8: the entries the previous compaction kept are summarized now, not lost.
    assert plan.summarize_entry_ids[:2] == (ids[2], ids[3])
    assert plan.previous_summary == "old summary"
    assert plan.previous_compaction_id == c
    assert plan.previous_preserve_data == {"k": 1}
    assert plan.read_files == ("n.py", "r.py")
    assert plan.modified_files == ("m.py",)
    assert c not in plan.summarize_entry_ids


def test_extension_compaction_details_do_not_seed() -> None:
    s, ids = _two_turns()
    details = {"readFiles": ["r.py"], "modifiedFiles": ["m.py"]}
    s.compaction("ext", first_kept=ids[2], details=details, from_extension=True)
    s.user("e" * 400)
    s.assistant("f" * 400)
    plan = _plan(s.path(), CompactionSettings(keep_recent_tokens=120, adaptive_keep=False))
    assert plan.read_files == ()
    assert plan.modified_files == ()


def test_window_start_when_first_kept_is_missing() -> None:
    s, _ = _two_turns()
    s.compaction("sum", first_kept="nope")
    s.user("x")
    path = s.path()
    assert window_start(path, 4) == 5
    assert window_start(path, -1) == 0


def test_as_json_matches_the_inspection_shape() -> None:
    s, ids = _two_turns()
    assert _plan(s.path()).as_json() == {
        "firstKeptEntryId": ids[2],
        "isSplitTurn": False,
        "turnStartEntryId": None,
        "summarizeEntryIds": [ids[0], ids[1]],
        "turnPrefixEntryIds": [],
        "tokensBefore": 400,
        "previousSummary": None,
        "readFiles": [],
        "modifiedFiles": [],
    }


def test_plan_report_with_and_without_window() -> None:
    s, ids = _two_turns()
    report = plan_report(s.path(), SMALL, None)
    assert report == {
        "leafId": ids[3],
        "keepRecentTokens": 150,
        "effectiveKeepRecentTokens": 150,
        "contextTokens": 400,
        "threshold": None,
        "shouldCompact": None,
        "compaction": _plan(s.path()).as_json(),
        "reason": None,
        "staleUsage": False,
        "estimatedTokens": 400,
        "staleUsageTokens": 0,
    }
    windowed = plan_report(s.path(), CompactionSettings(reserve_tokens=100), 450)
    assert windowed["threshold"] == 350
    assert windowed["shouldCompact"] is True
    assert windowed["compaction"] is None
    assert windowed["reason"] == NOTHING_TO_COMPACT
    empty = plan_report([], SMALL, 100_000)
    assert empty["leafId"] is None
    assert empty["contextTokens"] == 0
    assert empty["shouldCompact"] is False


def test_kept_context_after_applying_the_plan() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400, calls=[("bash", {"command": "x"})])
    s.tool_result("c" * 400)
    s.assistant("d" * 400)
    s.user("e" * 400)
    s.assistant("f" * 400)
    plan = _plan(s.path(), CompactionSettings(keep_recent_tokens=250, adaptive_keep=False))
    s.compaction("new", first_kept=plan.first_kept_entry_id)
    context = build_context(s.path())
    assert context.entry_ids[1:] == plan.kept_entry_ids


def test_a_given_context_gives_the_same_plan_as_a_rebuilt_one() -> None:
    from orchestrator._core.compaction_plan import plan_compaction as plan
    from orchestrator._core.context import build_context
    from orchestrator._core.tokens import CompactionSettings as Settings
    from tests.sessions import SessionBuilder as Builder
    from tests.sessions import usage as used

    s = Builder()
    for n in range(6):
        s.user(f"request {n} " + "x" * 300)
        s.assistant(f"answer {n} " + "y" * 300, usage=used(1000 + n))
    path = s.path()
    settings = Settings(keep_recent_tokens=200)
    assert plan(path, settings, context=build_context(path)) == plan(path, settings)
