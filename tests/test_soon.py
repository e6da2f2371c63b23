"""Issue 9: callbacks on the event loop instead of tasks (``orchestrator._runtime.soon``)."""

from __future__ import annotations

import anyio
import pytest

from orchestrator._runtime.soon import call_later, next_pass
from tests.test_operation_driver import a_hung_call_ends_at_the_deadline

pytestmark = pytest.mark.anyio


async def test_a_callback_for_the_next_pass_runs_after_this_pass() -> None:
    calls: list[str] = []
    next_pass(lambda: calls.append("next"))
    calls.append("now")
    assert calls == ["now"]
    with anyio.fail_after(5):
        while calls == ["now"]:
            await anyio.sleep(0)
    assert calls == ["now", "next"]


async def test_a_timed_callback_on_asyncio_and_a_task_on_trio(anyio_backend_name: str) -> None:
    calls: list[str] = []
    stop = call_later(0.01, lambda: calls.append("late"))
    if anyio_backend_name == "trio":
        assert stop is None  # the caller runs its own timer task
        return
    assert stop is not None
    await anyio.sleep(0.05)
    assert calls == ["late"]
    stopped = call_later(0.01, lambda: calls.append("never"))
    assert stopped is not None
    stopped()
    await anyio.sleep(0.05)
    assert calls == ["late"]


async def test_the_operation_deadline_ends_a_hung_call_on_either_backend() -> None:
    with anyio.fail_after(10):  # a real clock here: the callback on asyncio, a task on trio
        await a_hung_call_ends_at_the_deadline(0.05)
