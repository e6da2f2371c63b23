"""Issue 9: how many operations start at once on one event loop (the loop-lag bound)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import sniffio
import trio

from orchestrator._runtime import admission
from orchestrator._runtime.admission import STARTS_AT_ONCE, start_slot
from orchestrator.testing import reply
from tests.runtime_kit import Kit, settings, summary

pytestmark = pytest.mark.anyio

BIG = "word " * 2000


async def ready_kit() -> Kit:
    """A session with two turns behind it: a compaction has something to summarize."""
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()] * 4,
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    return kit


class Passes:
    """Counts the event loop's passes while compactions run, so a test can say in which pass
    something happened.

    On asyncio a ticker task does (each ``sleep(0)`` lands in the next pass, and a pass runs
    its tasks in the order they became ready). trio runs each pass's tasks in a random order,
    so a ticker may run before or after the others in its pass; there an instrument counts the
    passes themselves (each begins after the scheduler's wait for I/O).
    """

    def __init__(self) -> None:
        self.count = 0

    def after_io_wait(self, timeout: float) -> None:
        del timeout
        self.count += 1

    async def compact_all(self, kits: list[Kit]) -> None:
        """Ask every kit's runtime for a compaction at once; return when all have ended."""
        if sniffio.current_async_library() == "trio":
            trio.lowlevel.add_instrument(self)  # type: ignore[arg-type]
            try:
                async with anyio.create_task_group() as compactions:
                    for kit in kits:
                        compactions.start_soon(kit.runtime.compact)
            finally:
                trio.lowlevel.remove_instrument(self)  # type: ignore[arg-type]
            assert all(kit.entry_types()[-1] == "compaction" for kit in kits)
            return
        done = anyio.Event()

        async def ticker() -> None:
            while not done.is_set():
                self.count += 1
                await anyio.sleep(0)

        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            async with anyio.create_task_group() as compactions:
                for kit in kits:
                    compactions.start_soon(kit.runtime.compact)
            done.set()
        assert all(kit.entry_types()[-1] == "compaction" for kit in kits)


def at_most_per_pass(passes: list[int]) -> int:
    """The most of ``passes`` (a pass number each) that fell in one pass."""
    return max(passes.count(p) for p in passes)


async def test_slots_are_taken_without_waiting_until_none_is_left() -> None:
    slots = [await start_slot() for _ in range(STARTS_AT_ONCE)]  # none of these yields
    order: list[int] = []

    async def late(index: int) -> None:
        slot = await start_slot()
        order.append(index)
        slot.release()

    async with anyio.create_task_group() as group:
        for index in range(3):
            group.start_soon(late, index)
            await anyio.wait_all_tasks_blocked()  # queued in this order, on either backend
        assert order == []  # every slot is held: the late ones queue
        slots[0].release()
        slots[0].release()  # idempotent: a second release frees nothing more
        await anyio.wait_all_tasks_blocked()
        assert order == [0, 1, 2]  # first come, first served, each freeing the slot for the next
        for slot in slots[1:]:
            slot.release()


async def test_many_compactions_asked_at_once_start_a_few_per_pass_of_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand compactions asked at once must not all plan in one pass of the event loop."""
    monkeypatch.setattr(admission, "STARTS_AT_ONCE", 3)
    kits = [await ready_kit() for _ in range(12)]
    passes = Passes()
    planned_in_pass = count_plans(monkeypatch, passes)
    await passes.compact_all(kits)
    assert len(planned_in_pass) == 12
    assert at_most_per_pass(planned_in_pass) <= 3, planned_in_pass


def count_plans(monkeypatch: pytest.MonkeyPatch, passes: Passes) -> list[int]:
    """The pass in which each compaction is planned, as they are (the list fills meanwhile)."""
    from orchestrator._runtime.operation import jobs

    planned_in_pass: list[int] = []
    real_job = jobs.CompactionJob

    def planning(*args: object, **kwargs: object) -> jobs.CompactionJob:
        planned_in_pass.append(passes.count)
        return real_job(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("orchestrator._runtime.operation.runner.CompactionJob", planning)
    return planned_in_pass


def count_first_steps(monkeypatch: pytest.MonkeyPatch, passes: Passes) -> list[int]:
    """The pass in which each turn takes its first step (the list fills meanwhile)."""
    from orchestrator._store.journal import Journal

    first_steps: list[int] = []
    real_write = Journal.write_step

    def write_step(self: Journal, step: object, **kwargs: object) -> None:
        if getattr(step, "machine", None) == "turn" and getattr(step, "source", None) == "idle":
            first_steps.append(passes.count)
        real_write(self, step, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Journal, "write_step", write_step)
    return first_steps


async def test_a_turn_hands_its_start_slot_to_the_compaction_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 9: the compaction a turn starts goes on with the turn's start slot. Given back and
    asked for again, the slot went to the back of the queue, behind every turn asked for
    meanwhile: a thousand compactions asked at once all took their turns' first steps (0.3 s)
    before the first of them planned, and the model's latency started that much later."""
    monkeypatch.setattr(admission, "STARTS_AT_ONCE", 3)
    kits = [await ready_kit() for _ in range(12)]
    passes = Passes()
    planned_in_pass = count_plans(monkeypatch, passes)
    first_steps = count_first_steps(monkeypatch, passes)
    queued: list[int] = []
    real_start = admission.start_slot

    async def queueing() -> admission.Slot:
        queued.append(passes.count)
        return await real_start()

    monkeypatch.setattr("orchestrator._runtime.operation.runner.start_slot", queueing)
    await passes.compact_all(kits)
    assert len(planned_in_pass) == 12
    # The first three turns' compactions plan before the last turn takes its first steps.
    assert sorted(planned_in_pass)[2] < max(first_steps), (planned_in_pass, first_steps)
    # No compaction a turn started asked for a slot of its own.
    assert queued == []


async def test_many_turns_asked_at_once_take_their_first_steps_a_few_per_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn's first steps (its records, up to its first effect in flight) never wait either:
    a thousand compactions asked at once must not all step their turns in one pass."""
    monkeypatch.setattr(admission, "STARTS_AT_ONCE", 3)
    kits = [await ready_kit() for _ in range(12)]
    passes = Passes()
    first_steps = count_first_steps(monkeypatch, passes)
    await passes.compact_all(kits)
    assert len(first_steps) == 12
    assert at_most_per_pass(first_steps) <= 3, first_steps


async def test_an_ended_operation_is_freed_without_the_cyclic_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 9: a thousand operations in flight made every full collection walk them all; an
    ended one holds no reference cycle, so reference counting frees it at once."""
    import gc
    import weakref

    from orchestrator._runtime.operation.run import OperationRun

    runs: list[weakref.ref[OperationRun]] = []
    real_init = OperationRun.__init__

    def init(self: OperationRun, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        runs.append(weakref.ref(self))

    monkeypatch.setattr(OperationRun, "__init__", init)
    kit = await ready_kit()
    gc.collect()
    gc.disable()
    try:
        outcome = await kit.runtime.compact()
        assert outcome.status == "committed"
        del outcome
        await anyio.sleep(0)
        assert runs
        assert [ref() for ref in runs] == [None] * len(runs)
    finally:
        gc.enable()


async def test_an_operation_takes_a_slot_again_when_its_model_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stretch after a wait (the answer's steps, the commit) never waits either: a
    thousand answers arriving together must not all commit in one pass of the loop."""
    taken: list[str] = []
    real_start = admission.start_slot

    async def counting_start() -> admission.Slot:
        taken.append("slot")
        return await real_start()

    # The turn and the operation take their slots through the scheduler layer (admission's).
    monkeypatch.setattr(admission, "start_slot", counting_start)
    monkeypatch.setattr("orchestrator._runtime.operation.runner.start_slot", counting_start)
    kit = await ready_kit()
    taken.clear()
    before = len(kit.model.requests)
    outcome = await kit.runtime.compact()
    assert outcome.status == "committed"
    calls = len(kit.model.requests) - before
    assert calls >= 1
    # One to start (the turn's, handed to the compaction), one again after each model call,
    # and one after the commit's disk work.
    assert len(taken) == 1 + calls + 1


async def test_a_compaction_whose_planning_fails_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan that raised kept its slot: eight such failures and no operation started again.
    The same for a prune whose job could not be made."""
    kit = await ready_kit()

    def failing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("planning failed")

    monkeypatch.setattr("orchestrator._runtime.operation.runner.CompactionJob", failing)
    monkeypatch.setattr("orchestrator._runtime.operation.runner.PruneJob", failing)
    asks: list[Callable[[], Awaitable[object]]] = [
        kit.runtime.compact,
        lambda: kit.runtime.operations.compaction(reason="manual"),
        kit.runtime.operations.prune,
    ]
    for ask in asks:
        with pytest.raises(RuntimeError, match="planning failed"):
            await ask()
        await anyio.sleep(0)  # a slot given back frees from the loop's next pass
        await anyio.sleep(0)
        assert admission._SLOTS.get().value == STARTS_AT_ONCE


async def test_a_split_turns_prefix_answered_early_is_taken_without_queueing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The prefix's attempt starts alongside the history's and answers first: when the table
    # reaches it, taking it waits for nothing, so the operation keeps its start slot instead of
    # giving it back and queueing behind every other operation for it again.
    from orchestrator._core.model import ModelRequest
    from orchestrator._core.tokens import CompactionSettings
    from orchestrator._runtime.operation.summarize import SummaryRoutes
    from orchestrator._runtime.session import AgentSession
    from orchestrator._runtime.types import RuntimeSettings
    from orchestrator._store.session import Session
    from orchestrator.testing import FunctionModel, summary_text
    from tests.sessions import split_turn

    s = split_turn()
    session = Session.in_memory()
    for entry in s.entries:
        session.add_entry(dict(entry))
    prefix_answered = anyio.Event()

    async def answer(request: ModelRequest) -> str:
        if request.purpose == "history":
            await prefix_answered.wait()
            await anyio.wait_all_tasks_blocked()  # the prefix's attempt has ended too
        else:
            prefix_answered.set()
        return summary_text(f"summary for {request.purpose}", purpose=request.purpose)

    taken: list[str] = []

    async def counted() -> admission.Slot:
        taken.append("slot")
        return await start_slot()

    monkeypatch.setattr(admission, "start_slot", counted)  # the scheduler layer's
    runtime = AgentSession(
        session,
        summarizer=SummaryRoutes(candidates=(FunctionModel(answer),), reserve_tokens=2000),
        settings=RuntimeSettings(
            compaction=CompactionSettings(keep_recent_tokens=150, adaptive_keep=False)
        ),
    )
    outcome = await runtime.compact()
    assert outcome.status == "committed"
    assert outcome.plan is not None
    assert outcome.plan.is_split_turn
    # Once for the turn's first steps, once after the history's answer, once after the
    # commit's disk work (none for the prefix).
    assert len(taken) == 3


async def test_a_free_turn_takes_its_first_step_without_waiting_a_pass_of_the_loop() -> None:
    # A thousand requests at once would otherwise each wait a pass of the loop for a lock that
    # nobody holds (anyio's Lock yields even when free, unless told not to).
    kit = await ready_kit()
    other_ran = False
    at_first_step: list[bool] = []

    def on_event(event: Any) -> None:
        if event.type == "transition" and event.payload["machine"] == "turn":
            at_first_step.append(other_ran)

    kit.runtime.events.subscribe(on_event)

    async def other() -> None:
        nonlocal other_ran
        other_ran = True

    async with anyio.create_task_group() as group:
        group.start_soon(other)  # runs as soon as this task first lets the loop go on
        assert (await kit.runtime.compact()).status == "committed"
    assert at_first_step[0] is False
