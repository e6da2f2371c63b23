"""A hook handler that never returns does not hold a cancelled navigation or compaction (D22)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from orchestrator._core.errors import Cancelled, ModelError
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session
from orchestrator.testing import reply
from tests.runtime_kit import BIG, Kit, settings, summary, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HangingHandler:
    """An async hook handler that waits forever; records that it started and was cancelled."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def __call__(self, payload: dict[str, Any]) -> None:
        self.started += 1
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise


async def conversation(kit: Kit) -> dict[str, str]:
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


async def test_abort_ends_a_navigation_whose_before_tree_hook_hangs() -> None:
    kit = Kit(turns=[[reply("one")], [reply("two")]], summaries=[summary()])
    ids = await conversation(kit)
    hook = HangingHandler()
    kit.runtime.hooks.on("session_before_tree", hook)
    before = list(kit.session.tree.entries)
    results = []

    async def go() -> None:
        results.append(await kit.runtime.navigate(ids["a1"], summarize=True))

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: hook.started == 1)
        kit.runtime.abort_branch_summary()
    assert results[0].cancelled is True
    assert hook.cancelled == 1
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]
    assert kit.model.requests == []
    assert kit.runtime.is_navigating is False


@pytest.mark.parametrize("hook_name", ["session_before_compact", "session.compacting"])
async def test_abort_ends_a_compaction_whose_hook_hangs(hook_name: str) -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    hook = HangingHandler()
    kit.runtime.hooks.on(hook_name, hook)
    before = list(kit.session.tree.entries)
    errors: list[BaseException] = []

    async def go() -> None:
        try:
            await kit.runtime.compact()
        except Cancelled as exc:
            errors.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: hook.started == 1)
        kit.runtime.abort_compaction()
    assert len(errors) == 1
    assert hook.cancelled == 1
    assert kit.session.tree.entries == before
    assert kit.model.requests == []


async def test_abort_ends_the_wait_for_a_hanging_session_tree_hook_after_the_move() -> None:
    # The summary is attached before session_tree handlers run: an abort then cannot undo it,
    # but it ends the wait for a handler that never returns, and the call reports what happened.
    kit = Kit(turns=[[reply("one")], [reply("two")]], summaries=[summary()])
    ids = await conversation(kit)
    hook = HangingHandler()
    kit.runtime.hooks.on("session_tree", hook)
    results = []

    async def go() -> None:
        results.append(await kit.runtime.navigate(ids["a1"], summarize=True))

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: hook.started == 1)
        kit.runtime.abort_branch_summary()
    assert hook.cancelled == 1
    entry = results[0].summary_entry
    assert entry is not None
    assert results[0].cancelled is False
    assert kit.session.leaf_id == entry["id"]
    assert "session_tree" in kit.types()


EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"
OTHER_BRANCH = "36fbeee7"  # an assistant message off the example's active path


async def test_a_navigation_cancelled_from_outside_while_its_hook_hangs_leaves_the_file(
    tmp_path: Path,
) -> None:
    # A server shutting down cancels the task running navigate(): the hanging handler is
    # cancelled, the navigation settles through its cancel row, the file is byte for byte as it
    # was, and the session can be closed and owned by someone else.
    path = tmp_path / "example.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path, owner="test navigator")
    hook = HangingHandler()
    runtime.hooks.on("session_before_tree", hook)
    before = path.read_bytes()
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: runtime.navigate(OTHER_BRANCH, summarize=True))
        await until(lambda: hook.started == 1)
        group.cancel_scope.cancel()
    assert hook.cancelled == 1
    assert runtime.navigator.machine is not None
    assert runtime.navigator.machine.state == "cancelled"
    runtime.close()
    assert path.read_bytes() == before
    Session.open(path, owner="someone else").close()


@pytest.mark.parametrize(
    "anyio_backend",
    # trio's mock clock jumps ahead whenever every task waits: the deadline takes no real time.
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock-clock")],
)
async def test_the_operation_deadline_ends_a_compaction_whose_hook_hangs() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()],
        runtime_settings=dataclasses.replace(
            settings(adaptive_keep=False), operation_deadline_s=10.0
        ),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    hook = HangingHandler()
    kit.runtime.hooks.on("session_before_compact", hook)
    before = list(kit.session.tree.entries)
    with pytest.raises(ModelError, match="did not finish within 10 s"):
        await kit.runtime.compact()
    assert hook.cancelled == 1
    assert kit.session.tree.entries == before
    moves = [(s["source"], s["event"], s["dest"]) for s in kit.of("transition")]
    assert ("consulting_hooks", "deadline_passed", "failed") in moves


async def test_abort_ends_the_wait_for_a_hanging_session_compact_hook_after_the_commit() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    hook = HangingHandler()
    kit.runtime.hooks.on("session_compact", hook)
    outcomes: list[Any] = []

    async def go() -> None:
        outcomes.append(await kit.runtime.compact())

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: hook.started == 1)
        kit.runtime.abort_compaction()
    assert hook.cancelled == 1
    assert outcomes[0].status == "committed"  # written before the handler ran: it stays
    assert kit.entry_types()[-1] == "compaction"
    assert kit.runtime.is_busy is False


async def test_abort_ends_a_threshold_compaction_whose_hook_hangs() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=100)],
            [reply("second", tokens=100)],
            [reply("over the threshold", tokens=9500)],
        ],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    hook = HangingHandler()
    kit.runtime.hooks.on("session_before_compact", hook)

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, BIG)
        await until(lambda: hook.started == 1)
        before = list(kit.session.tree.entries)
        kit.runtime.abort()
    assert hook.cancelled == 1
    assert kit.session.tree.entries == before  # nothing of the compaction was applied
    assert kit.of("auto_compaction_end")[-1]["aborted"] is True
    assert kit.runtime.state == "idle"
    assert kit.model.requests == []


@pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock-clock"),
        pytest.param("asyncio", id="asyncio"),
    ],
)
async def test_the_operation_deadline_ends_a_navigation_whose_before_tree_hook_hangs() -> None:
    # Without it a handler that never answers would hold the navigation (and the session's
    # writer) until someone aborts by hand; the deadline fails it and cancels the handler.
    kit = Kit(
        turns=[[reply("one")], [reply("two")]],
        summaries=[summary()],
        runtime_settings=dataclasses.replace(settings(), operation_deadline_s=0.05),
    )
    ids = await conversation(kit)
    hook = HangingHandler()
    remove = kit.runtime.hooks.on("session_before_tree", hook)
    before = list(kit.session.tree.entries)
    with pytest.raises(ModelError, match="did not answer within 0.05 s") as caught:
        await kit.runtime.navigate(ids["a1"], summarize=True)
    assert caught.value.kind == "timeout"
    assert hook.cancelled == 1
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]
    assert kit.model.requests == []
    assert kit.runtime.is_navigating is False
    moves = [(s["source"], s["event"], s["dest"]) for s in kit.of("transition")]
    assert ("consulting_hooks", "deadline_passed", "failed") in moves
    # The session is free: the next navigation (no hook now) moves at once.
    remove()
    result = await kit.runtime.navigate(ids["a1"])
    assert result.new_leaf_id == ids["a1"]


async def test_a_navigation_that_answers_in_time_is_not_failed_by_its_deadline() -> None:
    # The timer is disarmed when the navigation ends: a later firing must not touch anything.
    kit = Kit(
        turns=[[reply("one")], [reply("two")]],
        summaries=[summary()],
        runtime_settings=dataclasses.replace(settings(), operation_deadline_s=0.05),
    )
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert result.summary_entry is not None
    await anyio.sleep(0.1)
    assert kit.session.leaf_id == result.summary_entry["id"]
    assert kit.runtime.navigator.machine is not None
    assert kit.runtime.navigator.machine.state == "done"
