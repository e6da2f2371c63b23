"""The short summary as a first-class output: a setting, a flag, and shown where summaries are.

``RuntimeSettings(short_summary=True)`` (``--short-summary`` on ``compact``, ``navigate``,
``serve`` and ``tui``) writes a one-or-two sentence ``shortSummary`` on every compaction and
branch summary; ``compact --json``, ``navigate --json``, the RPC results, ``context``, ``tree``
and the TUI show it. The offline one is a real summary, without the offline banner.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.tokens import CompactionSettings
from orchestrator._models.offline import NOTE, OfflineSummarizer
from orchestrator._rpc.server import RuntimeOptions, SessionHub
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session
from orchestrator._tui.picker import entry_text
from orchestrator.testing import FakeClock, ScriptedAgent, reply, tool_result
from tests.cli_kit import EXAMPLE, run
from tests.runtime_kit import HubClient as Client

TARGET = "11a25bfa"  # navigating there abandons the example's "Keep Decimal." branch


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def one_or_two_sentences(text: str) -> bool:
    # Sentence ends outside quotes and backticks: strip those spans first.
    bare = re.sub(r'"[^"]*"|`[^`]*`', "X", text)
    return "\n" not in text and 1 <= len(re.findall(r"[.!?](?:\s|$)", bare)) <= 2


def runtime(short_summary: bool) -> tuple[AgentSession, ScriptedAgent, Session]:
    counter = itertools.count(1)
    ms = itertools.count(1_767_225_600_000, 1000)
    clock = FakeClock()
    session = Session.in_memory(
        clock=lambda: next(ms), random_hex=lambda: f"{next(counter):08x}" + "0" * 24
    )
    agent = ScriptedAgent()
    rt = AgentSession(
        session,
        agent=agent,
        summarizer=SummaryRoutes(candidates=(OfflineSummarizer(),), sleep=clock.sleep),
        settings=RuntimeSettings(
            context_window=200_000,
            compaction=CompactionSettings(keep_recent_tokens=50, adaptive_keep=False),
            short_summary=short_summary,
        ),
        journal=Journal.in_memory(clock=lambda: 0),
        sleep=clock.sleep,
        clock_ms=lambda: next(ms),
    )
    return rt, agent, session


def edit_turn(n: int) -> list[dict[str, Any]]:
    path = f"src/part_{n}.py"
    return [
        reply(f"Editing {path}.", calls=[(f"e{n}", "edit", {"path": path})], tokens=100),
        tool_result(f"e{n}", f"Successfully replaced text in {path}.", tool="edit"),
        reply(f"{path} is done. " + "detail " * 60, tokens=200),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("enabled", [True, False])
async def test_the_runtime_setting_writes_short_summaries(enabled: bool) -> None:
    rt, agent, session = runtime(short_summary=enabled)
    for n in range(3):
        agent.push(edit_turn(n))
        await rt.prompt(f"Refactor part {n} of the parser.")
    outcome = await rt.compact()
    assert outcome.status == "committed"
    compaction = session.tree.entries[-1]
    base = compaction["id"]
    agent.push(edit_turn(9))
    await rt.prompt("Try a table-driven parser in src/part_9.py instead.")
    navigated = await rt.navigate(base, summarize=True)
    branch = navigated.summary_entry
    assert branch is not None
    if not enabled:
        assert "shortSummary" not in compaction
        assert "shortSummary" not in branch
        return
    for entry in (compaction, branch):
        short = entry["shortSummary"]
        assert not short.startswith(NOTE)
        assert one_or_two_sentences(short), short
    assert compaction["shortSummary"].startswith("I changed `src/part_0.py`, `src/part_1.py`")
    assert outcome.result is not None
    assert outcome.result.short_summary == compaction["shortSummary"]
    assert branch["shortSummary"].startswith(
        'I changed `src/part_9.py` while working on "Try a table-driven parser'
    )


@pytest.fixture
def example(tmp_path: Path) -> Path:
    target = tmp_path / "session.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


def test_compact_and_navigate_show_it_and_context_and_tree_too(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "compact", str(example), "--short-summary", "--json")
    assert code == 0, err
    report = json.loads(out)
    short = report["shortSummary"]
    assert one_or_two_sentences(short), short
    assert Session.open(example).tree.entries[-1]["shortSummary"] == short

    code, out, _ = run(capsys, "context", str(example))
    assert out.splitlines()[1] == f"    short summary: {short}"
    code, out, _ = run(capsys, "context", str(example), "--json")
    assert json.loads(out)["messageShortSummaries"][0] == short
    code, out, _ = run(capsys, "tree", str(example))
    assert f"compaction: {short[:20]}" in out
    code, out, _ = run(capsys, "tree", str(example), "--json")
    rows = json.loads(out)["nodes"] if "nodes" in json.loads(out) else json.loads(out)
    assert [r["shortSummary"] for r in rows if r["shortSummary"]] == [short]

    code, out, err = run(
        capsys, "navigate", str(example), "--to", TARGET, "--summarize", "--short-summary"
    )
    assert code == 0, err
    branch_short = Session.open(example).tree.entries[-1]["shortSummary"]
    assert f"-- short summary: {branch_short}\n" in out
    assert one_or_two_sentences(branch_short), branch_short


def test_without_the_flag_nothing_is_written_or_shown(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "compact", str(example), "--json")
    assert code == 0
    assert json.loads(out)["shortSummary"] is None
    assert "shortSummary" not in Session.open(example).tree.entries[-1]
    code, out, _ = run(capsys, "context", str(example))
    assert "short summary:" not in out


@pytest.mark.anyio
async def test_rpc_results_carry_it(example: Path) -> None:
    hub = SessionHub(
        RuntimeOptions(root=example.parent, settings=RuntimeSettings(short_summary=True))
    )
    client = Client(hub)
    sid = (await client.call("session.open", path=example.name))["session_id"]
    compressed = await client.call("session.compress", session_id=sid)
    assert compressed["compacted"] is True
    assert one_or_two_sentences(compressed["shortSummary"])
    navigated = await client.call(
        "session.tree.navigate", session_id=sid, target_id=TARGET, summarize=True
    )
    assert one_or_two_sentences(navigated["shortSummary"])
    tree = await client.call("session.tree", session_id=sid)
    shorts = [n["shortSummary"] for n in tree["nodes"] if n["shortSummary"]]
    assert sorted(shorts) == sorted([compressed["shortSummary"], navigated["shortSummary"]])


def test_the_tui_preview_and_transcript_lead_with_it() -> None:
    entry = {"type": "compaction", "summary": "## Goal\nG", "shortSummary": "I changed `a.py`."}
    assert entry_text(entry) == "Short summary: I changed `a.py`.\n\n## Goal\nG"
    assert entry_text({"type": "compaction", "summary": "## Goal\nG"}) == "## Goal\nG"
