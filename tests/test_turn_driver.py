"""The turn driver: the table decides, and nothing happens outside it (issue 7, D31).

"The table decides": each test runs the same turn with the shipped ``turn.toml`` and with a copy
that has a row removed, a guard changed or two rows swapped, and shows the behaviour follows the
copy. "Nothing outside the table": the ports are instrumented, and every agent call, compaction,
prune, sleep, store write and event of a turn must be performed by an effect of the turn step
taken just before it, in the order of that row's effects; the journal then replays through the
table to the same steps. Before the turn driver interpreted the table, closing, resuming after a
compaction and running a queued prompt were Python decisions, and these tests would fail.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator._core.entries import Message
from orchestrator._core.errors import Cancelled, SessionError, SessionLockedError, TransitionError
from orchestrator._core.resources import data_dir
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine, step
from orchestrator._runtime.agent import AgentInput
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.turn.driver import TurnDriver
from orchestrator._runtime.turn.replies import OVERFLOW_FAILED
from orchestrator._runtime.types import TurnResult
from orchestrator._runtime.wiring import wire
from orchestrator._store.owner import lock_path
from orchestrator._store.session import Session
from orchestrator.testing import AgentHang, error_reply, reply
from tests.runtime_kit import BIG, HangingSleep, Kit, settings, summary, until

pytestmark = pytest.mark.anyio

Rows = list[dict[str, Any]]
OVERFLOW = "prompt is too long: 210000 tokens > 200000 maximum"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def turn_table(edit: Callable[[Rows], None] | None = None) -> MachineDef:
    """The shipped turn table, or a copy with ``edit`` applied to its rows."""
    if edit is None:
        return load_machine("turn")
    data = tomllib.loads((data_dir("machines") / "turn.toml").read_text(encoding="utf-8"))
    edit(data["transitions"])
    return build(data, source="modified turn.toml", guards=None, effects=None)


def row(rows: Rows, source: str, event: str, dest: str, guard: str | None = None) -> int:
    return next(
        i
        for i, r in enumerate(rows)
        if (r["source"], r["event"], r["dest"]) == (source, event, dest)
        and (guard is None or r.get("guards", []) == [guard])
    )


def driven(kit: Kit, defn: MachineDef) -> TurnDriver:
    """A turn driver over the kit's ports, stepping ``defn`` (the other tables are shipped)."""
    return driven_ports(kit.runtime.ports, kit.runtime, defn)


def driven_ports(ports: Ports, runtime: AgentSession, defn: MachineDef) -> TurnDriver:
    tables = dataclasses.replace(
        ports, tables=lambda name: defn if name == "turn" else load_machine(name)
    )
    return wire(tables, runtime.settings).turn


def path(kit: Kit) -> list[tuple[str, str, str]]:
    return [
        (e["source"], e["event"], e["dest"]) for e in kit.of("transition") if e["machine"] == "turn"
    ]


def overflow_kit(**compaction: Any) -> Kit:
    return Kit(
        turns=[[reply("first", tokens=2000)], [error_reply(OVERFLOW)], [reply("recovered")]],
        # The cut passes the omitted attempt (pi 1.x): the prompt is a split turn's prefix,
        # summarized apart from the history.
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False, **compaction),
    )


# -- the table decides ------------------------------------------------------------------------


async def test_a_stricter_retry_guard_ends_the_turn_on_a_transient_error() -> None:
    # Removing the row would leave `retrying` unreachable, which the loader refuses; a guard that
    # cannot hold after an error reply disables it instead.
    def no_retry(rows: Rows) -> None:
        rows[row(rows, "running", "transient_error", "retrying")]["guards"].append("context_full")

    for defn, sleeps, replies in [(turn_table(), [2.0], 2), (turn_table(no_retry), [], 1)]:
        kit = Kit(turns=[[error_reply("503 service unavailable")], [reply("fine")]])
        result = await driven(kit, defn).prompt("hi")
        assert kit.clock.sleeps == sleeps
        assert kit.agent.remaining == 2 - replies
        assert result.state == "idle"
        [end] = kit.of("auto_retry_end")
        assert end["success"] is (replies == 2)


async def test_a_retry_writes_what_it_hides_as_the_row_says(tmp_path: Path) -> None:
    # Pi 1.6 (_prepareRetry): after auto_retry_start and before the wait, a context_edit omits
    # the failed reply; it stays in the file. Reopened, the file builds the context the retry
    # got. Without the effect in the row, nothing is written and the retry sends it again.
    def no_omission(rows: Rows) -> None:
        retry = rows[row(rows, "running", "transient_error", "retrying")]
        retry["effects"] = [e for e in retry["effects"] if e != "omit_failed_attempt"]

    for defn, omitted in [(turn_table(), True), (turn_table(no_omission), False)]:
        path = tmp_path / f"omitted-{omitted}.jsonl"
        kit = Kit(
            turns=[[error_reply("503 service unavailable")], [reply("fine")]],
            session=Session.open(path),
        )
        result = await driven(kit, defn).prompt("hi")
        assert reply_text(result) == "fine"
        assert [e["success"] for e in kit.of("auto_retry_end")] == [True]
        entries = kit.session.tree.entries
        [failed] = [e for e in entries if e.get("message", {}).get("stopReason") == "error"]
        edits = [
            (e["parentId"], e["targetId"], e["replacement"])
            for e in entries
            if e["type"] == "context_edit"
        ]
        retried_with = [m["role"] for m in kit.agent.inputs[1].messages]
        live = kit.session.context()
        kit.runtime.close()
        reopened = Session.open(path)
        try:
            assert any(e["id"] == failed["id"] for e in reopened.tree.entries)
            context = reopened.context()
        finally:
            reopened.close()
        assert (context.messages, context.entry_ids) == (live.messages, live.entry_ids)
        if omitted:
            assert kit.entry_types() == [
                "message:user",
                "message:assistant",
                "context_edit",
                "message:assistant",
            ]
            assert edits == [(failed["id"], failed["id"], None)]
            assert failed["id"] not in live.entry_ids
            assert retried_with == ["user"]
        else:
            assert edits == []
            assert failed["id"] in live.entry_ids
            assert retried_with == ["user", "assistant"]  # the failed reply, sent again


async def test_without_the_overflow_recovery_row_an_overflow_ends_the_turn_uncompacted() -> None:
    def no_recovery(rows: Rows) -> None:
        del rows[row(rows, "running", "overflow", "compacting")]

    shipped = overflow_kit()
    await shipped.runtime.prompt(BIG)
    result = await driven(shipped, turn_table()).prompt(BIG)
    assert reply_text(result) == "recovered"
    assert "compaction" in shipped.entry_types()

    modified = overflow_kit()
    await modified.runtime.prompt(BIG)
    result = await driven(modified, turn_table(no_recovery)).prompt(BIG)
    assert result.reply is not None
    assert result.reply["stopReason"] == "error"
    assert "compaction" not in modified.entry_types()
    assert modified.model.requests == []
    assert modified.of("auto_compaction_end")[-1]["errorMessage"] == OVERFLOW_FAILED
    assert modified.agent.remaining == 1  # no retry either


async def test_swapped_continue_rows_append_the_continue_message_after_an_overflow() -> None:
    # With the auto-continue row before the overflow-retry row, an overflow recovery records the
    # D20 continue prompt too (both guards hold: will_retry, and auto_continue by default).
    def swap(rows: Rows) -> None:
        i = row(rows, "compacting", "compaction_done", "continuing", "will_retry")
        j = row(rows, "compacting", "compaction_done", "continuing", "auto_continue")
        rows[i], rows[j] = rows[j], rows[i]

    for defn, continued in [(turn_table(), False), (turn_table(swap), True)]:
        kit = overflow_kit()
        await kit.runtime.prompt(BIG)
        result = await driven(kit, defn).prompt(BIG)
        assert reply_text(result) == "recovered"
        assert ("custom_message" in kit.entry_types()) is continued


async def test_resuming_after_a_compaction_is_the_rows_effect() -> None:
    def no_resume(rows: Rows) -> None:
        effects = rows[row(rows, "compacting", "compaction_done", "continuing", "will_retry")]
        effects["effects"].remove("resume_turn")

    kit = overflow_kit()
    await kit.runtime.prompt(BIG)
    result = await driven(kit, turn_table(no_resume)).prompt(BIG)
    assert result.state == "continuing"  # the table said nothing about going on
    assert kit.agent.remaining == 1
    assert "compaction" in kit.entry_types()


async def test_a_queued_prompt_runs_only_through_the_follow_up_row() -> None:
    def no_follow_up(rows: Rows) -> None:
        del rows[row(rows, "idle", "follow_up", "running")]

    for defn, texts in [
        (turn_table(), ["first", "queued"]),
        (turn_table(no_follow_up), ["first"]),
    ]:
        kit = Kit(turns=[[AgentHang()], [reply("second")]])
        driver = driven(kit, defn)
        results: list[TurnResult] = []

        async def queue_then_abort(
            driver: TurnDriver = driver, results: list[TurnResult] = results
        ) -> None:
            await until(lambda: driver.state == "running")
            results.append(await driver.prompt("queued"))
            driver.abort()

        async with anyio.create_task_group() as group:
            group.start_soon(driver.prompt, "first")
            group.start_soon(queue_then_abort)
        assert results[0].queued is True
        assert user_texts(kit) == texts
        assert driver.state == "idle"
        if len(texts) == 2:
            assert ("idle", "follow_up", "running") in path(kit)


async def test_without_the_abort_row_an_abort_means_nothing_while_the_agent_runs() -> None:
    def no_abort(rows: Rows) -> None:
        del rows[row(rows, "running", "abort", "idle")]

    gate = anyio.Event()

    class Gated:
        async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
            await gate.wait()
            yield {"role": "assistant", "content": [{"type": "text", "text": "done"}]}

    kit = Kit()
    kit.runtime.agent = Gated()
    driver = driven(kit, turn_table(no_abort))
    async with anyio.create_task_group() as group:
        group.start_soon(driver.prompt, "hi")
        await until(lambda: driver.state == "running")
        driver.abort()  # recorded; the table lists no abort while running
        await anyio.lowlevel.checkpoint()
        assert driver.state == "running"
        gate.set()
    assert path(kit)[-1] == ("running", "agent_done", "idle")
    assert kit.entry_types() == ["message:user", "message:assistant"]


async def test_close_is_the_close_row(tmp_path: Path) -> None:
    file = tmp_path / "s.jsonl"
    runtime = AgentSession.open(file, owner="test")
    moves: list[dict[str, Any]] = []
    runtime.events.subscribe(lambda e: moves.append(e.payload) if e.type == "transition" else None)
    runtime.close()
    assert [(m["source"], m["event"], m["dest"], m["effects"]) for m in moves] == [
        ("idle", "close", "closed", ["close_session"])
    ]
    assert not lock_path(file).exists()  # released
    runtime.close()  # closed is final: nothing more to do
    assert len(moves) == 1

    def no_close(rows: Rows) -> None:
        rows[row(rows, "idle", "close", "closed")]["guards"] = ["over_threshold"]

    runtime = AgentSession.open(file, owner="test")
    runtime.turn = driven_ports(runtime.ports, runtime, turn_table(no_close))
    with pytest.raises(TransitionError, match="can't close when in idle"):
        runtime.close()
    with pytest.raises(SessionLockedError):
        Session.open(file, owner="another")  # still owned: the table refused to release it
    runtime.session.close()


async def test_close_is_refused_while_a_turn_runs() -> None:
    kit = Kit(turns=[[AgentHang()]])
    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "hi")
        await until(lambda: kit.runtime.state == "running")
        with pytest.raises(SessionError, match="abort it first"):
            kit.runtime.close()
        kit.runtime.abort()
    kit.runtime.close()
    assert kit.runtime.state == "closed"


async def test_a_turn_cancelled_from_outside_settles_through_the_abort_row() -> None:
    sleeper = HangingSleep()
    kit = Kit(turns=[[error_reply("502 bad gateway")], [reply("later")]], sleep=sleeper)
    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "hi")
        await until(lambda: kit.runtime.state == "retrying")
        group.cancel_scope.cancel()
    assert sleeper.delays == [2.0]
    assert path(kit)[-1] == ("retrying", "abort", "idle")
    assert kit.of("auto_retry_end")[-1]["success"] is False
    result = await kit.runtime.prompt("again")  # the machine can be used again
    assert reply_text(result) == "later"


def reply_text(result: TurnResult) -> str:
    assert result.reply is not None
    return str(result.reply["content"][0]["text"])


def user_texts(kit: Kit) -> list[str]:
    return [
        e["message"]["content"][0]["text"]
        for e in kit.session.tree.entries
        if e.get("message", {}).get("role") == "user"
    ]


# -- nothing happens outside the table --------------------------------------------------------

# Which effects of the turn table may perform each kind of action.
PERFORMED_BY: dict[str, set[str]] = {
    "agent": {"call_agent"},
    "sleep": {"sleep_retry"},
    "prune": {"prune_tool_outputs"},
    "compaction": {
        "start_threshold_compaction",
        "start_overflow_compaction",
        "start_manual_compaction",
    },
    "write:user": {"start_turn"},
    "write:assistant": {"call_agent"},
    "write:toolResult": {"call_agent"},
    "write:custom_message": {"append_continue_message"},
    "write:context_edit": {"omit_failed_attempt"},
    "auto_compaction_start": {"start_threshold_compaction", "start_overflow_compaction"},
    "auto_compaction_end": {
        "emit_compaction_end",
        "emit_compaction_aborted",
        "emit_compaction_failed",
        "emit_recovery_failed",
        "emit_overflow_failed",
    },
    "auto_retry_start": {"emit_retry_start"},
    "auto_retry_end": {"emit_retry_end", "end_retry_streak", "fail_retry_streak"},
}
FINAL = load_machine("operation").final


class Recorder:
    """Instruments a runtime's ports: every step and every action, in order."""

    def __init__(self, kit: Kit) -> None:
        self.log: list[tuple[str, Any]] = []
        self.in_operation = False
        kit.runtime.events.subscribe(self._event)
        store, agent, operations = kit.session.store, kit.agent, kit.runtime.operations
        append, rewrite, run = store.append, store.rewrite, agent.run
        compaction, prune = operations.compaction, operations.prune

        def logged_append(entries: Any, **options: Any) -> Any:
            self._writes(entries)
            return append(entries, **options)

        def logged_rewrite(header: Any, entries: Any, **options: Any) -> Any:
            self._writes(entries[-1:])  # the first write of a session (as pi) writes it whole
            return rewrite(header, entries, **options)

        def logged_run(turn: Any) -> Any:
            self.log.append(("agent", len(turn.messages)))
            return run(turn)

        async def logged_compaction(**options: Any) -> Any:
            self.log.append(("compaction", options["reason"]))
            return await compaction(**options)

        async def logged_prune(**kwargs: Any) -> Any:
            self.log.append(("prune", None))
            return await prune(**kwargs)

        async def logged_sleep(seconds: float) -> None:
            self.log.append(("sleep", seconds))
            await kit.clock.sleep(seconds)

        store.append = logged_append  # type: ignore[method-assign]
        store.rewrite = logged_rewrite  # type: ignore[method-assign]
        agent.run = logged_run  # type: ignore[method-assign]
        operations.compaction = logged_compaction  # type: ignore[method-assign]
        operations.prune = logged_prune  # type: ignore[method-assign]
        kit.runtime.ports = dataclasses.replace(kit.runtime.ports, sleep=logged_sleep)
        kit.runtime.turn.rewire(kit.runtime.ports, operations, kit.runtime.settings)

    def _writes(self, entries: Any) -> None:
        if self.in_operation:
            return  # the operation table's own writes (tests/test_operation_driver.py)
        for entry in entries:
            kind = entry["type"]
            if kind == "message":
                kind = entry["message"]["role"]
            self.log.append(("write:" + kind, entry["id"]))

    def _event(self, event: Any) -> None:
        if event.type == "transition":
            payload = event.payload
            if payload["machine"] == "operation":
                self.in_operation = payload["dest"] not in FINAL
            else:
                self.log.append(("step", payload))
        elif event.type in PERFORMED_BY and not self.in_operation:
            self.log.append((event.type, None))


def check_inside_the_table(log: list[tuple[str, Any]]) -> int:
    """Each action follows a turn step whose effects perform it, in the row's effect order."""
    effects: tuple[str, ...] = ()
    position = 0
    checked = 0
    for kind, what in log:
        if kind == "step":
            effects, position = tuple(what["effects"]), 0
            continue
        able = [i for i, name in enumerate(effects) if name in PERFORMED_BY[kind]]
        assert able, f"{kind} {what} performed outside the table (step effects: {effects})"
        later = [i for i in able if i >= position]
        assert later, f"{kind} out of the row's order {effects}"
        position = later[0]
        checked += 1
    return checked


async def test_nothing_happens_outside_the_turn_table() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("503 service unavailable")],  # retried after a wait
            [reply("second", tokens=9500)],  # over the threshold: prune, compact, continue
            [reply("continued", tokens=1500)],
            [error_reply(OVERFLOW)],  # a new turn overflows: compact once, retry
            [reply("recovered", tokens=1500)],
            [AgentHang()],  # stopped by a manual compaction
            [reply("queued answer", tokens=100)],
        ],
        summaries=[summary()] * 8,
        runtime_settings=settings(adaptive_keep=False),
    )
    recorder = Recorder(kit)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    outcomes = []

    async def compact_then_queue() -> None:
        await until(lambda: kit.runtime.state == "running")
        queued = await kit.runtime.prompt("queued")
        assert queued.queued
        outcomes.append(await kit.runtime.compact("keep the decisions"))

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, BIG)
        group.start_soon(compact_then_queue)
    assert outcomes[0].status in ("committed", "skipped")
    kit.runtime.close()

    checked = check_inside_the_table(recorder.log)
    kinds = {kind for kind, _ in recorder.log}
    assert {
        "agent",
        "sleep",
        "prune",
        "compaction",
        "write:user",
        "write:custom_message",
        "write:context_edit",
    } <= kinds
    assert {"auto_compaction_start", "auto_compaction_end", "auto_retry_start"} <= kinds
    assert checked >= 20
    moves = {(s["source"], s["event"], s["dest"]) for k, s in recorder.log if k == "step"}
    assert {
        ("continuing", "resume", "running"),
        ("running", "manual_compact", "manual_compacting"),
        ("idle", "follow_up", "running"),
        ("idle", "close", "closed"),
    } <= moves

    # The journal holds every step, the close last (nothing was left open: the next opening
    # reads on from there), and replays through the table to the same steps and effects.
    records = [r for r in kit.journal.records() if r.machine == "turn"]
    observed = [s for kind, s in recorder.log if kind == "step"]
    assert (records[-1].event, records[-1].dest) == ("close", "closed")
    assert [(r.source, r.event, r.dest) for r in records] == [
        (s["source"], s["event"], s["dest"]) for s in observed
    ]
    table = load_machine("turn")
    for record in records:
        taken = step(table, record.source, record.event, TurnFacts(**record.data["facts"]))
        assert (taken.dest, taken.effects) == (record.dest, record.effects)


async def test_without_the_running_manual_compact_row_a_compaction_asked_mid_turn_never_runs() -> (
    None
):
    def no_manual(rows: Rows) -> None:
        del rows[row(rows, "running", "manual_compact", "manual_compacting")]

    gate = anyio.Event()

    class Gated:
        async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
            await gate.wait()
            yield {"role": "assistant", "content": [{"type": "text", "text": "done"}]}

    kit = Kit()
    kit.runtime.agent = Gated()
    driver = driven(kit, turn_table(no_manual))
    errors: list[Cancelled] = []

    async def compact() -> None:
        await until(lambda: driver.state == "running")
        try:
            await driver.compact(None, dry_run=False)
        except Cancelled as error:
            errors.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(driver.prompt, "hi")
        group.start_soon(compact)
        await until(lambda: driver.manual is not None)
        gate.set()
    assert [str(e) for e in errors] == ["Compaction cancelled: the session closed before it ran"]
    assert "manual_compacting" not in {dest for _, _, dest in path(kit)}
    assert kit.model.requests == []


async def test_an_agent_that_raises_ends_the_turn_with_its_own_error() -> None:
    class Broken:
        async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
            raise KeyError("tool table")
            yield {}  # pragma: no cover - makes this an async generator

    kit = Kit()
    kit.runtime.agent = Broken()
    with pytest.raises(KeyError, match="tool table"):
        await kit.runtime.prompt("hi")
    assert not kit.runtime.is_busy


async def test_an_effect_that_waits_cannot_run_from_a_synchronous_call() -> None:
    kit = Kit(sleep=HangingSleep())
    with pytest.raises(RuntimeError, match="turn effect sleep_retry waited"):
        kit.runtime.turn.machine.perform_now("sleep_retry")


# -- decisions that moved into the table (issue 34) -------------------------------------------


async def test_a_reply_ends_the_retry_streak_only_through_the_rows_effect() -> None:
    # The agent's effect used to emit auto_retry_end(success) itself; now the agent_done row's
    # end_retry_streak does. Without it the streak stays open until the run ends, which closes
    # it as failed (a run leaves no streak open).
    def no_end(rows: Rows) -> None:
        rows[row(rows, "running", "agent_done", "idle")]["effects"].remove("end_retry_streak")

    for defn, ends in [
        (turn_table(), [{"success": True, "attempt": 1}]),
        (
            turn_table(no_end),
            [{"success": False, "attempt": 1, "finalError": "503 service unavailable"}],
        ),
    ]:
        kit = Kit(turns=[[error_reply("503 service unavailable")], [reply("fine")]])
        result = await driven(kit, defn).prompt("hi")
        assert reply_text(result) == "fine"
        assert kit.of("auto_retry_end") == ends


async def test_still_over_the_threshold_after_compacting_is_the_rows_choice() -> None:
    # A threshold of 50 tokens: even the compacted context is over it (D19: not again). The
    # driver re-measures; which end event says so is the row's effect.
    def never_still_over(rows: Rows) -> None:
        rows[:] = [r for r in rows if "emit_compaction_still_over" not in r.get("effects", [])]

    tight = dataclasses.replace(
        settings(),
        context_window=20_000,
        compaction=CompactionSettings(keep_recent_tokens=200, reserve_tokens=19_950),
    )
    for defn, flagged in [(turn_table(), True), (turn_table(never_still_over), False)]:
        kit = Kit(
            turns=[[reply("a long answer", tokens=20_000)], [reply("continued", tokens=10)]],
            summaries=[summary()],
            runtime_settings=tight,
        )
        await driven(kit, defn).prompt("hi")
        (end,) = kit.of("auto_compaction_end")
        assert end.get("stillOverThreshold", False) is flagged
        assert ("errorMessage" in end) is flagged
