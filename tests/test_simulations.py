"""Shipped simulation scenarios.

Reruns match the recorded traces, which replay through the tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.machine import load_machine, step
from orchestrator._sim.scenario import load_scenario
from orchestrator._sim.simulate import simulate
from orchestrator._telemetry.export import read_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"
SCENARIOS = sorted((TRACES / "scenarios").glob("*.toml"))


def transitions(path: Path) -> list[dict[str, Any]]:
    out = []
    for span in read_trace(path):
        for event in span["events"]:
            if event["name"] == "transition":
                out.append(event["attributes"])
    return out


def test_every_scenario_has_a_recorded_trace_and_back() -> None:
    assert {p.stem for p in SCENARIOS} == {p.stem for p in TRACES.glob("*.jsonl")}
    assert len(SCENARIOS) >= 12


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_rerun_produces_the_recorded_transitions(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / f"{scenario.stem}.jsonl"
    simulate(scenario, out)
    recorded = transitions(TRACES / f"{scenario.stem}.jsonl")
    assert recorded, "a recorded trace without transitions proves nothing"
    assert transitions(out) == recorded


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_recorded_trace_replays_through_the_tables(scenario: Path) -> None:
    for t in transitions(TRACES / f"{scenario.stem}.jsonl"):
        defn = load_machine(t["machine"])
        if "facts" in t:
            taken = step(defn, t["from"], t["trigger"], defn.guards.facts(**json.loads(t["facts"])))
            assert taken.dest == t["to"], t
            assert list(taken.effects) == list(t["effects"]), t
        else:  # a settlement on reopen: the table must list that move
            assert any(r.dest == t["to"] for r in defn.rows_for(t["from"], t["trigger"])), t


def story(name: str) -> list[tuple[str, str, str]]:
    return [(t["from"], t["trigger"], t["to"]) for t in transitions(TRACES / f"{name}.jsonl")]


def test_threshold_story_prunes_compacts_and_continues() -> None:
    moves = story("threshold")
    assert ("running", "agent_done", "pruning") in moves
    assert ("pruning", "pruned", "compacting") in moves
    assert ("compacting", "compaction_done", "continuing") in moves
    assert ("continuing", "resume", "running") in moves


def test_failure_stories() -> None:
    assert ("running", "overflow", "idle") in story("overflow-twice")
    assert ("running", "reply_truncated", "compacting") in story("length-stop")
    assert ("retrying", "abort", "idle") in story("abort-retry-wait")
    assert ("summarizing", "attempt_failed", "waiting_retry") in story("candidates-fail")
    assert ("summarizing", "attempt_failed", "failed") in story("candidates-fail")
    assert ("summarizing", "attempt_failed", "summarizing") in story("candidate-switch")
    assert ("summarizing", "cancel", "cancelled") in story("abort-summary")
    assert ("consulting_hooks", "hooks_cancelled", "cancelled") in story("hooks-cancel")
    assert ("consulting_hooks", "hook_supplied", "checking_hook") in story("hooks-replace")
    assert ("checking_hook", "summary_passed", "committing") in story("hooks-replace")
    assert ("committing", "reopened", "failed") in story("crash")


def test_crash_scenario_kills_the_child_and_settles(tmp_path: Path) -> None:
    report = simulate(TRACES / "scenarios" / "crash.toml", tmp_path / "crash.jsonl")
    assert report.crashed is True
    assert report.outcomes[0].endswith("committing -> failed")
    assert "compaction" not in report.entries


def test_bad_scenarios_fail_at_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    for text, message in [
        ("[scenario]\n", "needs a name"),
        ('[scenario]\nname="x"\n[oops]\n', "unknown top-level keys"),
        ('[scenario]\nname="x"\n[[actions]]\ndo="dance"\n', "'do' must be one of"),
        ('[scenario]\nname="x"\n[settings]\nspeed=1\n', "unknown settings"),
        ('[scenario]\nname="x"\n[hooks]\nsession_before_compact="maybe"\n', "behaviour"),
        ('[scenario]\nname="x"\n[crash]\nmachine="turn"\n', "needs machine and to"),
        ("not toml [", "cannot read scenario"),
        (
            '[scenario]\nname="x"\n[summarizer]\n'
            'primary=[{text="ok"}, {error="503", kind="flaky"}]\n',
            "summarizer primary answer 2: unknown model error kind 'flaky'; the kinds are ",
        ),
    ]:
        bad.write_text(text)
        with pytest.raises(DefinitionError, match=message):
            load_scenario(bad)
