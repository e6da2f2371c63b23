"""Issue 37's goals as data: which numbers each goal reads, whether they meet it, and the report.

The pure half of ``bench_goals.py`` (which runs the benchmark scripts): given the numbers the
scripts return, it names the measure of each goal, judges it against the goal's limit and lays out
the table or the JSON; and it gathers the header (commit, processor, date, versions, load) through
probes a test can replace. Nothing here runs a benchmark.

A goal is judged on its own measure, the one issue 37 names (wall time of a whole process, or peak
RSS); where the script also gives the same quantity in CPU time, that is shown beside it and judged
too, since on a busy shared machine the CPU time is the steadier of the two. The concurrent goals'
CPU time (the compactions' own, over both cores) is not the same quantity as their wall time,
which includes the model's latency, so it is shown and not judged.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

GROUPS = ("vs-pi", "big", "compaction", "concurrent")
"""The benchmarks behind the goals, in the order a round runs them (``--only`` picks some)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The sizes the goals are measured at (issue 37's by default)."""

    sizes: tuple[int, ...] = (10_000, 40_000, 60_000)  # bench_vs_pi.py's sessions
    big: int = 200_000  # check and plan --json alone
    compaction: int = 10_000  # one compaction
    sessions: int = 1_000  # compacting at once
    entries: int = 300  # each of those sessions' entries (bench_concurrent.py's default)
    latency: float = 0.2  # one compaction's model latency (bench_compaction.py's default)
    concurrent_latency: float = 1.0  # the thousand's model latency: the goal's L
    runs: int | None = None  # runs per round where a script takes medians; None: its own default


@dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """One row of issue 37's table at one size: its measure must stay at or below ``limit``."""

    key: str
    group: str
    what: str
    limit: float
    unit: str = ""  # "" for a ratio (ours / pi's)
    digits: int = 2
    cpu_judged: bool = True  # a CPU figure of the same quantity is judged against ``limit`` too


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A goal's measure in one round, and the same from CPU time where the script gives it."""

    value: float
    cpu: float | None = None


Round = Mapping[str, Measured]
"""One round's measures by goal key (a goal of a group that failed is missing)."""


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _vs_pi_goals(n: int) -> list[Goal]:
    at = f"{_k(n)} entries"
    return [
        Goal(
            key=f"plan/{n}",
            group="vs-pi",
            what=f"plan --json / pi 1.6.0's load + context + plan, {at}",
            limit=0.5,
        ),
        Goal(
            key=f"context/{n}",
            group="vs-pi",
            what=f"context --json / pi 1.6.0's load + context, {at}",
            limit=0.7,
        ),
        Goal(
            key=f"plan-rss/{n}",
            group="vs-pi",
            what=f"peak RSS / pi's, plan, {at}",
            limit=0.5,
            cpu_judged=False,
        ),
        Goal(
            key=f"context-rss/{n}",
            group="vs-pi",
            what=f"peak RSS / pi's, context, {at}",
            limit=0.5,
            cpu_judged=False,
        ),
    ]


def _big_goals(n: int) -> list[Goal]:
    rows = []
    for command, name in (("check", "check"), ("plan", "plan --json")):
        what = f"{name}, {_k(n)} entries"
        rows += [
            Goal(key=f"{command}/{n}", group="big", what=what, limit=1.0, unit=" s"),
            Goal(
                key=f"{command}-rss/{n}",
                group="big",
                what=f"{what}, peak RSS",
                limit=300,
                unit=" MB",
                digits=0,
                cpu_judged=False,
            ),
        ]
    return rows


def goals(settings: Settings, only: Sequence[str] = GROUPS) -> list[Goal]:
    """Issue 37's goals for the chosen groups, at ``settings``' sizes, in table order."""
    rows: list[Goal] = []
    if "vs-pi" in only:
        rows += [goal for n in settings.sizes for goal in _vs_pi_goals(n)]
    if "big" in only:
        rows += _big_goals(settings.big)
    if "compaction" in only:
        n = settings.compaction
        rows += [
            Goal(
                key=f"compaction-{kind}/{n}",
                group="compaction",
                what=f"one compaction, {_k(n)} entries, {kind}, total - L",
                limit=4.0,
                unit=" ms",
                digits=1,
            )
            for kind in ("plain", "split")
        ]
    if "concurrent" in only:
        rows += [
            Goal(
                key=f"concurrent-{path}/{settings.sessions}",
                group="concurrent",
                what=f"{settings.sessions:,} sessions compacting at once, through the {path}",
                limit=limit,
                unit=" s",
                cpu_judged=False,
            )
            for path, limit in (("runtime", 1.8), ("server", 2.2))
        ]
    return rows


# -- the scripts' numbers to the goals' measures -------------------------------------------------


def from_vs_pi(row: Mapping[str, float]) -> dict[str, Measured]:
    """Measures from one row of ``bench_vs_pi.measure`` (medians of its runs): ours / pi's."""
    n = int(row["n"])
    measured = {}
    for command in ("plan", "context"):
        ours, pi = f"{command}_ours", f"{command}_pi"
        measured[f"{command}/{n}"] = Measured(
            value=row[ours] / row[pi], cpu=row[ours + "_cpu"] / row[pi + "_cpu"]
        )
        measured[f"{command}-rss/{n}"] = Measured(value=row[ours + "_rss"] / row[pi + "_rss"])
    return measured


def from_big(
    n: int, results: Mapping[tuple[str, str | None], Sequence[tuple[float, ...]]]
) -> dict[str, Measured]:
    """Measures from ``bench_vs_pi.big_runs``: medians of (wall s, peak RSS MB, CPU s) per run."""
    measured = {}
    for (command, root), runs in results.items():
        if root is None:  # a base checkout's runs are not ours
            measured[f"{command}/{n}"] = Measured(
                value=statistics.median([r[0] for r in runs]),
                cpu=statistics.median([r[2] for r in runs]),
            )
            measured[f"{command}-rss/{n}"] = Measured(value=statistics.median([r[1] for r in runs]))
    return measured


def from_compaction(row: Mapping[str, Any], latency: float) -> dict[str, Measured]:
    """Measures from one row of ``bench_compaction.measure`` (seconds): total - L, in ms."""
    key = f"compaction-{row['kind']}/{row['n']}"
    return {key: Measured(value=(row["total"] - latency) * 1e3, cpu=row["cpu"] * 1e3)}


def from_concurrent(sessions: int, rows: Sequence[Mapping[str, Any]]) -> dict[str, Measured]:
    """Measures from ``bench_concurrent.measure``'s rows: each path's wall and CPU seconds.

    Raises:
        ValueError: not every compaction of a path committed: its time measures something else.
    """
    measured = {}
    for row in rows:
        # The runtime counts OperationState members, the server the strings it answered.
        outcomes = {str(getattr(key, "value", key)): count for key, count in row["results"].items()}
        if outcomes != {"committed": sessions}:
            raise ValueError(f"{row['path']}: not every compaction committed: {outcomes}")
        measured[f"concurrent-{row['path']}/{sessions}"] = Measured(
            value=row["wall_s"], cpu=row["cpu_s"]
        )
    return measured


# -- judging ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One goal in one round: its measure (None: not measured) and whether it met the goal."""

    measured: Measured | None
    met: bool  # by the goal's own measure; False when not measured
    met_cpu: bool | None  # by CPU time; None where there is none or it is not judged


def judge(goal: Goal, measured: Measured | None) -> Verdict:
    """Whether ``measured`` meets ``goal`` (at or below its limit), by each figure judged."""
    if measured is None:
        return Verdict(measured=None, met=False, met_cpu=None)
    met_cpu = None
    if goal.cpu_judged and measured.cpu is not None:
        met_cpu = measured.cpu <= goal.limit
    return Verdict(measured=measured, met=measured.value <= goal.limit, met_cpu=met_cpu)


def verdicts(table: Sequence[Goal], rounds: Sequence[Round]) -> list[list[Verdict]]:
    """For each goal, one verdict per round."""
    return [[judge(goal, measures.get(goal.key)) for measures in rounds] for goal in table]


def _yes(met: bool) -> str:
    return "met" if met else "NOT met"


def cell(goal: Goal, verdict: Verdict) -> str:
    """A round's cell: the measure and its verdict, then the CPU figure and its own."""
    if verdict.measured is None:
        return "not measured"
    measured = verdict.measured
    text = f"{measured.value:.{goal.digits}f}{goal.unit} {_yes(verdict.met)}"
    if measured.cpu is not None:
        text += f"; CPU {measured.cpu:.{goal.digits}f}{goal.unit}"
        if verdict.met_cpu is not None:
            text += f" {_yes(verdict.met_cpu)}"
    return text


def limit_text(goal: Goal) -> str:
    return f"<= {goal.limit:g}{goal.unit}"


# -- the header ------------------------------------------------------------------------------------


def processor(text: str) -> str | None:
    """The model name in /proc/cpuinfo's text or lscpu's output (both say "model name: ...")."""
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip().lower() == "model name" and value.strip():
            return value.strip()
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Probes:
    """Where the header's facts come from; a test passes its own."""

    run: Callable[[Sequence[str]], str]  # a command's standard output, in the checkout
    cpuinfo: Callable[[], str]
    now: Callable[[], datetime]
    load: Callable[[], tuple[float, float, float]]
    versions: Callable[[], tuple[str, str]]  # node's and pi's (bench_vs_pi.versions)


def real_probes(root: Path, versions: Callable[[], tuple[str, str]]) -> Probes:
    """This machine's: commands run in ``root``, /proc/cpuinfo, the clock, the load average."""

    def run(argv: Sequence[str]) -> str:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=True, cwd=root)
        return done.stdout

    return Probes(
        run=run,
        cpuinfo=lambda: Path("/proc/cpuinfo").read_text(encoding="utf-8"),
        now=lambda: datetime.now(UTC),
        load=os.getloadavg,
        versions=versions,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    """What a reader needs to weigh the numbers: code, machine, date, versions, load."""

    commit: str
    dirty: bool  # tracked files differ from the commit
    processor: str
    date: str  # UTC, to the second: "2026-12-07 21:00:00 UTC"
    python: str
    node: str
    pi: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] | None = None
    rounds: int
    groups: tuple[str, ...]
    settings: Settings


_FAILED = (OSError, subprocess.CalledProcessError)


def _output(probes: Probes, argv: Sequence[str]) -> str | None:
    try:
        return probes.run(argv).strip()
    except _FAILED:
        return None


def gather_header(
    probes: Probes, rounds: int, settings: Settings, groups: Sequence[str] = GROUPS
) -> Header:
    """The header before the first round (``load_after`` is filled in after the last)."""
    status = _output(probes, ["git", "status", "--porcelain", "--untracked-files=no"])
    try:
        cpuinfo = probes.cpuinfo()
    except OSError:
        cpuinfo = ""
    try:
        node, pi = probes.versions()
    except _FAILED:
        node = pi = "absent (npm ci in tests/conformance)"
    return Header(
        commit=_output(probes, ["git", "rev-parse", "--short", "HEAD"]) or "unknown",
        dirty=bool(status),
        processor=processor(cpuinfo) or processor(_output(probes, ["lscpu"]) or "") or "unknown",
        date=probes.now().astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        python=sys.version.split()[0],
        node=node,
        pi=pi,
        load_before=probes.load(),
        rounds=rounds,
        groups=tuple(groups),
        settings=settings,
    )


# -- the report ------------------------------------------------------------------------------------


def _load(load: tuple[float, float, float] | None) -> str:
    return "-" if load is None else " / ".join(f"{x:.2f}" for x in load)


def _sizes(settings: Settings, group: str) -> tuple[str, bool]:
    """A group's sizes as text, and whether they are issue 37's (some of its vs-pi sizes are)."""
    issue = Settings()
    if group == "vs-pi":
        text = f"vs pi {', '.join(map(str, settings.sizes))}"
        return text, set(settings.sizes) <= set(issue.sizes)
    if group == "big":
        return f"big {settings.big}", settings.big == issue.big
    if group == "compaction":
        text = f"one compaction {settings.compaction}, L = {settings.latency:g} s"
        return text, (settings.compaction, settings.latency) == (issue.compaction, issue.latency)
    text = f"{settings.sessions} sessions of {settings.entries} entries"
    text += f", L = {settings.concurrent_latency:g} s"
    ours = (settings.sessions, settings.entries, settings.concurrent_latency)
    return text, ours == (issue.sessions, issue.entries, issue.concurrent_latency)


def settings_line(settings: Settings, groups: Sequence[str]) -> str:
    """The chosen groups' sizes, flagged where they are not issue 37's (its goals hold there)."""
    sizes = [_sizes(settings, group) for group in groups]
    flag = "" if all(issue for _, issue in sizes) else " (NOT issue 37's)"
    runs = "the scripts' own" if settings.runs is None else str(settings.runs)
    return f"sizes{flag}: {'; '.join(text for text, _ in sizes)}; runs per round: {runs}"


def header_lines(header: Header) -> list[str]:
    dirty = " (tracked files changed since)" if header.dirty else ""
    return [
        f"Issue 37's goals, {header.rounds} round{'s' if header.rounds != 1 else ''}, "
        f"started {header.date}",
        f"commit {header.commit}{dirty}; processor {header.processor}",
        f"Python {header.python}, node {header.node}, pi {header.pi}",
        f"load average (1 / 5 / 15 min) before {_load(header.load_before)}, "
        f"after {_load(header.load_after)}",
        settings_line(header.settings, header.groups),
    ]


def summary(table: Sequence[Goal], judged: Sequence[Sequence[Verdict]]) -> str:
    """How many goals were met in every round, by their own measure and by CPU time."""
    every = sum(all(v.met for v in row) for row in judged)
    by_cpu = [row for goal, row in zip(table, judged, strict=True) if goal.cpu_judged]
    cpu_every = sum(all(v.met_cpu for v in row) for row in by_cpu)
    text = f"Met in every round: {every} of {len(table)} goals; by CPU time, {cpu_every} of "
    text += f"{len(by_cpu)} judged by it"
    if any(goal.group == "concurrent" for goal in table):
        text += " (the concurrent goals' CPU time is the compactions' own: shown, not judged)"
    return text + "."


def render(
    header: Header,
    table: Sequence[Goal],
    judged: Sequence[Sequence[Verdict]],
    errors: Sequence[str],
) -> str:
    """The report as text: the header, one line per goal with a column per round, the summary."""
    rounds = len(judged[0]) if judged else 0
    head = ["goal", "limit", *(f"round {r + 1}" for r in range(rounds))]
    body = [
        [goal.what, limit_text(goal), *(cell(goal, v) for v in row)]
        for goal, row in zip(table, judged, strict=True)
    ]
    widths = [max(len(line[c]) for line in [head, *body]) for c in range(len(head))]
    lines = [*header_lines(header), ""]
    for line in [head, *body]:
        lines.append(
            "  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip()
        )
    lines += ["", summary(table, judged)]
    lines += [f"error: {error}" for error in errors]
    return "\n".join(lines)


def as_json(
    header: Header,
    table: Sequence[Goal],
    judged: Sequence[Sequence[Verdict]],
    errors: Sequence[str],
) -> dict[str, Any]:
    """The report as JSON-ready data: the same facts as ``render``."""
    return {
        "header": asdict(header),
        "goals": [
            {
                **asdict(goal),
                "rounds": [
                    None
                    if v.measured is None
                    else {**asdict(v.measured), "met": v.met, "met_cpu": v.met_cpu}
                    for v in row
                ],
                "met_every_round": all(v.met for v in row),
            }
            for goal, row in zip(table, judged, strict=True)
        ],
        "summary": summary(table, judged),
        "errors": list(errors),
    }
