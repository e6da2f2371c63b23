"""Retention: facts planted early survive five rounds of offline compaction through the runtime.

The lesson from earlier projects: plant constraints and exact identifiers, compact N rounds, and
check what survives. Everything runs through :class:`AgentSession` with a scripted agent and the
default (offline) summarizer, so this is what a user with no model configured gets.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from orchestrator._core.tokens import CompactionSettings
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session
from orchestrator.testing import FakeClock, ScriptedAgent, reply, tool_result

pytestmark = pytest.mark.anyio

PATH = "src/billing/invoice.py"
ERROR = "FAILED tests/test_invoice.py::test_total - KeyError: 'currency_code'"
SHA = "4e1f9a2c7b3d5e6f"
QUESTION = "Which currencies does the invoice module support?"
NEVER = "Never change the public API."
ALWAYS = "Always run the tests before you say you are done."
ROUNDS = 5
# Each summary must stay under this size. The per-section caps of the offline summarizer bound
# it; for this session (short items: one goal, two rules, one or two edits, a test run and a few
# context lines per round) 6000 characters is about twice what one round needs, so the bound
# fails only if something accumulates from round to round.
MAX_SUMMARY_CHARS = 6000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fix_turn(n: int, path: str) -> list[dict[str, Any]]:
    """A turn that edits ``path`` and runs the tests, which pass."""
    return [
        reply(
            f"Editing {path}.",
            calls=[(f"e{n}", "edit", {"path": path, "oldText": "a", "newText": "b"})],
            tokens=100,
        ),
        tool_result(f"e{n}", f"Successfully replaced text in {path}.", tool="edit"),
        reply("", calls=[(f"t{n}", "bash", {"command": "python -m pytest -q"})], tokens=100),
        tool_result(f"t{n}", f"........\n{40 + n} passed in 0.9s", tool="bash"),
        reply(
            f"Done with {path}: the suite passes ({40 + n} tests). " + "detail " * 40, tokens=150
        ),
    ]


def script() -> tuple[list[tuple[str, list[dict[str, Any]]]], ...]:
    """(user prompt, agent turn) pairs per round."""
    first = [
        (
            f"Refactor the invoice totals in {PATH}. {NEVER} {ALWAYS}",
            [
                reply("Reading the module.", calls=[("r1", "read", {"path": PATH})], tokens=100),
                tool_result("r1", "def total(lines):\n    ...\n" * 40),
                reply(
                    "The module is read; totals are computed per line. " + "note " * 40, tokens=150
                ),
            ],
        ),
        (
            "Run the test suite and tell me what fails.",
            [
                reply("", calls=[("b1", "bash", {"command": "python -m pytest -q"})], tokens=100),
                tool_result("b1", f"F.......\n{ERROR}\n1 failed, 40 passed in 0.8s", tool="bash"),
                reply("One test fails with a KeyError on currency_code.", tokens=120),
            ],
        ),
        (QUESTION, [reply("", stop="aborted")]),  # the user stopped it: no answer yet
        (f"Fix the KeyError in {PATH} first; it appeared after commit {SHA}.", fix_turn(0, PATH)),
    ]
    later = [
        [
            (
                f"Now add a rounding helper to src/billing/tax_{r}.py.",
                fix_turn(r, f"src/billing/tax_{r}.py"),
            ),
            (
                f"Also tidy the imports in src/billing/report_{r}.py.",
                fix_turn(10 + r, f"src/billing/report_{r}.py"),
            ),
        ]
        for r in range(1, ROUNDS)
    ]
    return (first, *later)


def runtime() -> tuple[AgentSession, ScriptedAgent, Session]:
    counter = itertools.count(1)
    ms = itertools.count(1_767_225_600_000, 1000)
    clock = FakeClock()
    session = Session.in_memory(
        clock=lambda: next(ms), random_hex=lambda: f"{next(counter):08x}" + "0" * 24
    )
    agent = ScriptedAgent()
    settings = RuntimeSettings(
        context_window=200_000,  # no automatic compaction: every round is a manual one
        compaction=CompactionSettings(reserve_tokens=16384, keep_recent_tokens=150),
    )
    summarizer = SummaryRoutes(candidates=(OfflineSummarizer(),), sleep=clock.sleep)
    rt = AgentSession(
        session,
        agent=agent,
        summarizer=summarizer,
        settings=settings,
        journal=Journal.in_memory(clock=lambda: 0),
        sleep=clock.sleep,
        clock_ms=lambda: next(ms),
    )
    return rt, agent, session


def section(summary: str, heading: str) -> str:
    return summary.split(f"{heading}\n", 1)[1].split("\n## ", 1)[0]


async def test_planted_facts_survive_five_compactions() -> None:
    rt, agent, session = runtime()
    summaries = []
    for turns in script():
        for prompt, turn in turns:
            agent.push(turn)
            await rt.prompt(prompt)
        outcome = await rt.compact()
        assert outcome.status == "committed"
        summaries.append(session.tree.entries[-1]["summary"])
    assert len(summaries) == ROUNDS
    assert [e["type"] for e in session.tree.entries].count("compaction") == ROUNDS

    latest = summaries[-1]
    rules = section(latest, "## Constraints & Preferences")
    assert f"- {NEVER}\n" in rules
    assert f"- {ALWAYS}\n" in rules
    critical = section(latest, "## Critical Context")
    modified = re.search(r"- Files modified: (.*)", critical)
    assert modified is not None
    assert f"`{PATH}`" in modified.group(1)
    assert PATH in latest.split("<modified-files>\n", 1)[1]
    assert f"- Error seen: {ERROR}\n" in critical
    assert SHA in critical
    assert f"- Question still open (verbatim): {QUESTION}" in critical

    # Completed work does not come back as In Progress: only the open question is in progress.
    progress = section(latest, "## Progress")
    in_progress = progress.split("### In Progress\n")[1].split("### Blocked")[0]
    assert in_progress == f"- [ ] {QUESTION}\n"
    blocked = progress.split("### Blocked\n")[1]
    assert blocked.startswith("(none)")  # the failing run was fixed by a later passing one
    assert "- [x] edit `src/billing/tax_4.py`" in progress
    for earlier in summaries:
        pending = earlier.split("### In Progress")[1].split("###")[0]
        assert "Refactor the invoice totals" not in pending

    # Bounded: no summary outgrows the cap, and file lists are merged, never repeated.
    sizes = [len(s) for s in summaries]
    assert max(sizes) <= MAX_SUMMARY_CHARS, sizes
    assert latest.count("Files modified:") == 1
