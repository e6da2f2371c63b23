"""The operation driver: failure kinds reach the caller, timeouts, and nothing outside the table.

"Nothing happens outside the table": the ports are instrumented, and every model call, store
write, sleep and event of an operation must follow a step whose row listed the effect that does
it; the journal then replays through the table to the same destinations and effects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from orchestrator._core.errors import (
    ConflictError,
    ContextOverflowError,
    ModelError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import load_machine, step
from orchestrator._rpc.errors import error_for
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator.testing import Hang
from orchestrator.testing._agent import reply
from tests.runtime_kit import SUMMARY, Kit, settings

pytestmark = pytest.mark.anyio

BIG = "x" * 4000


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    # trio's mock clock jumps ahead whenever every task waits, so timeouts take no real time.
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def two_turns(kit: Kit) -> None:
    # The last turn is small, so the cut lands on its user message: one summary request.
    await kit.runtime.prompt("first " + BIG)
    await kit.runtime.prompt("second " + BIG)
    await kit.runtime.prompt("third " + "y" * 1400)


def busy_kit(summaries: list[Any], **retry: Any) -> Kit:
    kit = Kit(
        turns=[
            [reply("one " + BIG, tokens=2000)],
            [reply("two " + BIG, tokens=3000)],
            [reply("three", tokens=3100)],
        ],
        summaries=summaries,
        runtime_settings=settings(adaptive_keep=False),
    )
    kit.runtime.summarizer = SummaryRoutes(
        candidates=(kit.model,),
        reserve_tokens=1000,
        retry=RetryPolicy(**retry),
        sleep=kit.clock.sleep,
    )
    return kit


async def test_a_failed_manual_compaction_keeps_the_failure_kind_and_retry_after() -> None:
    busy = TransientModelError("429 Too Many Requests", retry_after=7.0)
    kit = busy_kit([busy, busy], max_retries=1, base_delay_ms=1000)
    await two_turns(kit)
    with pytest.raises(ModelError) as caught:
        await kit.runtime.compact()
    assert (caught.value.kind, caught.value.retry_after) == ("transient", 7.0)
    assert kit.clock.sleeps == [7.0]  # the hint raised the 1 s backoff
    error = error_for(caught.value)
    assert error.data == {"kind": "transient", "retryAfter": 7.0}


async def test_by_default_a_hung_one_piece_summarizer_is_given_up_call_by_call() -> None:
    # A route that answers in one piece (no ``streams``) says nothing until it answers: each
    # call is cut after model_timeout_s (120 s) and retried, well within the 900 s deadline.
    kit = busy_kit([Hang(), Hang(), Hang(), Hang()])
    await two_turns(kit)
    with pytest.raises(ModelError, match="no answer after 120 s") as caught:
        await kit.runtime.compact()
    assert caught.value.kind == "timeout"
    assert len(kit.model.requests) == 4  # 120 s, then 2, 4 and 8 s waits between retries
    assert kit.clock.sleeps == [2.0, 4.0, 8.0]


async def test_a_hung_summarizer_times_out_and_the_kind_says_so() -> None:
    kit = busy_kit([Hang(), Hang()], max_retries=1, base_delay_ms=1000)
    await two_turns(kit)
    kit.runtime.settings = dataclasses.replace(
        settings(adaptive_keep=False), operation_deadline_s=None
    )
    before = list(kit.session.tree.entries)
    with pytest.raises(ModelError) as caught:
        await kit.runtime.compact()
    assert caught.value.kind == "timeout"
    assert "no answer after 120 s" in str(caught.value)
    assert len(kit.model.requests) == 2  # a timeout is retried like a transient failure
    assert list(kit.session.tree.entries) == before


class Recorder:
    """Instruments the ports: every step and every performed action, in order."""

    def __init__(self, kit: Kit) -> None:
        self.log: list[tuple[str, Any]] = []
        kit.runtime.events.subscribe(self._event)
        store = kit.session.store
        append, sleep = store.append, kit.clock.sleep

        def logged_append(entries: Any, **options: Any) -> Any:
            self.log.append(("write", [e["type"] for e in entries]))
            return append(entries, **options)

        async def logged_sleep(seconds: float) -> None:
            self.log.append(("sleep", seconds))
            await sleep(seconds)

        store.append = logged_append  # type: ignore[method-assign]
        kit.clock.sleep = logged_sleep  # type: ignore[method-assign]
        model = kit.model
        complete = model.complete

        async def logged_complete(request: ModelRequest) -> ModelResponse:
            self.log.append(("call", request.purpose))
            return await complete(request)

        model.complete = logged_complete  # type: ignore[method-assign]

    def _event(self, event: Any) -> None:
        if event.type == "transition":
            self.log.append(("step", event.payload))
        elif event.type != "message":
            self.log.append(("event", event.type))


# Which effect of the operation table performs each kind of action.
PERFORMED_BY = {
    "call": {"call_model"},
    "sleep": {"sleep_retry"},
    "write": {"append_entry", "rewrite_entries"},
    "event": {"emit_result", "run_hooks"},
}


async def test_nothing_happens_outside_the_operation_table() -> None:
    transient = TransientModelError("503")
    overflow = ContextOverflowError("prompt is too long")
    kit = busy_kit([transient, overflow, SUMMARY], max_retries=2, base_delay_ms=1000)
    await two_turns(kit)
    recorder = Recorder(kit)
    kit.runtime.summarizer = SummaryRoutes(
        candidates=(kit.model,), reserve_tokens=1000, sleep=kit.clock.sleep
    )
    outcome = await kit.runtime.compact()
    assert outcome.status == "committed"
    effects: set[str] = set()
    inside = False
    checked = 0
    for kind, what in recorder.log:
        if kind == "step":
            inside = what["machine"] == "operation"
            effects = set(what["effects"]) if inside else set()
            continue
        if not inside or (kind == "event" and what in ("compaction_update", "transition")):
            continue  # turn-machine work, and the step records themselves
        assert effects & PERFORMED_BY[kind], (kind, what, effects)
        checked += 1
    kinds = [k for k, _ in recorder.log if k != "step"]
    assert {"call", "sleep", "write"} <= set(kinds)
    assert checked >= 5

    # The journal replays through the table: same rows, same effects.
    records = [r for r in kit.journal.records() if r.machine == "operation"]
    assert records
    table = load_machine("operation")
    for record in records:
        taken = step(
            table, record.source, record.event, OperationFacts(**record.data.get("facts", {}))
        )
        assert (taken.dest, taken.effects) == (record.dest, record.effects)


async def a_hung_call_ends_at_the_deadline(seconds: float) -> None:
    """The operation deadline ends a call that never answers: failed, nothing applied."""
    kit = busy_kit([Hang()], max_retries=1, base_delay_ms=1000)
    await two_turns(kit)
    kit.runtime.settings = dataclasses.replace(
        settings(adaptive_keep=False), model_timeout_s=None, operation_deadline_s=seconds
    )
    before = list(kit.session.tree.entries)
    with pytest.raises(ModelError, match=f"did not finish within {seconds:g} s") as caught:
        await kit.runtime.compact()
    assert caught.value.kind == "timeout"
    assert list(kit.session.tree.entries) == before
    moves = [(s["source"], s["event"], s["dest"]) for s in kit.of("transition")]
    assert ("summarizing", "deadline_passed", "failed") in moves


async def test_the_operation_deadline_ends_a_hung_call_cleanly() -> None:
    await a_hung_call_ends_at_the_deadline(10.0)


async def test_the_operation_deadline_cancels_a_retry_wait() -> None:
    busy = TransientModelError("429", retry_after=20.0)
    kit = busy_kit([busy, SUMMARY], max_retries=1)
    await two_turns(kit)
    kit.runtime.summarizer = SummaryRoutes(
        candidates=(kit.model,), reserve_tokens=1000, sleep=anyio.sleep
    )
    kit.runtime.settings = dataclasses.replace(
        settings(adaptive_keep=False), operation_deadline_s=5.0
    )
    with pytest.raises(ModelError, match="within 5 s"):
        await kit.runtime.compact()
    assert len(kit.model.requests) == 1  # the wait was cut short; no second call
    moves = [(s["source"], s["event"], s["dest"]) for s in kit.of("transition")]
    assert ("waiting_retry", "deadline_passed", "failed") in moves


async def test_a_commit_that_conflicts_applies_nothing_and_says_so() -> None:
    kit = busy_kit([Hang()])
    await two_turns(kit)
    session = kit.session

    async def answer_after_another_writer(request: ModelRequest) -> ModelResponse:
        # Another program appends while the summary is being written.
        session.store.append([session.new_entry("custom", {"customType": "pi", "data": None})])
        return ModelResponse(text=SUMMARY)

    kit.model.complete = answer_after_another_writer  # type: ignore[method-assign]
    before = list(session.tree.entries)
    outcome = await kit.runtime.operations.compaction(reason="manual")
    assert outcome.status == "conflict"
    assert outcome.error is not None
    assert "nothing was applied" in outcome.error
    # Nothing of ours applied; the other program's entry read in at once, so the next
    # operation (automatic or asked for) works from what is there now (D27).
    [foreign] = [e for e in session.tree.entries if e["type"] == "custom"]
    assert [e["id"] for e in session.tree.entries] == [e["id"] for e in before] + [foreign["id"]]
    assert not any(e["type"] == "compaction" for e in session.tree.entries)
    moves = [(s["source"], s["event"], s["dest"]) for s in kit.of("transition")]
    assert ("committing", "append_conflict", "conflict") in moves
    kit.model.complete = lambda request: _summary()  # type: ignore[method-assign]
    again = await kit.runtime.operations.compaction(reason="manual")
    assert again.status == "committed"
    assert again.entry is not None
    assert again.entry["parentId"] == foreign["id"]


async def _summary() -> ModelResponse:
    return ModelResponse(text=SUMMARY)


async def test_a_manual_compaction_that_conflicts_says_why_not_cancelled() -> None:
    # A 429 retried away first: the conflict, not that old failure, is what the caller hears.
    busy = TransientModelError("429 Too Many Requests")
    kit = busy_kit([busy, SUMMARY], max_retries=1, base_delay_ms=10)
    await two_turns(kit)
    session = kit.session
    scripted = kit.model.complete

    async def answer_after_another_writer(request: ModelRequest) -> ModelResponse:
        response = await scripted(request)
        # Another program appends while the summary is being written (D27).
        session.store.append([session.new_entry("custom", {"customType": "pi", "data": None})])
        return response

    kit.model.complete = answer_after_another_writer  # type: ignore[method-assign]
    before = list(session.tree.entries)
    with pytest.raises(ConflictError, match="the session changed since it was read") as caught:
        await kit.runtime.compact()
    assert "429" not in str(caught.value)
    assert "nothing was applied" in str(caught.value)
    # Nothing of ours was applied; the other program's entry is read in, so that asking
    # again works from what is there now (D27).
    [foreign] = [e for e in session.tree.entries if e["type"] == "custom"]
    assert foreign.get("customType") == "pi"
    assert [e["id"] for e in session.tree.entries] == [e["id"] for e in before] + [foreign["id"]]
    assert session.leaf_id == foreign["id"]
    [record] = [r for r in kit.of("transition") if r["dest"] == "conflict"]
    assert record["event"] == "append_conflict"
    assert kit.runtime.turn.state == "idle"


async def test_the_deadline_failure_names_the_last_attempts_own_failure() -> None:
    # "did not finish within 10 s" alone hid the provider's 503 that every attempt met.
    unavailable = TransientModelError("503 Service Unavailable")
    kit = busy_kit([unavailable, Hang()], max_retries=2, base_delay_ms=1000)
    await two_turns(kit)
    kit.runtime.settings = dataclasses.replace(
        settings(adaptive_keep=False), model_timeout_s=None, operation_deadline_s=10.0
    )
    with pytest.raises(ModelError) as caught:
        await kit.runtime.compact()
    assert str(caught.value) == (
        "compaction did not finish within 10 s; the last attempt: 503 Service Unavailable"
    )
    assert caught.value.kind == "timeout"
