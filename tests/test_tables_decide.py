"""The table decides (D31): load a modified copy of a machine table and the behaviour follows it.

Each test runs the same operation twice, once with the shipped table and once with a copy that
has a row removed, a guard changed or two rows swapped, and shows the difference. On the code
before the runtime interpreted the tables, these edits changed nothing (tenacity decided and the
table only recorded), so each of these tests would have failed there.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator._core.errors import (
    ContextOverflowError,
    DefinitionError,
    ModelError,
    TransientModelError,
    TransitionError,
)
from orchestrator._core.resources import data_dir
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine
from orchestrator._runtime.driver import check_effects
from orchestrator._runtime.operation.jobs import CompactionJob
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.summarize import CompactionResult, SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator.testing import FakeClock, ScriptedModel, summary_text
from tests.sessions import two_turns_plan

pytestmark = pytest.mark.anyio

Rows = list[dict[str, Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def table(name: str, edit: Callable[[Rows], None] | None = None) -> MachineDef:
    """The shipped table, or a copy with ``edit`` applied to its rows."""
    if edit is None:
        return load_machine(name)
    data = tomllib.loads((data_dir("machines") / f"{name}.toml").read_text(encoding="utf-8"))
    edit(data["transitions"])
    return build(data, source=f"modified {name}.toml", guards=None, effects=None)


def index(rows: Rows, source: str, event: str, dest: str) -> int:
    return next(
        i
        for i, r in enumerate(rows)
        if r["source"] == source and r["event"] == event and r["dest"] == dest
    )


async def compact_with(defn: MachineDef, *models: ScriptedModel, clock: FakeClock) -> Any:
    routes = SummaryRoutes(candidates=models, retry=RetryPolicy(), sleep=clock.sleep)
    ports = Ports(session=None, routes=routes, sleep=clock.sleep, tables=lambda _name: defn)
    job = CompactionJob(
        ports, routes, reason="threshold", settings=CompactionSettings(), plan=two_turns_plan()
    )
    outcome = await OperationRun(ports, job, routes=routes, dry_run=True).run()
    return outcome


def transient() -> ModelError:
    return TransientModelError("503 Service Unavailable")


async def test_without_the_retry_row_a_transient_error_goes_to_the_next_candidate() -> None:
    def drop_retry(rows: Rows) -> None:
        del rows[index(rows, "summarizing", "attempt_failed", "waiting_retry")]

    for defn, sleeps, winner in [
        (table("operation"), [2.0], "scripted/a"),
        (table("operation", drop_retry), [], "scripted/b"),
    ]:
        clock = FakeClock()
        a = ScriptedModel([transient(), summary_text("from a")], name="scripted/a")
        b = ScriptedModel([summary_text("from b")], name="scripted/b")
        outcome = await compact_with(defn, a, b, clock=clock)
        assert outcome.status == "committed"
        assert isinstance(outcome.result, CompactionResult)
        assert outcome.result.model == winner
        assert clock.sleeps == sleeps


async def test_without_the_shrink_row_an_overflow_fails_the_operation() -> None:
    def drop_shrink(rows: Rows) -> None:
        del rows[index(rows, "summarizing", "summary_overflow", "summarizing")]

    overflow = ContextOverflowError("prompt is too long")
    model = ScriptedModel([overflow, summary_text("fits now")], name="scripted/a")
    shipped = await compact_with(table("operation"), model, clock=FakeClock())
    assert shipped.status == "committed"
    assert len(model.requests) == 2

    model = ScriptedModel([overflow, summary_text("never asked")], name="scripted/a")
    modified = await compact_with(table("operation", drop_shrink), model, clock=FakeClock())
    assert (modified.status, modified.error_kind) == ("failed", "overflow")
    assert len(model.requests) == 1


async def test_a_changed_guard_retries_what_the_shipped_table_passes_on() -> None:
    # Without the `retryable` guard, the wait-and-retry row takes a fatal error too.
    def retry_anything(rows: Rows) -> None:
        row = rows[index(rows, "summarizing", "attempt_failed", "waiting_retry")]
        row["guards"] = ["retries_left", "delay_within_limit"]

    for defn, winner, sleeps in [
        (table("operation"), "scripted/b", []),
        (table("operation", retry_anything), "scripted/a", [2.0]),
    ]:
        clock = FakeClock()
        a = ScriptedModel([ModelError("bad request"), summary_text("from a")], name="scripted/a")
        b = ScriptedModel([summary_text("from b")], name="scripted/b")
        outcome = await compact_with(defn, a, b, clock=clock)
        assert outcome.result.model == winner
        assert clock.sleeps == sleeps


async def test_swapped_rows_change_which_one_wins() -> None:
    # With "next candidate" before "wait and retry", a transient error on the first candidate
    # moves on at once instead of waiting.
    def swap(rows: Rows) -> None:
        i = index(rows, "summarizing", "attempt_failed", "waiting_retry")
        j = index(rows, "summarizing", "attempt_failed", "summarizing")
        rows[i], rows[j] = rows[j], rows[i]

    clock = FakeClock()
    a = ScriptedModel([transient(), summary_text("from a")], name="scripted/a")
    b = ScriptedModel([summary_text("from b")], name="scripted/b")
    outcome = await compact_with(table("operation", swap), a, b, clock=clock)
    assert outcome.result.model == "scripted/b"
    assert clock.sleeps == []
    assert len(a.requests) == 1


def test_swapping_an_unguarded_row_first_is_refused_at_load() -> None:
    def swap(rows: Rows) -> None:
        i = index(rows, "summarizing", "summary_ready", "summarizing")
        j = index(rows, "summarizing", "summary_ready", "committing")
        rows[i], rows[j] = rows[j], rows[i]

    with pytest.raises(DefinitionError, match="can never fire"):
        table("operation", swap)


async def test_a_refused_step_raises_and_is_not_a_model_failure() -> None:
    # Without the wait_done row, the end of a retry wait is an event the table refuses.
    def drop_wait_done(rows: Rows) -> None:
        del rows[index(rows, "waiting_retry", "wait_done", "summarizing")]

    model = ScriptedModel([transient(), summary_text("ok")], name="scripted/a")
    with pytest.raises(TransitionError, match="wait_done"):
        await compact_with(table("operation", drop_wait_done), model, clock=FakeClock())


def test_the_effect_table_is_checked_against_the_machine() -> None:
    defn = load_machine("operation")
    with pytest.raises(DefinitionError, match="no driver effect for call_model"):
        check_effects(defn, {name: None for name in _operation_effects() if name != "call_model"})
    with pytest.raises(DefinitionError, match="outside its vocabulary: summon"):
        check_effects(defn, {**{name: None for name in _operation_effects()}, "summon": None})


def _operation_effects() -> set[str]:
    return {e for row in load_machine("operation").rows for e in row.effects}


async def test_navigation_with_a_stricter_summary_guard_moves_the_leaf_without_a_summary() -> None:
    import dataclasses

    from orchestrator._runtime.navigation.driver import Navigator
    from orchestrator.testing import reply
    from tests.runtime_kit import Kit, summary

    # Removing the row would leave `summarizing` unreachable, which the loader refuses; a guard
    # that cannot hold here (the target is not the current leaf) disables it instead.
    def no_summary(rows: Rows) -> None:
        row = rows[index(rows, "consulting_hooks", "hooks_done", "summarizing")]
        row["guards"] = [*row["guards"], "same_position"]

    for defn, summarized in [(table("navigation"), True), (table("navigation", no_summary), False)]:
        kit = Kit(
            turns=[[reply("answer one")], [reply("answer two")]],
            summaries=[summary(summary_text("Tried another approach."))],
        )
        await kit.runtime.prompt("first question")
        await kit.runtime.prompt("second question")
        first_answer = kit.session.tree.entries[1]["id"]
        ports = dataclasses.replace(kit.runtime.ports, tables=_always(defn))
        kit.runtime.navigator = Navigator(
            ports,
            kit.runtime.operations,
            branch_reserve_tokens=16384,
            turn_running=lambda: False,
        )
        result = await kit.runtime.navigate(first_answer, summarize=True)
        assert (result.summary_entry is not None) is summarized
        assert len(kit.model.requests) == (1 if summarized else 0)
        assert kit.session.leaf_id == (result.summary_entry or {"id": first_answer})["id"]


def _always(defn: MachineDef) -> Callable[[str], MachineDef]:
    return lambda _name: defn
