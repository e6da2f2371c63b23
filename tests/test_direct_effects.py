"""Work in flight runs in the loop's own task where the table leaves no choice (issue 9).

An awaiting effect (a model call, a retry wait, the agent, a compaction inside a turn) used to run
in a child task, so that an interrupt could be stepped while it waited. Where every row an
interrupt can take stops that work first (``scheduler.direct_states``), the interrupt cancels the
work itself and the loop steps it afterwards; the work runs in the loop's task, with no child
task, event and loop passes to start it and hear from it. These tests pin down which states
qualify, that the work really runs in the caller's task there, and that interrupting it still
ends the way the table says.
"""

from __future__ import annotations

import tomllib
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sniffio

from orchestrator._core.errors import Cancelled
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._core.resources import data_dir
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.driver import Interpreter, Report
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.scheduler import direct_states
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.session import Session
from orchestrator.testing import Hang, ScriptedModel
from orchestrator.testing._agent import reply
from tests.cli_kit import either_part
from tests.runtime_kit import BIG, Kit, settings, summary, until
from tests.sessions import split_turn

pytestmark = pytest.mark.anyio


class TaskModel(ScriptedModel):
    """A scripted model that notes the task each call ran in."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(script, name="scripted/summarizer")
        self.tasks: list[int] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.tasks.append(anyio.get_current_task().id)
        return await super().complete(request)


def kit_with(model: ScriptedModel) -> Kit:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        runtime_settings=settings(adaptive_keep=False),
    )
    kit.model = model
    kit.runtime.summarizer = kit.summarizer = type(kit.summarizer)(
        candidates=(model,),
        reserve_tokens=kit.summarizer.reserve_tokens,
        retry=kit.summarizer.retry,
        sleep=kit.summarizer.sleep,
    )
    return kit


def modified(name: str, event: str, source: str, effects: list[str]) -> MachineDef:
    """The shipped table with the effects of the ``event`` row from ``source`` replaced."""
    data = tomllib.loads((data_dir("machines") / f"{name}.toml").read_text(encoding="utf-8"))
    for row in data["transitions"]:
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        if row["event"] == event and source in sources:
            row["effects"] = effects
    return build(data, source=f"modified {name}.toml", guards=None, effects=None)


def test_the_shipped_tables_run_in_task_where_every_interrupt_stops_the_work() -> None:
    turn = direct_states(load_machine("turn"))
    assert {"running", "retrying", "compacting", "manual_compacting"} <= turn
    # An abort during a prune or a continuation does not stop it: a child task still runs it.
    assert not {"pruning", "continuing", "idle"} & turn
    operation = direct_states(load_machine("operation"))
    assert {"consulting_hooks", "summarizing", "waiting_retry"} <= operation
    navigation = direct_states(load_machine("navigation"))
    assert "consulting_hooks" in navigation
    # Cancelling a branch summary asks its operation and waits: it may still commit.
    assert "summarizing" not in navigation


def test_a_row_that_does_not_stop_the_work_keeps_the_child_task() -> None:
    table = modified("operation", "cancel", "summarizing", ["emit_result"])
    states = direct_states(table)
    assert "summarizing" not in states
    assert "preparing" not in states  # the row edited is shared by every source it lists
    assert "committing" in states  # no interrupt is listed there


async def test_a_compactions_model_call_runs_in_the_callers_task() -> None:
    model = TaskModel([summary()])
    kit = kit_with(model)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    outcome = await kit.runtime.compact()
    assert outcome.status == "committed"
    # The turn's compaction and the operation's model call: no child task between them.
    assert model.tasks == [anyio.get_current_task().id]


async def test_an_abort_during_the_call_in_task_still_settles_through_the_tables() -> None:
    model = TaskModel([Hang()])
    kit = kit_with(model)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    before = list(kit.session.tree.entries)
    errors: list[BaseException] = []
    compacting: list[int] = []

    async def compact() -> None:
        compacting.append(anyio.get_current_task().id)
        try:
            await kit.runtime.compact()
        except Cancelled as error:
            errors.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(compact)
        await until(lambda: len(model.tasks) == 1)
        kit.runtime.abort_compaction()
    assert model.tasks == compacting  # the hung call ran in the caller's task, and was cancelled
    assert len(errors) == 1
    assert kit.session.tree.entries == before
    operation = [r for r in kit.journal.records() if r.machine == "operation"]
    assert (operation[-1].source, operation[-1].event, operation[-1].dest) == (
        "summarizing",
        "cancel",
        "cancelled",
    )
    assert ("manual_compacting", "abort", "idle") in kit.turn_path()
    # The turn still knows which operation it cancelled (settled before its stop effect ran).
    outcome = kit.runtime.turn.counters.outcome
    assert outcome is not None
    assert (outcome.status, outcome.operation_id) == ("cancelled", operation[-1].operation_id)
    assert [u["status"] for u in kit.of("compaction_update")][-1] == "cancelled"


def interpreter(name: str = "operation", state: str = "summarizing") -> Interpreter:
    table = load_machine(name)
    effects = {effect: _nothing for row in table.rows for effect in row.effects}
    return Interpreter(table, effects, state=state)


async def _nothing() -> Report | None:
    return None


async def test_an_interrupt_asked_for_before_the_work_starts_cancels_it_at_once() -> None:
    machine = interpreter()
    machine.interrupt("cancel")
    seen: list[str] = []

    async def work() -> Report:
        seen.append("started")
        try:
            await anyio.sleep_forever()
        finally:
            seen.append("cancelled")
        return Report(outcome=ReportOutcome.OK)  # pragma: no cover - never reached

    async with anyio.create_task_group() as group:
        assert await machine.in_flight(group, work) is None
        await machine.stop_in_flight()  # the row's stop effect: nothing left to stop
    assert seen == ["started", "cancelled"]
    assert machine.take_listed_interrupt() == "cancel"


async def test_work_that_finishes_before_the_cancel_lands_still_reports() -> None:
    machine = interpreter()

    async def work() -> Report:
        machine.interrupt("deadline_passed")  # from inside: lands at the next checkpoint
        return Report(outcome=ReportOutcome.OK)

    async with anyio.create_task_group() as group:
        report = await machine.in_flight(group, work)
    assert report == Report(outcome=ReportOutcome.OK)
    assert machine.take_listed_interrupt() == "deadline_passed"  # the loop still steps it


async def test_an_interrupt_the_state_does_not_list_leaves_the_work_to_report() -> None:
    machine = interpreter("turn", "running")

    async def work() -> Report:
        machine.interrupt("manual_compact")  # listed in running: stops the agent
        await anyio.lowlevel.checkpoint()
        return Report(outcome=ReportOutcome.OK)  # pragma: no cover - cancelled at the checkpoint

    async with anyio.create_task_group() as group:
        assert await machine.in_flight(group, work) is None

    quiet = interpreter("operation", "committing")  # cancel is not listed while committing

    async def commit() -> Report:
        quiet.interrupt("cancel")
        await anyio.lowlevel.checkpoint()
        return Report(outcome=ReportOutcome.OK)

    async with anyio.create_task_group() as group:
        assert await quiet.in_flight(group, commit) == Report(outcome=ReportOutcome.OK)


def test_an_event_the_machine_does_not_declare_as_an_interrupt_is_refused() -> None:
    machine = interpreter()
    with pytest.raises(ValueError, match="'summary_ready' is not an interrupt of this machine"):
        machine.interrupt("summary_ready")
    assert machine.take_interrupt() is None


async def test_an_operation_opens_a_task_group_only_when_it_may_start_a_child_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups: list[str] = []
    real = anyio.create_task_group

    def counted() -> Any:
        groups.append("group")
        return real()

    model = TaskModel([summary()])
    kit = kit_with(model)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    monkeypatch.setattr(anyio, "create_task_group", counted)
    outcome = await kit.runtime.compact()
    assert outcome.plan is not None
    assert not outcome.plan.is_split_turn
    if sniffio.current_async_library() == "asyncio":
        # The turn's: the operation starts no child task (its deadline is a loop callback).
        assert groups == ["group"]
    else:
        assert groups == ["group", "group"]  # trio has no timed callbacks: a timer task
    groups.clear()
    split = split_runtime()
    outcome = await split.compact()
    assert outcome.plan is not None
    assert outcome.plan.is_split_turn
    assert groups == ["group", "group"]  # the prefix's attempt starts early, in a child task


def split_runtime() -> AgentSession:
    """A runtime over a session whose compaction cuts a turn (two requests, sent together)."""
    s = split_turn()
    session = Session.in_memory()
    for entry in s.entries:
        session.add_entry(dict(entry))
    return AgentSession(
        session,
        summarizer=SummaryRoutes(
            candidates=(ScriptedModel([either_part("h"), either_part("p")]),), reserve_tokens=2000
        ),
        settings=RuntimeSettings(
            compaction=CompactionSettings(keep_recent_tokens=150, adaptive_keep=False)
        ),
    )
