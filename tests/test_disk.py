"""Issue 9: the disk work the event loop does not wait for (``orchestrator._runtime.disk``)."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import pytest

from orchestrator._core.errors import OrchestratorError
from orchestrator._runtime import disk
from orchestrator._runtime.ports import random_operation_id
from orchestrator._runtime.session import AgentSession
from orchestrator._store.journal import Journal
from orchestrator._store.session import _random_hex


@pytest.mark.anyio
async def test_closing_a_session_makes_its_journal_durable_once(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fsync when an operation ends: the session's close makes the last records durable,
    with one fsync, and a close with nothing new written makes none."""
    import os

    runtime = AgentSession.open(example, owner="test")
    assert (await runtime.compact()).status == "committed"
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    runtime.close()
    assert [Path(name).name for name in synced] == ["session.jsonl.journal"]
    last = [r.dest for r in Journal.open(example).records() if r.machine == "operation"][-1]
    assert last == "committed"
    synced.clear()
    AgentSession.open(example, owner="test").close()  # nothing written: nothing to sync
    assert synced == []


@pytest.mark.anyio
async def test_a_journal_that_cannot_be_made_durable_at_close_is_logged_and_closed(
    example: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    runtime = AgentSession.open(example, owner="test")
    assert (await runtime.compact()).status == "committed"

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        runtime.close()
    assert "could not make the journal durable at close: [Errno 5] Input/output error" in (
        caplog.text
    )
    monkeypatch.undo()
    AgentSession.open(example, owner="test").close()  # closed anyway: the lock was given back


def test_a_batch_is_split_over_the_threads_and_each_key_stays_in_one_in_order() -> None:
    batch = [disk._Asked(lambda: None, key) for key in ["a", "b", "a", "c", "b", "a"]]
    lanes = disk._lanes(batch, 2)
    assert len(lanes) == 2
    assert sorted(len(lane) for lane in lanes) == [2, 4]
    for lane in lanes:
        keys = [asked.key for asked in lane]
        assert len(set(keys)) == len(set(keys) & set("abc"))
    a_lane = next(lane for lane in lanes if lane[0].key == "a")
    assert [asked for asked in a_lane if asked.key == "a"] == [batch[0], batch[2], batch[5]]
    assert disk._lanes(batch[:1], 2) == [batch[:1]]  # one piece of work: one thread
    assert disk._lanes(batch, 1) == [batch]


@pytest.mark.anyio
async def test_a_journal_that_cannot_be_made_durable_fails_the_commit_and_writes_nothing(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's fsync on entering committing runs in the commit's thread call, first: if
    it fails, the entry is not written (its id would not be durable before it, D24)."""
    before = example.read_bytes()

    def sync(self: Journal) -> None:
        raise OSError(28, "No space left on device")

    runtime = AgentSession.open(example, owner="test")
    monkeypatch.setattr(Journal, "sync", sync)
    try:
        with pytest.raises(OrchestratorError, match="No space left on device"):
            await runtime.compact()
    finally:
        runtime.close()
    assert example.read_bytes() == before
    states = [r.dest for r in Journal.open(example).records() if r.machine == "operation"]
    assert states[-2:] == ["committing", "failed"]


def test_ids_are_random_hex_without_a_system_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_urandom(size: int) -> bytes:
        raise AssertionError("an id read the system's randomness")

    monkeypatch.setattr("os.urandom", no_urandom)
    ids = {_random_hex() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in ids)
    operations = {random_operation_id() for _ in range(1000)}
    assert len(operations) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{12}", value) for value in operations)


@pytest.mark.anyio
@pytest.mark.parametrize("sibling_timer", [False, True])
async def test_a_model_call_is_timed_with_or_without_a_task_of_its_own(sibling_timer: bool) -> None:
    import anyio

    from orchestrator._runtime.outcomes import within

    async def slow() -> str:
        await anyio.sleep(10)
        return "late"

    async def quick() -> str:
        return "done"

    async def failing() -> str:
        raise ValueError("no")

    with anyio.fail_after(5):  # the timeout below ends it first
        assert await within(0.01, slow(), sibling_timer=sibling_timer) is None
    assert await within(1, quick(), sibling_timer=sibling_timer) == "done"
    assert await within(None, quick(), sibling_timer=sibling_timer) == "done"
    with pytest.raises(ValueError, match="no"):
        await within(1, failing(), sibling_timer=sibling_timer)


def test_only_the_litellm_route_asks_for_a_sibling_timer() -> None:
    from orchestrator._models.litellm import LiteLLMModel
    from orchestrator._telemetry.traced_model import TracedModel
    from orchestrator._telemetry.tracing import LifecycleTracer
    from orchestrator.testing import ScriptedModel

    tracer = LifecycleTracer(None)
    assert TracedModel(LiteLLMModel("openai/gpt-4o-mini"), tracer).needs_sibling_timer
    assert not TracedModel(ScriptedModel(), tracer).needs_sibling_timer
    # Only the litellm route streams a summary (and keeps its own idle timeout) too.
    assert TracedModel(LiteLLMModel("openai/gpt-4o-mini"), tracer).streams
    assert not TracedModel(ScriptedModel(), tracer).streams


@pytest.mark.anyio
async def test_commits_of_many_sessions_go_through_the_disk_threads_never_more_at_once(
    tmp_path: Path, example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import anyio

    from orchestrator._store.session import Session

    paths = []
    for index in range(4):
        path = tmp_path / f"s{index}.jsonl"
        shutil.copy(example, path)
        paths.append(path)
    loop_thread = threading.get_ident()
    inside: list[int] = []
    most = 0
    threads: set[int] = set()
    real_write = Session.write_entry

    def write_entry(self: Session, *args: object, **kwargs: object) -> None:
        nonlocal most
        inside.append(1)
        most = max(most, len(inside))
        threads.add(threading.get_ident())
        try:
            real_write(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            inside.pop()

    monkeypatch.setattr(Session, "write_entry", write_entry)
    runtimes = [AgentSession.open(path, owner="test") for path in paths]
    try:
        async with anyio.create_task_group() as group:
            for runtime in runtimes:
                group.start_soon(runtime.compact)
    finally:
        for runtime in runtimes:
            runtime.close()
    assert 1 <= most <= disk.DISK_THREADS  # never more at once than the loop's disk threads
    assert threads
    assert loop_thread not in threads
    for path in paths:
        assert Session.open(path).tree.entries[-1]["type"] == "compaction"


@pytest.mark.anyio
async def test_disk_work_asked_while_the_thread_is_busy_goes_in_one_call_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk thread takes everything asked meanwhile in its next call: no trip through the
    event loop between two commits; each asker gets its own result or its own error."""
    import anyio

    queue = disk._DiskQueue()
    calls: list[int] = []
    ran: list[int] = []
    real_batch = disk._run_batch

    def run_batch(batch: list[disk._Asked]) -> None:
        calls.append(len(batch))
        real_batch(batch)

    monkeypatch.setattr(disk, "_run_batch", run_batch)
    release = threading.Event()

    def first() -> int:
        release.wait(5)  # holds the thread until the others have asked
        ran.append(0)
        return 0

    def work(number: int) -> int:
        if number == 3:
            raise ValueError("three")
        ran.append(number)
        return number * 10

    results: dict[int, object] = {}
    asked: list[int] = []

    async def ask(number: int) -> None:
        asked.append(number)  # the order asked (trio starts tasks in an order of its own)
        try:
            results[number] = await queue.run(first if number == 0 else lambda: work(number))
        except ValueError as error:
            results[number] = error

    async with anyio.create_task_group() as group:
        group.start_soon(ask, 0)
        await anyio.sleep(0.05)  # the first call is in the thread
        for number in range(1, 6):
            group.start_soon(ask, number)
        await anyio.sleep(0.05)  # all asked, all waiting
        release.set()
    assert calls == [1, 5]  # the five asked meanwhile went in one call
    assert ran == [number for number in asked if number != 3]  # in the order asked
    assert {k: v for k, v in results.items() if k != 3} == {0: 0, 1: 10, 2: 20, 4: 40, 5: 50}
    assert isinstance(results[3], ValueError)  # the error goes to its asker only


@pytest.mark.anyio
async def test_disk_work_handed_over_runs_to_its_end_through_a_cancellation(
    example: Path,
) -> None:
    import time

    import anyio

    from orchestrator._store.session import Session

    session = Session.open(example)
    done: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append("written")

    with anyio.move_on_after(0.01) as scope:
        await disk.off_loop(session, slow)
    assert scope.cancel_called
    assert done == ["written"]  # the caller left only once the work had ended


@pytest.mark.anyio
async def test_a_disk_thread_call_that_fails_fails_every_work_of_its_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anyio

    queue = disk._DiskQueue()

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no thread to be had")

    monkeypatch.setattr(anyio.to_thread, "run_sync", broken)
    with pytest.raises(RuntimeError, match="no thread to be had"):
        await queue.run(lambda: 1)
    monkeypatch.undo()
    assert await queue.run(lambda: 2) == 2  # the queue is not left carrying
