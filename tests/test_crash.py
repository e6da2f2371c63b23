"""Crash tests (D24): a process killed with SIGKILL at each step of a compaction, a branch summary
and a prune reopens to a consistent session, with the half-done operation settled and no model
called."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._sim.simulate import simulate
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session

pytestmark = pytest.mark.slow

BASE = """
[scenario]
name = "crash-{name}"

[settings]
context_window = {window}
reserve_tokens = {reserve}
keep_recent_tokens = 300

[[turns]]
steps = [{first}]

[[turns]]
steps = [{second}]

[summarizer]
primary = [{{ error = "503 unavailable", kind = "transient" }}, {{ text = "## Goal\\nAnswer." }},
           {{ text = "## Goal\\nAnswer." }}]

[crash]
{crash}
"""

COMPACT = (
    '\n[[actions]]\ndo = "prompt"\nsize = 2000\n\n[[actions]]\ndo = "prompt"\nsize = 2000\n'
    '\n[[actions]]\ndo = "compact"\n'
)
NAVIGATE = (
    '\n[[actions]]\ndo = "prompt"\nsize = 2000\n\n[[actions]]\ndo = "prompt"\nsize = 2000\n'
    '\n[[actions]]\ndo = "navigate"\ntarget = "user:2"\nsummarize = true\n'
)
PRUNE = '\n[[actions]]\ndo = "prompt"\nsize = 2000\n\n[[actions]]\ndo = "prompt"\nsize = 2000\n'

SMALL = ('{ reply = "First.", tokens = 3000 }', '{ reply = "Second.", tokens = 3500 }')
BIG = (
    '{ reply = "Reading.", tokens = 1500, calls = [["c1", "bash", { command = "cat log" }],'
    ' ["c0", "read", { path = "a.py" }]] }, { tool_result = "c1", tool = "bash", size = 100000 },'
    ' { tool_result = "c0", size = 82000 }, { reply = "Read.", tokens = 4000 }',
    '{ reply = "Testing.", tokens = 5000, calls = [["c2", "bash", { command = "pytest" }]] },'
    ' { tool_result = "c2", tool = "bash", size = 100000 }, { reply = "Tested.", tokens = 99000 }',
)

# (kill point, how the operation must be settled on reopen)
POINTS = [
    ('to = "consulting_hooks"', "cancelled"),
    ('to = "summarizing"', "cancelled"),
    ('to = "waiting_retry"', "cancelled"),
    ('to = "committing"', "failed"),
    ('after = "commit"', "committed"),
    ('to = "committed"', None),  # the operation had ended: nothing to settle
]
# A branch summary consults no hooks of its own (the navigation asked them), and a prune calls
# no model: each meets only the phases of its own rows.
BRANCH_POINTS = [p for p in POINTS if "consulting_hooks" not in p[0]]
PRUNE_POINTS = [
    p for p in POINTS if not any(s in p[0] for s in ("consulting", "summarizing", "waiting"))
]


def run(
    tmp_path: Path,
    name: str,
    crash: str,
    kind: str,
    actions: str,
    turns: tuple[str, str] = SMALL,
    window: int = 10000,
    reserve: int = 1000,
) -> tuple[object, Path]:
    scenario = tmp_path / f"{name}.toml"
    if "after" not in crash:
        crash = f'machine = "operation"\n{crash}'
    text = (
        BASE.format(
            name=name,
            window=window,
            reserve=reserve,
            first=turns[0],
            second=turns[1],
            crash=f'{crash}\nkind = "{kind}"',
        )
        + actions
    )
    scenario.write_text(text)
    workdir = tmp_path / "work"
    report = simulate(scenario, tmp_path / "trace.jsonl", workdir=workdir)
    return report, workdir / "session.jsonl"


def check_consistent(session_file: Path) -> Session:
    session = Session.open(session_file)
    assert session.problems == []
    called: set[str] = set()
    for message in session.context().messages:
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "toolCall":
                called.add(block["id"])
        if message.get("role") == "toolResult":
            assert message["toolCallId"] in called
    assert Journal.open(session_file).open_operations() == ()
    session.close()
    return session


def settled(report: object) -> str | None:
    lines = [line for line in report.outcomes if line.startswith("settled")]  # type: ignore[attr-defined]
    assert len(lines) <= 1
    return lines[0].rsplit(" -> ", 1)[1] if lines else None


@pytest.mark.parametrize(("crash", "expected"), POINTS, ids=[p[0] for p in POINTS])
def test_compaction_killed_at_each_step(tmp_path: Path, crash: str, expected: str | None) -> None:
    report, path = run(tmp_path, "compaction", crash, "compaction", COMPACT)
    assert report.crashed  # type: ignore[attr-defined]
    assert settled(report) == expected
    session = check_consistent(path)
    compactions = [e for e in session.tree.entries if e["type"] == "compaction"]
    assert len(compactions) == (1 if expected in ("committed", None) else 0)


@pytest.mark.parametrize(("crash", "expected"), BRANCH_POINTS, ids=[p[0] for p in BRANCH_POINTS])
def test_branch_summary_killed_at_each_step(
    tmp_path: Path, crash: str, expected: str | None
) -> None:
    report, path = run(tmp_path, "branch", crash, "branch_summary", NAVIGATE)
    assert report.crashed  # type: ignore[attr-defined]
    assert settled(report) == expected
    session = check_consistent(path)
    summaries = [e for e in session.tree.entries if e["type"] == "branch_summary"]
    assert len(summaries) == (1 if expected in ("committed", None) else 0)


@pytest.mark.parametrize(("crash", "expected"), PRUNE_POINTS, ids=[p[0] for p in PRUNE_POINTS])
def test_prune_killed_at_each_step(tmp_path: Path, crash: str, expected: str | None) -> None:
    report, path = run(
        tmp_path, "prune", crash, "prune", PRUNE, turns=BIG, window=100000, reserve=30000
    )
    assert report.crashed  # type: ignore[attr-defined]
    assert settled(report) == expected
    session = check_consistent(path)
    pruned = [e for e in session.tree.entries if e.get("message", {}).get("prunedAt")]
    if expected in ("committed", None):
        assert len(pruned) == 1
        assert pruned[0]["prunedContent"]
    else:
        assert pruned == []
