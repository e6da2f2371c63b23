"""The scheduler layer (``_runtime/scheduler.py``): work in flight, its stop, and memory.

The interpreter delegates how an effect waits to :class:`Scheduler`; these tests pin down the
parts of it the drivers reach only on rare paths: a child task stopped or waited for, work that
needs a task group and has none, a bound method whose object was freed, and the per-table cache
staying bounded.
"""

from __future__ import annotations

import functools
import gc

import anyio
import pytest

from orchestrator._lifecycle.machine import load_machine
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime import scheduler
from orchestrator._runtime.driver import Report
from orchestrator._runtime.scheduler import Scheduler, direct_states, per_table, weakly

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_work_in_a_child_task_is_stopped_by_the_rows_stop_effect() -> None:
    turn = load_machine("turn")
    assert "pruning" not in direct_states(turn)  # an abort does not stop a prune: a child task
    work_in_flight = Scheduler(turn)
    seen: list[str] = []

    async def prune() -> Report:
        seen.append("started")
        try:
            await anyio.sleep_forever()
        finally:
            seen.append("stopped")
        return Report(outcome=ReportOutcome.OK)  # pragma: no cover - never reached

    async def abort_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        work_in_flight.request("abort", "pruning")

    async with anyio.create_task_group() as group:
        group.start_soon(abort_soon)
        assert await work_in_flight.run(prune, "pruning", group) is None  # the abort came first
        assert seen == ["started"]  # still running: the row's own stop effect ends it
        await work_in_flight.stop()
        await work_in_flight.stop()  # nothing left to stop
    assert seen == ["started", "stopped"]
    assert work_in_flight.take_listed("pruning") == "abort"


async def test_settle_waits_for_the_work_in_flight_to_report_on_its_own() -> None:
    turn = load_machine("turn")
    work_in_flight = Scheduler(turn)
    release = anyio.Event()
    seen: list[str] = []

    async def prune() -> Report:
        await release.wait()
        seen.append("reported")
        return Report(outcome=ReportOutcome.OK)

    async def abort_then_release() -> None:
        await anyio.wait_all_tasks_blocked()
        work_in_flight.request("abort", "pruning")
        await anyio.wait_all_tasks_blocked()
        release.set()

    async with anyio.create_task_group() as group:
        group.start_soon(abort_then_release)
        assert await work_in_flight.run(prune, "pruning", group) is None
        await work_in_flight.settle()  # shielded: the prune ends by itself, not cancelled
        assert seen == ["reported"]
        await work_in_flight.settle()  # nothing in flight any more


async def test_work_that_needs_a_child_task_and_has_no_group_is_a_driver_bug() -> None:
    async def prune() -> Report:  # pragma: no cover - never started
        return Report(outcome=ReportOutcome.OK)

    with pytest.raises(RuntimeError, match="turn: work in flight in pruning needs a task group"):
        await Scheduler(load_machine("turn")).run(prune, "pruning", None)


def test_a_weakly_bound_method_refuses_once_its_object_is_freed() -> None:
    class Driver:
        def name(self) -> str:
            return "driver"

    driver = Driver()
    call = weakly(driver.name)
    assert call() == "driver"
    del driver
    gc.collect()
    with pytest.raises(ReferenceError, match="Driver.name: its object was freed"):
        call()


def test_the_per_table_cache_stays_bounded_and_recomputes_what_it_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "_PER_TABLE", {})
    table = load_machine("operation")
    computed: list[int] = []

    def compute(n: int) -> int:
        computed.append(n)
        return n

    for n in range(600):
        assert per_table(table, n, functools.partial(compute, n)) == n
    assert len(scheduler._PER_TABLE) <= 513
    assert per_table(table, 599, lambda: compute(-1)) == 599  # kept: not computed again
    assert per_table(table, 0, lambda: compute(0)) == 0  # dropped when the cache was cleared
    assert computed[-1] == 0
    assert len(computed) == 601
