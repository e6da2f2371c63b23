"""The navigator: the table decides, and nothing happens outside it (issue 7, D31).

"The table decides": each test runs the same navigation with the shipped ``navigation.toml`` and
with a copy that has a row removed, a guard changed or two rows swapped, and shows that the
behaviour follows the copy. "Nothing outside the table": the ports are instrumented (hooks,
summary model, branch-summary operation, store writes, leaf moves, context rebuilds, events),
and every action of a navigation must be performed by an effect of the navigation step taken
just before it, in the order of that row's effects (the branch summary's own actions by the
operation table's rows, inside the ``start_summary`` effect); the journal then replays through
the table to the same steps. Before the navigator stepped every navigation through the table,
a refused or same-position navigation was decided in Python and the journal kept no facts, and
these tests failed.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator._core.entries import Message
from orchestrator._core.errors import SessionError, TransitionError
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._core.resources import data_dir
from orchestrator._lifecycle.guards import NavigationFacts
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine, step
from orchestrator._runtime.agent import AgentInput
from orchestrator._runtime.navigation.driver import BUSY
from orchestrator._runtime.types import NavigationResult
from orchestrator._runtime.wiring import wire
from orchestrator.testing import AgentHang, Hang, reply, summary_text
from tests.runtime_kit import Kit, summary, until

pytestmark = pytest.mark.anyio

Rows = list[dict[str, Any]]
BRANCH_SUMMARY = summary_text("Tried another approach.")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def nav_table(edit: Callable[[Rows], None] | None = None) -> MachineDef:
    """The shipped navigation table, or a copy with ``edit`` applied to its rows."""
    if edit is None:
        return load_machine("navigation")
    text = (data_dir("machines") / "navigation.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    edit(data["transitions"])
    return build(data, source="modified navigation.toml", guards=None, effects=None)


def row(rows: Rows, source: str, event: str, dest: str, guard: str | None = None) -> int:
    return next(
        i
        for i, r in enumerate(rows)
        if (r["source"], r["event"], r["dest"]) == (source, event, dest)
        and (guard is None or guard in r.get("guards", []))
    )


def drive(kit: Kit, defn: MachineDef) -> None:
    """Rewire the kit's session so its navigator steps ``defn`` (the other tables are shipped)."""
    runtime = kit.runtime
    ports = dataclasses.replace(
        runtime.ports, tables=lambda name: defn if name == "navigation" else load_machine(name)
    )
    runtime.ports, runtime.operations, runtime.turn, runtime.navigator = wire(
        ports, runtime.settings, runtime.turn
    )


def nav_kit(summaries: list[Any] | None = None, turns: int = 2) -> Kit:
    answers = [[reply(f"answer {n}")] for n in range(1, turns + 1)]
    return Kit(turns=answers, summaries=summaries or [summary(BRANCH_SUMMARY)])


async def conversation(kit: Kit) -> dict[str, str]:
    """u1 a1 u2 a2 (a2 is the leaf). Returns the ids by name."""
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


def path(kit: Kit) -> list[tuple[str, str, str]]:
    return [
        (e["source"], e["event"], e["dest"])
        for e in kit.of("transition")
        if e["machine"] == "navigation"
    ]


class Gate:
    """A summary model call that answers only once the gate opens (cancellation ends it too)."""

    def __init__(self, kit: Kit) -> None:
        self.open = anyio.Event()
        self.calls = 0

        async def complete(request: ModelRequest) -> ModelResponse:
            self.calls += 1
            await self.open.wait()
            return summary(BRANCH_SUMMARY)

        kit.model.complete = complete  # type: ignore[method-assign]


# -- the table decides ------------------------------------------------------------------------


async def test_without_the_same_position_row_navigating_to_the_leaf_asks_the_hooks() -> None:
    def no_same_position(rows: Rows) -> None:
        del rows[row(rows, "idle", "navigate", "done", "same_position")]

    for defn, moved in [(nav_table(), False), (nav_table(no_same_position), True)]:
        kit = nav_kit()
        ids = await conversation(kit)
        asked: list[dict[str, Any]] = []
        kit.runtime.hooks.on("session_before_tree", asked.append)
        drive(kit, defn)
        result = await kit.runtime.navigate(ids["a2"], summarize=True)
        assert kit.session.leaf_id == ids["a2"]
        assert kit.model.requests == []  # nothing to summarize either way
        assert not kit.runtime.is_navigating
        if moved:
            # The table says: collect (nothing), ask the hooks, make the plain move.
            assert [p["preparation"]["entriesToSummarize"] for p in asked] == [[]]
            assert path(kit) == [
                ("idle", "navigate", "collecting"),
                ("collecting", "collected", "consulting_hooks"),
                ("consulting_hooks", "hooks_done", "switching_leaf"),
                ("switching_leaf", "switched", "done"),
            ]
            assert len(kit.of("session_tree")) == 1
        else:
            assert asked == []
            assert path(kit) == [("idle", "navigate", "done")]
            assert kit.of("session_tree") == []
            assert result == NavigationResult(new_leaf_id=ids["a2"], old_leaf_id=ids["a2"])


async def abort_during_the_summary(defn: MachineDef) -> tuple[Kit, dict[str, str], Any]:
    """Navigate with a summary, abort while the model is asked, then let the model answer."""
    kit = nav_kit()
    gate = Gate(kit)
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    drive(kit, defn)
    results: list[NavigationResult] = []

    async def navigate() -> None:
        results.append(await kit.runtime.navigate(ids["a1"], summarize=True))

    async with anyio.create_task_group() as group:
        group.start_soon(navigate)
        await until(lambda: gate.calls == 1)
        kit.runtime.abort_branch_summary()
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        gate.open.set()
    [result] = results
    return kit, ids, (result, before)


async def test_without_the_cancel_row_an_abort_during_the_summary_changes_nothing() -> None:
    def no_cancel(rows: Rows) -> None:
        del rows[row(rows, "summarizing", "cancel", "cancelled")]

    kit, ids, (result, before) = await abort_during_the_summary(nav_table())
    assert (result.cancelled, result.aborted) == (True, True)
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]
    assert path(kit)[-1] == ("summarizing", "cancel", "cancelled")

    kit, ids, (result, before) = await abort_during_the_summary(nav_table(no_cancel))
    assert result.cancelled is False
    assert result.summary_entry is not None
    assert kit.session.leaf_id == result.summary_entry["id"]
    assert ("summarizing", "cancel", "cancelled") not in path(kit)
    assert path(kit)[-1] == ("summarizing", "summary_committed", "done")


async def navigate_while_a_turn_runs(defn: MachineDef) -> tuple[Kit, list[str], list[Any]]:
    """While a turn runs, navigate to the current leaf, then to another entry."""
    kit = nav_kit()
    ids = await conversation(kit)
    drive(kit, defn)
    gate = anyio.Event()

    class Gated:
        async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
            await gate.wait()
            yield {"role": "assistant", "content": [{"type": "text", "text": "done"}]}

    kit.runtime.agent = Gated()
    errors: list[str] = []
    results: list[NavigationResult] = []

    async def navigate() -> None:
        await until(lambda: kit.runtime.state == "running")
        leaf = kit.session.leaf_id
        assert leaf is not None
        for target in (leaf, ids["a1"]):
            try:
                results.append(await kit.runtime.navigate(target))
            except SessionError as error:
                errors.append(str(error))
        gate.set()

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "third question")
        group.start_soon(navigate)
    assert kit.entry_types()[-2:] == ["message:user", "message:assistant"]
    return kit, errors, results


async def test_swapped_rows_make_the_same_position_a_no_op_even_while_a_turn_runs() -> None:
    # With the same-position row before the refusal row, navigating to the current leaf while a
    # turn runs is a no-op instead of a refusal; any other target is still refused.
    def swap(rows: Rows) -> None:
        i = row(rows, "idle", "navigate", "refused", "turn_running")
        j = row(rows, "idle", "navigate", "done", "same_position")
        rows[i], rows[j] = rows[j], rows[i]

    kit, errors, results = await navigate_while_a_turn_runs(nav_table())
    assert (errors, results) == ([BUSY, BUSY], [])
    assert [dest for _, _, dest in path(kit)] == ["refused", "refused"]

    kit, errors, results = await navigate_while_a_turn_runs(nav_table(swap))
    assert errors == [BUSY]
    assert [r.new_leaf_id == r.old_leaf_id for r in results] == [True]
    assert [dest for _, _, dest in path(kit)] == ["done", "refused"]


async def test_without_the_asked_for_hook_summary_row_a_hook_summary_is_ignored() -> None:
    def no_hook_summary(rows: Rows) -> None:
        del rows[row(rows, "consulting_hooks", "hook_supplied", "switching_leaf", "wants_summary")]

    for defn, attached in [(nav_table(), True), (nav_table(no_hook_summary), False)]:
        kit = nav_kit()
        ids = await conversation(kit)
        kit.runtime.hooks.on(
            "session_before_tree", lambda p: {"summary": {"summary": "from the hook"}}
        )
        drive(kit, defn)
        result = await kit.runtime.navigate(ids["a1"], summarize=True)
        assert kit.model.requests == []  # a supplied summary never asks the model
        assert (result.summary_entry is not None) is attached
        if attached:
            assert result.summary_entry is not None
            assert result.summary_entry["summary"] == "from the hook"
            assert kit.session.leaf_id == result.summary_entry["id"]
        else:
            assert kit.session.leaf_id == ids["a1"]
            assert "branch_summary" not in kit.entry_types()
        [tree] = kit.of("session_tree")
        assert (tree["summaryEntryId"] is not None) is attached


async def test_without_the_hook_cancel_row_a_hook_cancel_is_refused_and_nothing_changes() -> None:
    def no_hook_cancel(rows: Rows) -> None:
        del rows[row(rows, "consulting_hooks", "hooks_cancelled", "cancelled")]

    kit = nav_kit()
    ids = await conversation(kit)
    kit.runtime.hooks.on("session_before_tree", lambda p: {"cancel": True})
    before = list(kit.session.tree.entries)
    result = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert result.cancelled is True

    drive(kit, nav_table(no_hook_cancel))
    with pytest.raises(TransitionError, match="hooks_cancelled"):
        await kit.runtime.navigate(ids["a1"], summarize=True)
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]
    assert kit.model.requests == []
    assert not kit.runtime.is_navigating  # the refused step ended that navigation


# -- nothing happens outside the table --------------------------------------------------------

# Which effects of the navigation table may perform each kind of action.
PERFORMED_BY: dict[str, set[str]] = {
    "hook:session_before_tree": {"run_hooks"},
    "hook:session_tree": {"emit_session_tree"},
    "event:session_tree": {"emit_session_tree"},
    "operation": {"start_summary"},
    "cancel": {"cancel_summary"},
    "leaf": {"switch_leaf", "switch_leaf_with_summary"},
    "write:branch_summary": {"switch_leaf_with_summary"},
    "write:label": {"emit_session_tree"},
    "context": {"rebuild_context"},
}
# Which effects of the operation table may perform each kind of action (its own tests check
# them in detail, tests/test_operation_driver.py); they run inside ``start_summary``.
NAVIGATION_ONLY = set(PERFORMED_BY) - {"context"}
OPERATION_PERFORMED_BY: dict[str, set[str]] = {
    "call": {"call_model"},
    "write:branch_summary": {"append_entry"},
    "context": {"rebuild_context"},
}


class Recorder:
    """Instruments a session's ports: every step and every action, in order."""

    def __init__(self, kit: Kit) -> None:
        self.log: list[tuple[str, Any]] = []
        runtime, session = kit.runtime, kit.session
        runtime.events.subscribe(self._event)
        for name in ("session_before_tree", "session_tree"):
            runtime.hooks.on(name, self._hook(name))
        store, operations, model = session.store, runtime.operations, kit.model
        append, complete = store.append, model.complete
        branch_summary, cancel = operations.branch_summary, operations.cancel
        branch, reset_leaf, context = session.branch, session.reset_leaf, session.context

        def logged_append(entries: Any, **options: Any) -> Any:
            for entry in entries:
                self.log.append(("write:" + entry["type"], entry["id"]))
            return append(entries, **options)

        async def logged_complete(request: ModelRequest) -> ModelResponse:
            self.log.append(("call", request.purpose))
            return await complete(request)

        async def logged_branch_summary(*args: Any, **options: Any) -> Any:
            self.log.append(("operation", options["new_leaf_id"]))
            return await branch_summary(*args, **options)

        def logged_cancel() -> None:
            self.log.append(("cancel", None))
            cancel()

        def logged_branch(entry_id: str) -> None:
            self.log.append(("leaf", entry_id))
            branch(entry_id)

        def logged_reset_leaf() -> None:
            self.log.append(("leaf", None))
            reset_leaf()

        def logged_context(leaf_id: str | None = None) -> Any:
            self.log.append(("context", leaf_id))
            return context(leaf_id)

        store.append = logged_append  # type: ignore[method-assign]
        model.complete = logged_complete  # type: ignore[method-assign]
        operations.branch_summary = logged_branch_summary  # type: ignore[method-assign]
        operations.cancel = logged_cancel  # type: ignore[method-assign]
        session.branch = logged_branch  # type: ignore[method-assign]
        session.reset_leaf = logged_reset_leaf  # type: ignore[method-assign]
        session.context = logged_context  # type: ignore[method-assign]

    def _hook(self, name: str) -> Callable[[dict[str, Any]], None]:
        return lambda payload: self.log.append(("hook:" + name, payload["type"]))

    def _event(self, event: Any) -> None:
        if event.type == "transition":
            self.log.append(("step", event.payload))
        elif event.type not in ("message", "hook_error"):
            self.log.append(("event:" + event.type, event.payload))


def check_inside_the_table(log: list[tuple[str, Any]]) -> int:
    """Each action follows a step whose effects perform it, in the row's effect order.

    An action belongs to the machine of the step before it: a branch-summary operation's steps
    (which come only while a navigation row's ``start_summary`` or ``cancel_summary`` is
    performed) own the actions up to the next step. A navigation step that lists no effects
    (refused, a no-op, cancelled) performs nothing, so a turn running beside it keeps owning
    what follows; the turn's own actions are checked in tests/test_turn_driver.py, here only
    that none of them is a navigation's.
    """
    machine, position = "", 0
    effects: tuple[str, ...] = ()
    navigation: tuple[str, ...] = ()
    turn_active = False
    checked = 0
    for kind, what in log:
        if kind == "step":
            if what["machine"] == "turn":
                turn_active = what["dest"] not in ("idle", "closed")
            if what["machine"] == "navigation" and not what["effects"] and turn_active:
                continue
            machine, effects, position = what["machine"], tuple(what["effects"]), 0
            if machine == "navigation":
                navigation = effects
            if machine == "operation":
                assert {"start_summary", "cancel_summary"} & set(navigation), what
            continue
        if kind == "event:compaction_update":
            continue  # an operation's steps, announced as they happen
        if machine == "turn":
            assert kind not in NAVIGATION_ONLY, f"{kind} {what} during a turn step"
            continue
        table = OPERATION_PERFORMED_BY if machine == "operation" else PERFORMED_BY
        able_at = [i for i, name in enumerate(effects) if name in table.get(kind, ())]
        assert able_at, f"{kind} {what} performed outside the {machine} table ({effects})"
        later = [i for i in able_at if i >= position]
        assert later, f"{kind} out of the row's order {effects}"
        position = later[0]
        checked += 1
    return checked


async def test_nothing_happens_outside_the_navigation_table() -> None:
    kit = Kit(
        turns=[[reply("answer 1")], [reply("answer 2")], [AgentHang()]],
        summaries=[summary(BRANCH_SUMMARY), Hang()],
    )
    ids = await conversation(kit)
    recorder = Recorder(kit)
    supply = {"on": False}
    kit.runtime.hooks.on(
        "session_before_tree",
        lambda p: {"summary": {"summary": "from the hook"}} if supply["on"] else None,
    )

    # The same position; with a summary from the model; with a summary a hook supplies, with a
    # label; to the root (before the first user message); without a summary, labelled.
    await kit.runtime.navigate(ids["a2"], summarize=True)
    committed = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert committed.summary_entry is not None
    supply["on"] = True
    supplied = await kit.runtime.navigate(ids["a2"], summarize=True, label="from the hook")
    assert supplied.summary_entry is not None
    supply["on"] = False
    await kit.runtime.navigate(ids["u1"])
    await kit.runtime.navigate(ids["a2"], label="checkpoint")

    # Cancelled while the summary is written.
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: kit.runtime.navigate(ids["a1"], summarize=True))
        await until(lambda: len(kit.model.requests) == 2)
        kit.runtime.abort_branch_summary()

    # Refused while a turn runs.
    async def refused() -> None:
        await until(lambda: kit.runtime.state == "running")
        with pytest.raises(SessionError, match="agent is working"):
            await kit.runtime.navigate(ids["a1"])
        kit.runtime.abort()

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "third question")
        group.start_soon(refused)

    checked = check_inside_the_table(recorder.log)
    navigation = recorder.log
    kinds = {kind for kind, _ in navigation}
    assert set(PERFORMED_BY) | {"call"} <= kinds
    assert checked >= 25
    moves = {(s["source"], s["event"], s["dest"]) for k, s in navigation if k == "step"}
    assert {
        ("idle", "navigate", "done"),
        ("idle", "navigate", "refused"),
        ("consulting_hooks", "hook_supplied", "switching_leaf"),
        ("summarizing", "summary_committed", "done"),
        ("summarizing", "cancel", "cancelled"),
    } <= moves

    # The journal holds every navigation step, and replays through the table: each record to
    # the same destination and effects, and each navigation from idle to a final state.
    records = [r for r in kit.journal.records() if r.machine == "navigation"]
    observed = [s for k, s in navigation if k == "step" and s["machine"] == "navigation"]
    assert [(r.source, r.event, r.dest) for r in records] == [
        (s["source"], s["event"], s["dest"]) for s in observed
    ]
    table = load_machine("navigation")
    state = table.initial
    for record in records:
        assert record.source == (table.initial if state in table.final else state)
        taken = step(table, record.source, record.event, NavigationFacts(**record.data["facts"]))
        assert (taken.dest, taken.effects) == (record.dest, record.effects)
        state = taken.dest
    assert state in table.final
