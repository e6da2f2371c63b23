"""Retention for branch summaries: facts planted on generated branches survive the summary.

A branch summary request carries no tool results, so the offline summarizer must find a
branch's work in its calls and in what the assistant said after them. Each test here builds a
branch through :class:`AgentSession` (scripted agent, default offline summarizer), navigates
back to where it started with ``summarize=True`` and checks the planted facts, section by
section. The generated branches mix the shapes a branch has in practice: edits, passing and
failing runs, reads, decisions, rules, answered and open questions.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from orchestrator._core.tokens import CompactionSettings
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._models.offline_evidence import gist
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session
from orchestrator.testing import FakeClock, ScriptedAgent, reply, tool_result

pytestmark = pytest.mark.anyio

WORDS = ("zircon", "quartz", "basalt", "garnet", "cobalt", "marble", "copper", "sulfur")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Branch:
    """A generated branch: the turns to play and the facts the summary must keep."""

    turns: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    """Planted identifiers a focus can name."""
    shapes: set[str] = field(default_factory=set)


def runtime() -> tuple[AgentSession, ScriptedAgent, Session]:
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
            context_window=200_000, compaction=CompactionSettings(enabled=False)
        ),
        journal=Journal.in_memory(clock=lambda: 0),
        sleep=clock.sleep,
        clock_ms=lambda: next(ms),
    )
    return rt, agent, session


def generate(seed: int) -> Branch:
    """A branch of two to four turns, each doing one to three things with planted names."""
    rng = random.Random(seed)
    branch = Branch()
    names = iter(f"{w}{seed}{n}" for n in range(9) for w in rng.sample(WORDS, len(WORDS)))
    ids = itertools.count()
    for turn_no in range(rng.randint(2, 4)):
        topic = next(names)
        if turn_no and rng.random() < 0.3:
            question = f"Which encoding does the {topic} parser expect?"
            answer = f"It expects {next(names)} framing, as the header says."
            branch.turns.append((question, [reply(answer)]))
            branch.critical.append(f"Asked: {question} Answer: {answer}")
            branch.tokens.append(topic)
            branch.shapes.add("question")
            continue
        prompt = f"Work on the {topic} module in src/{topic}.py and report back."
        if rng.random() < 0.5:
            rule = f"Never rename the {topic} functions."
            prompt += " " + rule
            branch.rules.append(rule)
        steps: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(("edit", "write", "pass", "fail", "read", "decide"))
            name, call = next(names), f"c{next(ids)}"
            branch.shapes.add(kind)
            if kind in ("edit", "write"):
                path = f"src/{name}.py"
                steps += [
                    reply(f"Changing {path}.", calls=[(call, kind, {"path": path})]),
                    tool_result(call, f"Successfully wrote {path}.", tool=kind),
                    reply(f"{path} now holds the {name} helper."),
                ]
                branch.done.append(f"- [x] {kind} `{path}`")
                branch.modified.append(path)
            elif kind == "pass":
                command = f"python -m pytest -q tests/test_{name}.py"
                said = f"All {rng.randint(3, 90)} tests in test_{name}.py pass."
                steps += [
                    reply("", calls=[(call, "bash", {"command": command})]),
                    tool_result(call, "....\nok", tool="bash"),
                    reply(said),
                ]
                branch.done.append(f"- [x] Ran `{command}` (the assistant reported: {said})")
            elif kind == "fail":
                command = f"make lint-{name}"
                said = f"The lint run failed with KeyError: '{name}'."
                steps += [
                    reply("", calls=[(call, "bash", {"command": command})]),
                    tool_result(call, f"KeyError: '{name}'", tool="bash"),
                    reply(said),
                ]
                branch.blocked.append(f"- Ran `{command}` failed (the assistant reported: {said})")
            elif kind == "read":
                path = f"docs/{name}.md"
                steps += [
                    reply("Reading the notes.", calls=[(call, "read", {"path": path})]),
                    tool_result(call, f"# {name}\nNotes."),
                    reply(f"The notes for {name} are short."),
                ]
                branch.critical.append(f"`{path}`")
            else:
                decision = f"I decided to keep {name} as a plain dict rather than a class."
                steps.append(reply(decision))
                branch.decisions.append(f"- {decision}")
            branch.tokens.append(name)
        branch.turns.append((prompt, steps))
    return branch


def section(summary: str, heading: str) -> str:
    return summary.split(f"{heading}\n", 1)[1].split("\n## ", 1)[0]


async def summarize_branch(branch: Branch, focus: str | None = None) -> str:
    rt, agent, session = runtime()
    agent.push([reply("The base is ready.")])
    await rt.prompt("Set up the base project.")
    base = session.leaf_id
    assert base is not None
    for prompt, turn in branch.turns:
        agent.push(turn)
        await rt.prompt(prompt)
    result = await rt.navigate(base, summarize=True, instructions=focus)
    assert result.summary_entry is not None
    assert session.leaf_id == result.summary_entry["id"]
    summary: str = result.summary_entry["summary"]
    return summary


SEEDS = range(16)


def test_the_generated_branches_cover_every_shape() -> None:
    seen = [generate(seed).shapes for seed in SEEDS]
    every = {"edit", "write", "pass", "fail", "read", "decide", "question"}
    assert set().union(*seen) == every
    assert len({frozenset(s) for s in seen}) >= 10  # and mix them in different ways


@pytest.mark.parametrize("seed", SEEDS)
async def test_planted_facts_survive_a_branch_summary(seed: int) -> None:
    branch = generate(seed)
    focus_token = random.Random(seed).choice(branch.tokens)
    summary = await summarize_branch(branch, focus=f"the {focus_token} work")

    prompts = [prompt for prompt, _ in branch.turns]
    goal = section(summary, "## Goal")
    assert goal.startswith(f"- {prompts[0]}\n")  # the request, whole
    if len(prompts) > 1:
        assert f"- Latest request: {gist(prompts[-1])}\n" in goal
    rules = section(summary, "## Constraints & Preferences")
    for rule in branch.rules:
        assert f"- {rule}\n" in rules
    progress = section(summary, "## Progress")
    done, rest = progress.split("### In Progress\n")
    blocked = rest.split("### Blocked\n")[1]
    for item in branch.done:
        assert item + "\n" in done
    assert done.count("- [x] ") == len(branch.done)  # nothing invented, nothing read as done
    for item in branch.blocked:
        assert item + "\n" in blocked
    if not branch.blocked:
        assert blocked.startswith("(none)")
    decisions = section(summary, "## Key Decisions")
    for item in branch.decisions:
        assert item + "\n" in decisions
    critical = section(summary, "## Critical Context")
    for item in branch.critical:
        assert item in critical
    modified = summary.split("<modified-files>\n", 1)[1] if branch.modified else ""
    for path in branch.modified:
        assert path in modified
    assert f"- Requested focus: the {focus_token} work\n" in critical
    quotes = [line for line in critical.splitlines() if line.startswith("- On the focus")]
    assert quotes
    assert all(focus_token in line for line in quotes)


async def test_a_failure_fixed_later_in_the_branch_is_done_not_blocked() -> None:
    command = "python -m pytest -q"
    turn = [
        reply("", calls=[("a", "bash", {"command": command})]),
        tool_result("a", "E   KeyError: 'currency_code'\n1 failed", tool="bash"),
        reply("The suite failed with KeyError: 'currency_code'. Fixing the lookup."),
        reply("", calls=[("b", "edit", {"path": "src/invoice.py"})]),
        tool_result("b", "Successfully replaced text in src/invoice.py.", tool="edit"),
        reply("", calls=[("c", "bash", {"command": command})]),
        tool_result("c", "41 passed", tool="bash"),
        reply("Now all 41 tests pass."),
    ]
    summary = await summarize_branch(Branch(turns=[("Fix the currency bug.", turn)]))
    progress = section(summary, "## Progress")
    assert progress.split("### Blocked\n")[1].startswith("(none)")
    assert "- [x] edit `src/invoice.py`\n" in progress
    assert f"- [x] Ran `{command}` (the assistant reported: Now all 41 tests pass.)" in progress


async def test_a_branch_left_mid_call_or_mid_question_says_where_it_stopped() -> None:
    question = "Should the report keep the old column order?"
    turns = [
        (
            "Rename the report columns in src/report.py.",
            [
                reply("Renaming.", calls=[("e", "edit", {"path": "src/report.py"})]),
                tool_result("e", "Successfully replaced text in src/report.py.", tool="edit"),
            ],
        )
    ]
    summary = await summarize_branch(Branch(turns=turns))
    steps = section(summary, "## Next Steps")
    assert (
        "The branch ended at the tool call edit `src/report.py`, whose outcome is not in the "
        "branch" in steps
    )
    assert "- [x] edit" not in summary  # its outcome is not in the branch: not claimed as done

    asked = await summarize_branch(Branch(turns=[(question, [reply("", stop="aborted")])]))
    assert f"- Unanswered (verbatim): {question}" in section(asked, "## Critical Context")
    assert f"1. Answer the user's pending message: {question}" in section(asked, "## Next Steps")
