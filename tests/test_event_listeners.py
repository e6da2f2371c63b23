"""Events are built only for someone who receives them (issue 9).

Every machine step announces a ``transition``; the server forwards every other event of a session
to the connections that follow it. With a thousand sessions compacting at once, building those
payloads for nobody was work on the event loop for every step.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator._rpc import hub as hub_module
from orchestrator._rpc import protocol
from orchestrator._rpc.hub import SessionHub
from orchestrator._runtime.events import Event, EventBus
from tests.runtime_kit import Kit

pytestmark = pytest.mark.anyio


def test_a_listener_never_hears_the_types_it_ignores() -> None:
    bus = EventBus()
    heard: list[str] = []
    everything: list[str] = []
    bus.subscribe(lambda e: heard.append(e.type), ignoring={"transition"})
    assert not bus.wants("transition")
    assert bus.wants("compaction_update")
    bus.emit("transition", machine="turn")
    bus.emit("compaction_update", status="completed")
    assert heard == ["compaction_update"]
    unsubscribe = bus.subscribe(lambda e: everything.append(e.type))
    assert bus.wants("transition")
    bus.emit("transition", machine="turn")
    assert (heard, everything) == (["compaction_update"], ["transition"])
    unsubscribe()
    assert not bus.wants("transition")


async def test_an_open_stream_wants_every_type() -> None:
    bus = EventBus()
    assert not bus.wants("transition")
    async with bus.stream():
        assert bus.wants("transition")
    assert not bus.wants("transition")


async def test_a_step_announces_no_transition_when_nobody_listens_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kit = Kit()
    built: list[str] = []
    real_init = Event.__init__

    def counted(self: Event, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(self.type)

    monkeypatch.setattr(Event, "__init__", counted)
    kit.runtime.events._listeners.clear()  # the kit's own recorder hears everything
    heard: list[str] = []
    kit.runtime.events.subscribe(lambda e: heard.append(e.type), ignoring={"transition"})
    await kit.runtime.compact()  # nothing to compact: skipped, through both machines
    assert "transition" not in built
    assert "compaction_update" in heard
    kit.runtime.events.subscribe(lambda e: heard.append(e.type))
    await kit.runtime.compact()
    assert "transition" in built


async def test_the_server_builds_a_notification_only_for_a_session_someone_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kit = Kit()
    hub = SessionHub()
    made: list[str] = []
    real = protocol.notification

    def counted(method: str, params: Any) -> dict[str, Any]:
        made.append(method)
        return real(method, params)

    monkeypatch.setattr(hub_module, "notification", counted)
    hub.add(kit.runtime, "s.jsonl")
    kit.runtime.events.emit("compaction_update", status="completed")
    assert made == []
    lines: list[Any] = []
    hub.listen(lines.append)
    kit.runtime.events.emit("compaction_update", status="completed")
    kit.runtime.events.emit("transition", machine="turn")  # never forwarded
    assert len(made) == 1
    assert [line["params"]["event"]["type"] for line in lines] == ["compaction_update"]
