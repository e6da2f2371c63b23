"""A Hypothesis rule-based test over the runtime.

Random prompts whose replies succeed, cross the threshold, overflow, hit transient or fatal
errors or the length limit; manual compactions whose summaries succeed or fail; aborts of a
hanging turn; navigations with and without summaries. After every step:

* at most one automatic compaction per user turn (D19);
* nothing partial is applied: every compaction or branch summary in the file belongs to an
  operation the journal shows committed, and every summary is non-empty (D15, D22);
* the stored session reloads to the same entries, with no problems;
* no tool result in the context without its call before it;
* every journaled transition is a row of its table.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.from_thread
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestrator._core.errors import Cancelled, FatalModelError, ModelError
from orchestrator._core.model import ModelResponse
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.machine import load_machine, step
from orchestrator._store.memory import MemoryStore
from orchestrator._store.session import Session
from orchestrator.testing import AgentHang, error_reply, reply, tool_result
from tests.runtime_kit import BIG, Kit, summary, until
from tests.runtime_kit import settings as runtime_settings

OUTCOMES = {
    "ok": lambda n: [reply("fine", tokens=1500)],
    "tools": lambda n: [
        reply("reading", tokens=1200, calls=[(f"c{n}", "read", {"path": f"f{n}.py"})]),
        tool_result(f"c{n}", "y" * 800),
        reply("read it", tokens=2500),
    ],
    "threshold": lambda n: [reply("big", tokens=9600)],
    "overflow": lambda n: [error_reply("prompt is too long: 300000 tokens > 200000 maximum")],
    "transient": lambda n: [error_reply("503 service unavailable")],
    "fatal": lambda n: [error_reply("invalid api key")],
    "length": lambda n: [reply("cut", tokens=9700, stop="length")],
}
SUMMARIES: dict[str, Callable[[], ModelResponse | ModelError]] = {
    "ok": summary,
    "fatal": lambda: FatalModelError("summarizer down"),
    "empty": lambda: summary("   "),
}


class RuntimeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.portal_cm = anyio.from_thread.start_blocking_portal("asyncio")
        self.portal = self.portal_cm.__enter__()
        self.kit = Kit(runtime_settings=runtime_settings(adaptive_keep=False))
        self.turns = 0

    def teardown(self) -> None:
        self.portal_cm.__exit__(None, None, None)

    def _feed_summaries(self, kinds: list[str]) -> None:
        self.kit.model.push(*[SUMMARIES[k]() for k in kinds])

    @rule(
        outcome=st.sampled_from(sorted(OUTCOMES)),
        later=st.sampled_from(sorted(OUTCOMES)),
        summaries=st.lists(st.sampled_from(sorted(SUMMARIES)), min_size=2, max_size=2),
    )
    def prompt(self, outcome: str, later: str, summaries: list[str]) -> None:
        self.turns += 1
        # The follow-up turn answers a retry, a continuation or an overflow retry, if any.
        self.kit.agent.push(
            OUTCOMES[outcome](self.turns),
            OUTCOMES[later](self.turns + 100),
            [reply("settled", tokens=500)],
            [reply("settled", tokens=500)],
            [reply("settled", tokens=500)],
        )
        self._feed_summaries(summaries)
        self.portal.call(self.kit.runtime.prompt, BIG)
        self.kit.agent.clear()
        self.kit.model.clear()

    @rule(kind=st.sampled_from(sorted(SUMMARIES)), focus=st.sampled_from([None, "the decisions"]))
    def compact(self, kind: str, focus: str | None) -> None:
        self._feed_summaries([kind, kind])
        try:
            self.portal.call(self.kit.runtime.compact, focus)
        except (ModelError, Cancelled):
            pass
        self.kit.model.clear()

    @rule()
    def abort_a_hanging_turn(self) -> None:
        self.kit.agent.push([AgentHang()])

        async def go() -> None:
            async with anyio.create_task_group() as group:
                group.start_soon(self.kit.runtime.prompt, "wait")
                await until(lambda: self.kit.runtime.state == "running")
                self.kit.runtime.abort()

        self.portal.call(go)

    @precondition(lambda self: len(self.kit.session.tree.entries) > 1)
    @rule(
        index=st.integers(min_value=0),
        summarize=st.booleans(),
        kind=st.sampled_from(sorted(SUMMARIES)),
    )
    def navigate(self, index: int, summarize: bool, kind: str) -> None:
        entries = self.kit.session.tree.entries
        target = entries[index % len(entries)]["id"]
        self._feed_summaries([kind])
        try:
            self.portal.call(lambda: self.kit.runtime.navigate(target, summarize=summarize))
        except ModelError:
            pass
        self.kit.model.clear()

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def one_automatic_compaction_per_turn(self) -> None:
        count = 0
        for event in self.kit.events:
            if event.type == "transition" and event.payload["event"] == "user_prompt":
                count = 0
            elif event.type == "auto_compaction_start":
                count += 1
                assert count <= 1, "two automatic compactions in one turn (D19)"

    @invariant()
    def nothing_partial_is_applied(self) -> None:
        committed = {
            r.data.get("entryId")
            for r in self.kit.journal.records()
            if r.machine == "operation" and r.dest == "committed"
        }
        for entry in self.kit.session.tree.entries:
            if entry["type"] in ("compaction", "branch_summary"):
                assert entry["id"] in committed or entry.get("fromExtension")
                assert entry["summary"].strip()

    @invariant()
    def stored_session_reloads(self) -> None:
        store = self.kit.session.store
        assert isinstance(store, MemoryStore)
        if not store.exists():
            return
        reloaded = Session.from_store(store)
        assert reloaded.problems == []
        assert reloaded.tree.entries == self.kit.session.tree.entries

    @invariant()
    def tool_results_follow_their_calls(self) -> None:
        called: set[str] = set()
        for message in self.kit.session.context().messages:
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    called.add(block["id"])
            if message.get("role") == "toolResult":
                assert message["toolCallId"] in called

    @invariant()
    def journal_transitions_are_legal(self) -> None:
        for record in self.kit.journal.records():
            defn = load_machine(record.machine)
            rows = defn.rows_for(record.source, record.event)
            assert any(r.dest == record.dest for r in rows), record

    @invariant()
    def turn_journal_replays_through_the_table(self) -> None:
        # Each turn record carries the facts its guards read: the table alone gives the same
        # destination and effects (D31).
        table = load_machine("turn")
        for record in self.kit.journal.records():
            if record.machine == "turn":
                facts = TurnFacts(**record.data["facts"])
                taken = step(table, record.source, record.event, facts)
                assert (taken.dest, taken.effects) == (record.dest, record.effects), record


RuntimeMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRuntimeMachine = RuntimeMachine.TestCase
