"""Our inspection output against pi's own, on session files pi wrote (tests/data/pi).

The expected files were recorded from pi itself (``tests/conformance/pi_reference.mjs record``,
pi version pinned in ``tests/conformance/package.json``), so this runs without node. Every run is
either identical to pi's answer, or differs in exactly the way a decision (docs/decisions.md)
says, and the test for that run names the decision. Re-checking the
recorded answers against a live pi is the opt-in ``tests/conformance/test_pi_conformance.py``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest

from orchestrator._store.session import Session
from tests.conformance.pi_cases import (
    DATA,
    Run,
    expected,
    ours,
    pinned_pi,
    run,
    runs,
)

NOTHING = "Nothing to compact (session too small)"

# Runs whose difference from pi is decided; every other recorded run must match pi exactly.
D7_ADAPTIVE = {
    "plain:planAdaptive",
    "plain:planKeep150Adaptive",
    "huge-trailing:planKeep20000Adaptive",
}
# D10: the cut pulled back over entries that give no message (metadata, an edit, an omitted
# entry) in front of a turn's start.
D10_METADATA = {
    "labels:planKeep150",
    "model-thinking:planKeep80",
    "context-edits:planKeep150",
    "context-edits:planMainKeep400",
}
# Decisions pi 1.x now makes the same way (docs/decisions.md): these runs must equal pi's.
PI_NOW_D9 = {"huge-trailing:planDefault", "huge-trailing:planKeep5000"}
PI_NOW_D12 = {
    "plain:planDefault",
    "tools:planDefault",
    "compaction:planDefault",
    "two-compactions:planDefault",
    "branch:planDefault",
    "labels:planDefault",
    "model-thinking:planDefault",
    "custom:planDefault",
    "split-turn:planDefault",
    "v1:planDefault",
    "non-bmp:planDefault",
}
PI_NOW_D26 = {"non-bmp:serializeBeforeCompaction"}
# Not decided: pi omits `details` of a custom_message entry that has none; we print null.
UNDECIDED_DETAILS = {"custom:context"}
DECIDED = D7_ADAPTIVE | D10_METADATA

ALL_RUNS = runs()


def _ids(selected: set[str]) -> list[Run]:
    chosen = [r for r in ALL_RUNS if r.id in selected]
    assert {r.id for r in chosen} == selected, "a listed run is missing from cases.json"
    return chosen


def _entries(fixture: str) -> list[dict[str, Any]]:
    lines = (DATA / f"{fixture}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[1:]]


# -- the recorded answers ------------------------------------------------------------------------


def test_recorded_from_the_pinned_pi_version() -> None:
    _, version = pinned_pi()
    for fixture in json.loads((DATA / "cases.json").read_text(encoding="utf-8"))["fixtures"]:
        assert expected(fixture)["piVersion"] == version


def test_every_run_is_either_identical_or_decided() -> None:
    listed = DECIDED | UNDECIDED_DETAILS
    assert listed <= {r.id for r in ALL_RUNS}
    assert len(ALL_RUNS) > 60


@pytest.mark.parametrize(
    "case", [r for r in ALL_RUNS if r.id not in DECIDED | UNDECIDED_DETAILS], ids=lambda r: r.id
)
def test_same_as_pi(case: Run) -> None:
    assert ours(case) == case.expected


def test_same_as_pi_apart_from_custom_details() -> None:
    for case in _ids(UNDECIDED_DETAILS):
        assert ours(case) == case.expected


def test_custom_message_without_details_omits_the_key() -> None:
    case = run("custom", "context")
    reminder = [m for m in ours(case)["messages"] if m.get("customType") == "hidden-note"]
    assert reminder
    assert "details" not in reminder[0]


# -- decided differences -------------------------------------------------------------------------


@pytest.mark.parametrize("case", _ids(PI_NOW_D12), ids=lambda r: r.id)
def test_d12_nothing_to_compact_pi_too(case: Run) -> None:
    """D12: nothing to summarize means no compaction and no model call; pi 1.x agrees now
    (pi 0.73 prepared an empty one, and would have called the model)."""
    assert case.expected["compaction"] is None
    assert case.expected["reason"] == NOTHING
    report = ours(case)
    assert (report["compaction"], report["reason"]) == (None, NOTHING)


@pytest.mark.parametrize("case", _ids(D7_ADAPTIVE), ids=lambda r: r.id)
def test_d7_keep_adapts_to_the_measured_ratio(case: Run) -> None:
    """D7: pi keeps `keepRecentTokens` as configured; we divide it by usage/estimate (> 1)."""
    report = ours(case)
    configured = case.expected["keepRecentTokens"]
    assert case.expected["effectiveKeepRecentTokens"] == configured
    assert report["keepRecentTokens"] == configured
    assert 1 <= report["effectiveKeepRecentTokens"] < configured
    fixed = ours(case, (*case.argv, "--no-adaptive-keep"))
    assert fixed["effectiveKeepRecentTokens"] == configured
    # Without adaptation we are pi again, up to the other decisions on the same run.
    assert fixed == case.expected


def test_d7_ratio_is_the_last_usage_over_the_estimate_it_measured() -> None:
    case = run("plain", "planKeep150Adaptive")
    context = ours(run("plain", "context"))
    index = context["tokens"]["lastUsageIndex"]
    ratio = context["tokens"]["usageTokens"] / sum(context["messageTokens"][:index])
    assert ours(case)["effectiveKeepRecentTokens"] == max(1, math.floor(150 / ratio))


@pytest.mark.parametrize("case", _ids(PI_NOW_D9), ids=lambda r: r.id)
def test_d9_huge_trailing_tool_results_still_compact(case: Run) -> None:
    """D9 (pi#7201): the budget runs out inside the trailing tool results; the cut keeps the
    assistant that made the calls rather than everything. pi 1.x does the same now."""
    entries = _entries("huge-trailing")
    caller = next(e for e in reversed(entries) if e["message"]["role"] == "assistant")
    request = next(e for e in reversed(entries) if e["message"]["role"] == "user")
    plan = ours(case)["compaction"]
    assert plan == case.expected["compaction"]
    assert plan["firstKeptEntryId"] == caller["id"]
    assert plan["isSplitTurn"]
    assert plan["turnStartEntryId"] == request["id"]
    assert plan["turnPrefixEntryIds"] == [request["id"]]
    assert plan["summarizeEntryIds"] == [e["id"] for e in entries[: entries.index(request)]]


@pytest.mark.parametrize("case", _ids(D10_METADATA), ids=lambda r: r.id)
def test_d10_metadata_before_a_user_message_is_no_split_turn(case: Run) -> None:
    """D10: pi judges the pulled-in metadata entry, not the user message after it."""
    entries = {e["id"]: e for e in _entries(case.fixture)}
    pi_plan = case.expected["compaction"]
    first = entries[pi_plan["firstKeptEntryId"]]
    edited = {e["targetId"] for e in entries.values() if e["type"] == "context_edit"}
    assert first["type"] in ("label", "model_change", "thinking_level_change", "context_edit") or (
        first["id"] in edited  # omitted by an edit: it gives no message either
    )
    assert pi_plan["isSplitTurn"]
    assert pi_plan["turnPrefixEntryIds"]
    plan = ours(case)["compaction"]
    assert plan["firstKeptEntryId"] == pi_plan["firstKeptEntryId"]
    assert not plan["isSplitTurn"]
    assert plan["turnStartEntryId"] is None
    assert plan["turnPrefixEntryIds"] == []
    # pi's "turn prefix" is the previous, complete turn: we summarize it with the history.
    assert plan["summarizeEntryIds"] == pi_plan["summarizeEntryIds"] + pi_plan["turnPrefixEntryIds"]
    same = ("tokensBefore", "previousSummary", "readFiles", "modifiedFiles")
    assert {k: plan[k] for k in same} == {k: pi_plan[k] for k in same}


def _legacy(fixture: str, name: str) -> dict[str, Any]:
    data = json.loads((DATA / f"{fixture}.pi-0.58.3.expected.json").read_text(encoding="utf-8"))
    assert data["piVersion"] == "0.58.3"
    result: dict[str, Any] = data["runs"][name]
    return result


@pytest.mark.parametrize(
    ("fixture", "name"),
    [
        ("two-compactions", "planKeep50"),
        ("two-compactions", "planKeep200"),
        ("compaction", "planKeep100"),
        ("compaction", "planKeep250"),
        ("split-after-compaction", "planKeep200"),
        ("split-after-compaction", "planKeep500"),
    ],
)
def test_d8_kept_entries_stay_in_the_next_window(fixture: str, name: str) -> None:
    """D8 (pi#2608): pi 0.58.3, the snapshot the reference describes, starts the next window
    after the previous compaction, so the entries it had kept are neither summarized nor kept.
    Current pi (the pinned version) fixed it the same way: there we match it exactly."""
    case = run(fixture, name)
    plan = ours(case)["compaction"]
    assert plan == case.expected["compaction"]
    entries = _entries(fixture)
    compaction = next(e for e in reversed(entries) if e["type"] == "compaction")
    first_kept = next(i for i, e in enumerate(entries) if e["id"] == compaction["firstKeptEntryId"])
    kept_before = {e["id"] for e in entries[first_kept : entries.index(compaction)]}
    covered = set(plan["summarizeEntryIds"]) | set(plan["turnPrefixEntryIds"])
    old = _legacy(fixture, name)["compaction"]
    old_covered = set(old["summarizeEntryIds"]) | set(old["turnPrefixEntryIds"])
    # The kept region produces messages, and the old pi loses them while we do not.
    assert kept_before
    assert kept_before <= covered | {plan["firstKeptEntryId"]}
    assert not kept_before & old_covered


def test_d11_split_turn_right_after_a_compaction_keeps_the_previous_summary() -> None:
    """D11 is about the summary text; the plan is pi's: a split turn with nothing else to
    summarize, where pi's compact() would write "No prior history." and drop the summary."""
    case = run("split-after-compaction", "planKeep200")
    plan = ours(case)["compaction"]
    assert plan == case.expected["compaction"]
    assert plan["isSplitTurn"]
    assert plan["summarizeEntryIds"] == []
    assert plan["previousSummary"] == "summary before the long turn"


def test_d6_custom_messages_are_counted_like_pi() -> None:
    """D6: custom messages count chars/4 (pi), not 0 (OMP)."""
    case = run("custom", "context")
    report = ours(case)
    custom = [i for i, m in enumerate(report["messages"]) if m["role"] == "custom"]
    assert len(custom) == 4
    assert all(report["messageTokens"][i] > 0 for i in custom)
    assert report["messageTokens"] == case.expected["messageTokens"]


def test_d26_the_non_bmp_fixture_needs_utf16_counts() -> None:
    """D26: pi wrote astral characters and lone surrogates; its estimates count UTF-16 units,
    which is why every run on this fixture except the decided ones equals pi only with D26."""
    raw = (DATA / "non-bmp.jsonl").read_text(encoding="utf-8")
    assert "\\ud83d" in raw  # a lone high surrogate, escaped by pi's JSON.stringify
    assert "\\ude00" in raw  # a lone low one
    text = json.dumps(_entries("non-bmp"), ensure_ascii=False)
    assert sum(1 for c in text if ord(c) > 0xFFFF) > 1000
    case = run("non-bmp", "context")
    pi_tokens = case.expected["messageTokens"]
    code_points = [
        math.ceil(len(m.get("content") or m.get("summary") or "") / 4)
        for m in case.expected["messages"]
        if isinstance(m.get("content") or m.get("summary"), str)
    ]
    assert code_points  # string-content messages exist, and pi's counts are not code points:
    strings = [
        t
        for t, m in zip(pi_tokens, case.expected["messages"], strict=True)
        if isinstance(m.get("content") or m.get("summary"), str)
    ]
    assert all(p > c for p, c in zip(strings, code_points, strict=True))
    assert ours(case) == case.expected


@pytest.mark.parametrize("case", _ids(PI_NOW_D26), ids=lambda r: r.id)
def test_d26_a_tool_result_cut_through_a_pair_moves_one_unit_earlier(case: Run) -> None:
    """D26: a tool result cut at 2000 UTF-16 units that would split a pair moves one unit
    earlier, so no half pair is written; pi 1.x does the same now (its marker counts 2000 off
    the length, and so does ours)."""
    mine = ours(case)["text"]
    assert mine == case.expected["text"]
    assert re.search(r"[\ud800-\udbff]\n\n\[\.\.\. \d+ more characters truncated\]", mine) is None
    # What is left of half pairs is only the lone low surrogate the user typed.
    assert [c for c in mine if 0xD800 <= ord(c) <= 0xDFFF] == ["\ude00"]


def test_d17_branch_summaries_pi_wrote_are_read_verbatim() -> None:
    """D17 changes what we write (fromId = the abandoned leaf); files pi wrote carry its quirk
    (fromId = where the summary is attached) and the context shows them as pi does."""
    entries = _entries("branch")
    summaries = [e for e in entries if e["type"] == "branch_summary"]
    assert summaries
    assert all(e["fromId"] == e["parentId"] for e in summaries)
    report = ours(run("branch", "context"))
    shown = [m for m in report["messages"] if m["role"] == "branchSummary"]
    assert [m["fromId"] for m in shown] == [s["fromId"] for s in summaries]
    assert shown == [
        m for m in run("branch", "context").expected["messages"] if m["role"] == "branchSummary"
    ]


# -- pi's large v1 session test ---------------------------------------------------------


def test_large_v1_session_like_pi_test_suite() -> None:
    """pi's "large fixture" test: migrated, >100 entries, cut on user/assistant, context
    >100 messages, model known; pi's answers and ours agree."""
    path = DATA / "large-v1.jsonl"
    assert "version" not in json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    session = Session.open(path)
    try:
        assert session.header["version"] == 3
        assert len(session.tree) > 100
        ids = [e["id"] for e in session.tree.entries]
        assert all(len(i) == 8 and int(i, 16) >= 0 for i in ids)
        assert len(set(ids)) == len(ids)
        parents = [e["parentId"] for e in session.tree.entries]
        assert parents == [None, *ids[:-1]]
        for name in ("planDefault", "planKeep5000"):
            case = run("large-v1", name)
            plan = ours(case)["compaction"]
            assert plan == case.expected["compaction"]
            first = session.tree.entries[int(plan["firstKeptEntryId"][1:])]
            assert first["type"] == "message"
            assert first["message"]["role"] in ("user", "assistant")
        context = ours(run("large-v1", "context"))
        assert len(context["messages"]) > 100
        assert context["model"] == {"provider": "anthropic", "modelId": "claude-sonnet-4-5"}
        assert context == run("large-v1", "context").expected
    finally:
        session.close()


# -- the classifier the opt-in sweep uses ----------------------------------------------------------


def _path(case: Run) -> list[dict[str, Any]]:
    session = Session.open(case.path)
    try:
        return session.path(ours(case)["leafId"])
    finally:
        session.close()


def test_sweep_classifier_names_the_decision() -> None:
    from tests.conformance.pi_cases import explain_plan_difference

    for case in _ids(D10_METADATA):
        assert explain_plan_difference(case.expected, ours(case), _path(case)) == "D10"


def test_sweep_classifier_explains_nothing_else() -> None:
    from tests.conformance.pi_cases import explain_plan_difference

    for name in ("labels:planKeep150", "context-edits:planMainKeep400"):
        case = next(r for r in ALL_RUNS if r.id == name)
        mine = ours(case)
        path = _path(case)
        assert explain_plan_difference(case.expected, mine, path) is not None
        mutations = [
            ("tokensBefore", -1),
            ("firstKeptEntryId", "x"),
            ("previousSummary", "x"),
            ("readFiles", ["x"]),
        ]
        for key, value in mutations:
            changed = {**mine, "compaction": {**mine["compaction"], key: value}}
            assert explain_plan_difference(case.expected, changed, path) is None
        assert explain_plan_difference(case.expected, {**mine, "contextTokens": -1}, path) is None


# -- files pi 0.73.1 wrote ---------------------------------------------------------------------

OLD_PI = sorted(p.name.split(".")[0] for p in DATA.glob("*.pi-0.73.1.expected.json"))


@pytest.mark.parametrize("fixture", OLD_PI)
def test_files_pi_0_73_wrote_read_as_before(fixture: str) -> None:
    """The messages, model and thinking level of every context pi 0.73.1 recorded are still
    ours: what pi 1.x changed is how tokens are counted, not what a 0.73 file says."""
    old = json.loads((DATA / f"{fixture}.pi-0.73.1.expected.json").read_text(encoding="utf-8"))
    assert old["piVersion"] == "0.73.1"
    contexts = [r for r in ALL_RUNS if r.fixture == fixture and r.argv[0] == "context"]
    assert contexts
    for case in contexts:
        then, now = old["runs"][case.name], ours(case)
        same = ("leafId", "messages", "thinkingLevel", "model")
        assert {k: now[k] for k in same} == {k: then[k] for k in same}
