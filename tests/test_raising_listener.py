"""An event listener that raises does not break the step that emitted the event (events.py)."""

from __future__ import annotations

import logging

import pytest

from orchestrator._runtime.events import Event, EventBus
from orchestrator.testing import reply
from tests.runtime_kit import BIG, Kit, settings, summary

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def broken(event: Event) -> None:
    raise RuntimeError(f"listener bug on {event.type}")


async def test_a_raising_listener_leaves_turns_compactions_and_navigation_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    kit.runtime.events.subscribe(broken)
    with caplog.at_level(logging.ERROR, logger="orchestrator.events"):
        await kit.runtime.prompt(BIG)
        await kit.runtime.prompt(BIG)
        outcome = await kit.runtime.compact()
    roles = [e["message"]["role"] for e in kit.session.tree.entries if e["type"] == "message"]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert outcome.entry is not None
    assert kit.session.tree.entries[-1]["type"] == "compaction"
    # The kit's own listener, subscribed before, still got every event.
    assert "session_compact" in kit.types()
    failures = [r for r in caplog.records if r.name == "orchestrator.events"]
    assert failures
    assert "listener bug" in str(failures[0].exc_info[1] if failures[0].exc_info else "")
    first_user = kit.session.tree.entries[0]["id"]
    result = await kit.runtime.navigate(first_user)
    assert result.editor_text is not None


def test_the_listeners_after_a_raising_one_still_get_the_event() -> None:
    bus = EventBus()
    seen: list[str] = []
    bus.subscribe(broken)
    bus.subscribe(lambda event: seen.append(event.type))
    bus.emit("message", text="hi")
    assert seen == ["message"]
