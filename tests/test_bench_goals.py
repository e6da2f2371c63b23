"""The goals runner's pure parts (tests/bench/goals.py, bench_goals.py): no benchmark runs here.

Issue 37's table as goals at the chosen sizes, the scripts' numbers turned into each goal's
measure, met or not per round (by the goal's own measure and by CPU time), the text and JSON
reports, the header's facts from replaceable probes, and the command line.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.bench import bench_goals
from tests.bench.goals import (
    GROUPS,
    Goal,
    Header,
    Measured,
    Probes,
    Settings,
    as_json,
    cell,
    from_big,
    from_compaction,
    from_concurrent,
    from_vs_pi,
    gather_header,
    goals,
    judge,
    processor,
    real_probes,
    render,
    settings_line,
    summary,
    verdicts,
)

ROOT = Path(__file__).resolve().parent.parent

VS_PI_ROW = {
    "n": 10_000.0,
    "plan_ours": 0.3,
    "plan_pi": 0.5,
    "plan_ours_cpu": 0.2,
    "plan_pi_cpu": 0.5,
    "plan_ours_rss": 50.0,
    "plan_pi_rss": 125.0,
    "context_ours": 0.4,
    "context_pi": 0.5,
    "context_ours_cpu": 0.3,
    "context_pi_cpu": 0.6,
    "context_ours_rss": 60.0,
    "context_pi_rss": 100.0,
}


def test_the_default_goals_are_issue_37s_table() -> None:
    table = goals(Settings())
    limits = {goal.key: goal.limit for goal in table}
    for n in (10_000, 40_000, 60_000):
        assert limits[f"plan/{n}"] == 0.5
        assert limits[f"context/{n}"] == 0.7
        assert limits[f"plan-rss/{n}"] == limits[f"context-rss/{n}"] == 0.5
    assert limits["check/200000"] == limits["plan/200000"] == 1.0
    assert limits["check-rss/200000"] == limits["plan-rss/200000"] == 300
    assert limits["compaction-plain/10000"] == limits["compaction-split/10000"] == 4.0
    assert limits["concurrent-runtime/1000"] == 1.8
    assert limits["concurrent-server/1000"] == 2.2
    assert len(table) == len(limits) == 3 * 4 + 4 + 2 + 2
    assert [goal.group for goal in table] == sorted(
        (goal.group for goal in table), key=GROUPS.index
    )


def test_only_some_groups_and_other_sizes() -> None:
    settings = Settings(sizes=(2_500,), compaction=1_000)
    table = goals(settings, ("compaction", "vs-pi"))
    assert [goal.key for goal in table] == [
        "plan/2500",
        "context/2500",
        "plan-rss/2500",
        "context-rss/2500",
        "compaction-plain/1000",
        "compaction-split/1000",
    ]
    assert "2500 entries" in table[0].what
    assert "1k entries" in table[-1].what


def _rounded(measured: dict[str, Measured]) -> dict[str, tuple[float, float | None]]:
    return {
        key: (round(m.value, 9), None if m.cpu is None else round(m.cpu, 9))
        for key, m in measured.items()
    }


def test_vs_pi_row_gives_ratios_of_ours_to_pis() -> None:
    assert _rounded(from_vs_pi(VS_PI_ROW)) == {
        "plan/10000": (0.6, 0.4),
        "context/10000": (0.8, 0.5),
        "plan-rss/10000": (0.4, None),
        "context-rss/10000": (0.6, None),
    }


def test_big_runs_give_medians_and_leave_a_base_out() -> None:
    runs = [(0.9, 120.0, 0.8), (1.3, 140.0, 1.1), (1.0, 100.0, 0.7)]
    results = {
        ("check", None): runs,
        ("plan", None): runs[:2],
        ("check", "/base"): [(9.0, 900.0, 9.0)],
    }
    assert _rounded(from_big(200_000, results)) == {
        "check/200000": (1.0, 0.8),
        "check-rss/200000": (120.0, None),
        "plan/200000": (1.1, 0.95),
        "plan-rss/200000": (130.0, None),
    }


def test_compaction_row_gives_total_minus_latency_in_ms() -> None:
    row = {"n": 10_000, "kind": "split", "total": 0.2035, "cpu": 0.0042}
    assert _rounded(from_compaction(row, latency=0.2)) == {"compaction-split/10000": (3.5, 4.2)}


class _State:
    """Stands for bench_concurrent's OperationState keys: an enum member with a value."""

    value = "committed"


def test_concurrent_rows_give_wall_and_cpu_when_every_compaction_committed() -> None:
    rows = [
        {"path": "runtime", "wall_s": 1.7, "cpu_s": 1.6, "results": {_State(): 1000}},
        {"path": "server", "wall_s": 2.3, "cpu_s": 1.9, "results": {"committed": 1000}},
    ]
    assert from_concurrent(1000, rows) == {
        "concurrent-runtime/1000": Measured(value=1.7, cpu=1.6),
        "concurrent-server/1000": Measured(value=2.3, cpu=1.9),
    }


def test_a_concurrent_path_whose_compactions_did_not_all_commit_is_no_measure() -> None:
    rows = [{"path": "server", "wall_s": 0.1, "cpu_s": 0.1, "results": {"not compacted": 20}}]
    with pytest.raises(ValueError, match="server: not every compaction committed"):
        from_concurrent(20, rows)


def _goal(**changes: object) -> Goal:
    fields: dict[str, object] = {"key": "g", "group": "big", "what": "check", "limit": 1.0}
    return Goal(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_goal_is_met_at_or_below_its_limit_by_each_judged_figure() -> None:
    goal = _goal(unit=" s")
    at = judge(goal, Measured(value=1.0, cpu=1.01))
    assert (at.met, at.met_cpu) == (True, False)
    over = judge(goal, Measured(value=1.2, cpu=0.9))
    assert (over.met, over.met_cpu) == (False, True)
    no_cpu = judge(goal, Measured(value=0.5))
    assert (no_cpu.met, no_cpu.met_cpu) == (True, None)
    not_judged = judge(_goal(cpu_judged=False), Measured(value=0.5, cpu=9.0))
    assert (not_judged.met, not_judged.met_cpu) == (True, None)
    missing = judge(goal, None)
    assert (missing.measured, missing.met, missing.met_cpu) == (None, False, None)


def test_cells_say_the_measure_the_cpu_figure_and_each_verdict() -> None:
    goal = _goal(unit=" ms", digits=1, limit=4.0)
    assert cell(goal, judge(goal, Measured(value=3.96, cpu=5.5))) == (
        "4.0 ms met; CPU 5.5 ms NOT met"
    )
    shown = _goal(unit=" s", cpu_judged=False)
    assert cell(shown, judge(shown, Measured(value=1.5, cpu=2.0))) == "1.50 s NOT met; CPU 2.00 s"
    assert cell(goal, judge(goal, None)) == "not measured"


def _header(**changes: object) -> Header:
    fields: dict[str, object] = {
        "commit": "abc1234",
        "dirty": False,
        "processor": "Intel Xeon",
        "date": "2026-12-07 21:00:00 UTC",
        "python": "3.11.7",
        "node": "v22.23.5",
        "pi": "1.6.0",
        "load_before": (0.5, 0.4, 0.3),
        "load_after": (1.0, 0.6, 0.4),
        "rounds": 2,
        "groups": GROUPS,
        "settings": Settings(),
    }
    return Header(**{**fields, **changes})  # type: ignore[arg-type]


def _two_rounds() -> tuple[list[Goal], list[dict[str, Measured]]]:
    table = goals(Settings(sizes=(10_000,)), ("vs-pi", "concurrent"))
    first = from_vs_pi(VS_PI_ROW) | {
        "concurrent-runtime/1000": Measured(value=1.7, cpu=1.9),
        "concurrent-server/1000": Measured(value=2.1, cpu=1.8),
    }
    second = {
        **from_vs_pi({**VS_PI_ROW, "plan_ours": 0.2, "plan_ours_cpu": 0.1}),
        "concurrent-runtime/1000": Measured(value=1.9, cpu=1.9),
    }
    return table, [first, second]


def test_the_table_has_the_header_a_line_per_goal_and_a_column_per_round() -> None:
    table, rounds = _two_rounds()
    judged = verdicts(table, rounds)
    text = render(_header(dirty=True), table, judged, ["round 2, concurrent: ValueError: x"])
    lines = text.splitlines()
    assert lines[0] == "Issue 37's goals, 2 rounds, started 2026-12-07 21:00:00 UTC"
    assert lines[1] == "commit abc1234 (tracked files changed since); processor Intel Xeon"
    assert lines[2] == "Python 3.11.7, node v22.23.5, pi 1.6.0"
    assert "before 0.50 / 0.40 / 0.30, after 1.00 / 0.60 / 0.40" in lines[3]
    assert lines[4].startswith("sizes: vs pi 10000, 40000, 60000;")
    assert lines[6].split() == ["goal", "limit", "round", "1", "round", "2"]
    plan = next(line for line in lines if line.startswith("plan --json / pi"))
    assert "<= 0.5" in plan
    assert "0.60 NOT met; CPU 0.40 met" in plan
    assert "0.40 met; CPU 0.20 met" in plan
    server = next(line for line in lines if "through the server" in line)
    assert re.search(r"<= 2.2 s  2.10 s met; CPU 1.80 s +not measured$", server)
    assert lines[-2].startswith("Met in every round: 1 of 6 goals; by CPU time, 2 of 2 judged")
    assert lines[-1] == "error: round 2, concurrent: ValueError: x"


def test_the_summary_counts_goals_met_in_every_round() -> None:
    table, rounds = _two_rounds()
    text = summary(table, verdicts(table, rounds))
    # Met in both rounds: only the plan's RSS (0.4). The context's RSS is 0.6, its ratio 0.8; the
    # plan's ratio 0.6 then 0.4; the runtime 1.7 then 1.9; the server once. By CPU time the plan
    # (0.4, 0.2) and the context (0.5, 0.5) are met in both; RSS has no CPU figure.
    assert text.startswith("Met in every round: 1 of 6 goals")
    assert "by CPU time, 2 of 2 judged by it" in text
    assert "concurrent goals' CPU time" in text
    only_pi = [goal for goal in table if goal.group == "vs-pi"]
    assert "concurrent" not in summary(only_pi, verdicts(only_pi, rounds))


def test_json_says_the_same_as_the_table() -> None:
    table, rounds = _two_rounds()
    data = json.loads(json.dumps(as_json(_header(), table, verdicts(table, rounds), [])))
    assert data["header"]["commit"] == "abc1234"
    assert data["header"]["settings"]["sizes"] == [10_000, 40_000, 60_000]
    by_key = {goal["key"]: goal for goal in data["goals"]}
    plan = by_key["plan/10000"]
    assert plan["limit"] == 0.5
    assert [r["met"] for r in plan["rounds"]] == [False, True]
    assert plan["rounds"][1]["cpu"] == pytest.approx(0.2)
    assert plan["met_every_round"] is False
    assert by_key["plan-rss/10000"]["met_every_round"] is True
    assert by_key["concurrent-server/1000"]["rounds"][1] is None
    assert data["summary"] == summary(table, verdicts(table, rounds))
    assert data["errors"] == []


def test_settings_other_than_the_issues_are_flagged() -> None:
    assert settings_line(Settings(runs=3), GROUPS) == (
        "sizes: vs pi 10000, 40000, 60000; big 200000; one compaction 10000, L = 0.2 s; "
        "1000 sessions of 300 entries, L = 1 s; runs per round: 3"
    )
    # Some of the issue's vs-pi sizes are the issue's goals at those sizes.
    assert settings_line(Settings(sizes=(10_000,)), ["vs-pi"]) == (
        "sizes: vs pi 10000; runs per round: the scripts' own"
    )
    for changed, group in [
        (Settings(sizes=(2_000, 10_000)), "vs-pi"),
        (Settings(big=20_000), "big"),
        (Settings(compaction=1_000), "compaction"),
        (Settings(latency=0.5), "compaction"),
        (Settings(sessions=50), "concurrent"),
        (Settings(entries=100), "concurrent"),
    ]:
        assert settings_line(changed, [group]).startswith("sizes (NOT issue 37's): ")
        others = [other for other in GROUPS if other != group]
        assert settings_line(changed, others).startswith("sizes: ")


def test_the_processor_comes_from_cpuinfo_or_lscpu() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    assert processor(cpuinfo) == "AMD EPYC"
    lscpu = "Architecture:   x86_64\nModel name:     Intel(R) Xeon(R) Platinum 8375C CPU\n"
    assert processor(lscpu) == "Intel(R) Xeon(R) Platinum 8375C CPU"
    assert processor("model name\t:\nflags\t: fpu\n") is None


def _probes(
    outputs: dict[str, str], cpuinfo: str = "", versions: tuple[str, str] | None = None
) -> Probes:
    def run(argv: Sequence[str]) -> str:
        key = " ".join(argv)
        if key not in outputs:
            raise subprocess.CalledProcessError(1, list(argv))
        return outputs[key]

    def nodes() -> tuple[str, str]:
        if versions is None:
            raise FileNotFoundError("node")
        return versions

    def read() -> str:
        if not cpuinfo:
            raise FileNotFoundError("/proc/cpuinfo")
        return cpuinfo

    return Probes(
        run=run,
        cpuinfo=read,
        now=lambda: datetime(2026, 12, 7, 23, 30, 5, tzinfo=timezone(timedelta(hours=2))),
        load=lambda: (0.25, 0.5, 0.75),
        versions=nodes,
    )


def test_the_header_from_probes() -> None:
    probes = _probes(
        {
            "git rev-parse --short HEAD": "1d4d78d\n",
            "git status --porcelain --untracked-files=no": " M tests/bench/goals.py\n",
        },
        cpuinfo="model name\t: AMD EPYC\n",
        versions=("v22.23.5", "1.6.0"),
    )
    header = gather_header(probes, 2, Settings())
    assert (header.commit, header.dirty, header.processor) == ("1d4d78d", True, "AMD EPYC")
    assert header.date == "2026-12-07 21:30:05 UTC"
    assert (header.node, header.pi) == ("v22.23.5", "1.6.0")
    assert header.load_before == (0.25, 0.5, 0.75)
    assert header.load_after is None
    assert header.groups == GROUPS
    assert header.python.count(".") == 2


def test_the_header_says_what_it_could_not_find() -> None:
    lscpu = "Model name: Intel Xeon\n"
    header = gather_header(_probes({"lscpu": lscpu}), 1, Settings(), ["big"])
    assert header.groups == ("big",)
    assert (header.commit, header.dirty, header.processor) == ("unknown", False, "Intel Xeon")
    assert header.node.startswith("absent")
    assert gather_header(_probes({}), 1, Settings()).processor == "unknown"


def test_the_real_probes_read_this_checkout() -> None:
    probes = real_probes(ROOT, versions=lambda: ("v0", "0"))
    before = datetime.now(UTC).replace(microsecond=0)
    header = gather_header(probes, 1, Settings())
    after = datetime.now(UTC)
    expected = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    assert header.commit == (expected.stdout.strip() or "unknown")
    assert header.processor == processor(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    taken = datetime.strptime(header.date, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
    assert before <= taken <= after
    assert (header.node, header.pi) == ("v0", "0")


def test_the_command_line() -> None:
    args = bench_goals.options().parse_args(
        ["--only", "concurrent,vs-pi", "--sizes", "10000,40000", "--sessions", "200"]
    )
    assert args.only == ("vs-pi", "concurrent")  # in the rounds' order
    settings = bench_goals.settings_of(args)
    assert settings.sizes == (10_000, 40_000)
    assert (settings.sessions, settings.big, settings.runs) == (200, 200_000, None)
    assert args.rounds == 2
    assert bench_goals.options().parse_args([]).only == GROUPS


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--only", "vs-pi,speed"], "unknown goal group speed"),
        (["--sizes", "10000,ten"], "at least 1, got 'ten'"),
        (["--rounds", "0"], "at least 1, got '0'"),
    ],
)
def test_bad_options_say_what_is_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench_goals.options().parse_args(argv)
    assert says in capsys.readouterr().err


def test_rounds_run_every_group_and_a_failure_is_reported_not_fatal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[str] = []

    def measure(group: str, settings: Settings) -> dict[str, Measured]:
        calls.append(group)
        if group == "big" and len(calls) > 2:
            raise SystemExit("['python', '-c'] failed: boom")
        return {f"{group}/x": Measured(value=float(len(calls)))}

    rounds, errors = bench_goals.run_rounds(Settings(), ("vs-pi", "big"), 2, measure)
    assert calls == ["vs-pi", "big", "vs-pi", "big"]
    assert rounds == [
        {"vs-pi/x": Measured(value=1.0), "big/x": Measured(value=2.0)},
        {"vs-pi/x": Measured(value=3.0)},
    ]
    assert errors == ["round 2, big: SystemExit: ['python', '-c'] failed: boom"]
    assert "round 2: big" in capsys.readouterr().err


def test_main_prints_the_table_or_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def measure(group: str, settings: Settings) -> dict[str, Measured]:
        row = {"n": 10_000, "kind": "plain", "total": 0.203, "cpu": 0.002}
        return from_compaction(row, settings.latency) | from_compaction(
            {**row, "kind": "split", "total": 0.205}, settings.latency
        )

    monkeypatch.setattr(bench_goals, "in_child", measure)
    monkeypatch.setattr(bench_goals, "real_probes", lambda root, versions: _probes({}))
    bench_goals.main(["--rounds", "1", "--only", "compaction"])
    out = capsys.readouterr().out
    assert "one compaction, 10k entries, plain, total - L  <= 4 ms  3.0 ms met" in out
    assert "5.0 ms NOT met; CPU 2.0 ms met" in out
    bench_goals.main(["--rounds", "1", "--only", "compaction", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert [goal["met_every_round"] for goal in data["goals"]] == [True, False]
    assert data["header"]["load_after"] == [0.25, 0.5, 0.75]
