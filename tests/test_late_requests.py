"""A prompt or compaction asked for while a run winds down is served, not dropped (turn.py).

Between the turn machine coming to rest and the run letting go of the session, ``prompt()``
found the run busy and queued its text, which the end of the run then cleared: the caller was
told ``queued`` and the prompt never ran. A ``compact()`` there raised "closed before it ran".
The listener below asks at the last step of the run, as a caller on another task can.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from orchestrator._runtime.events import Event
from orchestrator.testing import reply
from tests.runtime_kit import BIG, Kit, settings, summary

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def at_rest(kit: Kit, group: Any, ask: Callable[[], Awaitable[Any]], results: list[Any]) -> None:
    """Start ``ask`` from the run's last step (the turn machine entering ``idle``), once."""
    fired: list[bool] = []

    def listener(event: Event) -> None:
        payload = event.payload
        if event.type == "transition" and payload["machine"] == "turn" and not fired:
            if payload["dest"] == "idle":
                fired.append(True)

                async def late() -> None:
                    try:
                        results.append(await ask())
                    except Exception as exc:  # noqa: BLE001 - the test looks at it
                        results.append(exc)

                group.start_soon(late)

    kit.runtime.events.subscribe(listener)


def texts(kit: Kit) -> list[str]:
    out = []
    for entry in kit.session.tree.entries:
        if entry["type"] == "message":
            content = entry["message"]["content"]
            out.append(content if isinstance(content, str) else content[0]["text"])
    return out


async def test_a_prompt_queued_as_the_run_ends_runs() -> None:
    kit = Kit(turns=[[reply("one")], [reply("two")]], summaries=[summary()])
    results: list[Any] = []
    async with anyio.create_task_group() as group:
        at_rest(kit, group, lambda: kit.runtime.prompt("late question"), results)
        await kit.runtime.prompt("first")
    assert results[0].queued is True
    assert texts(kit) == ["first", "one", "late question", "two"]
    assert kit.runtime.turn.state == "idle"


async def test_a_compaction_asked_for_as_the_run_ends_runs() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    results: list[Any] = []
    async with anyio.create_task_group() as group:
        at_rest(kit, group, kit.runtime.compact, results)
        first = await kit.runtime.compact()
    assert first.status == "committed"
    # The second ran after the first (nothing left to compact), instead of being cancelled.
    assert not isinstance(results[0], Exception), results[0]
    assert results[0].status == "skipped"
    assert kit.runtime.turn.manual is None
