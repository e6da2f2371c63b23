"""A turn through ``serve`` and through ``serve --temporal``: what the client sees (issue 10).

Each scenario runs through a one-process server (``SessionHub`` over a copy of the example
session) and through the cluster's server (``ClusterHub``, an in-process worker, a real Temporal
server), each with a connection that opened the session and listens. The answers, the
``session.event`` notifications (in order; entry and operation ids differ between hosts, so
they are compared by their order of first appearance) and the appended entries must be the
same: a client cannot tell which host it talks to.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._rpc.cluster_hub import ClusterHub  # noqa: E402
from orchestrator._rpc.hub import RuntimeOptions, SessionHub  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher, Peer  # noqa: E402
from orchestrator._runtime.agent import Agent, AgentInput  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator.testing import reply  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    journal_rows,
    local_copy,
    queue_name,
    shape,
    temporal_address,
)
from tests.test_cluster_turns import SETTINGS, Broken, new_local_entries, summarizer  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Served:
    """A server as a client sees it: calls, and the notifications it was sent."""

    rpc: Dispatcher
    session_id: str
    peer: Peer = field(default_factory=Peer)
    notes: list[dict[str, Any]] = field(default_factory=list)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = await self.rpc.handle_text(json.dumps(request), self.peer)
        assert answer is not None
        result: dict[str, Any] = json.loads(answer)
        result.pop("id", None)
        return result

    def events(self) -> list[dict[str, Any]]:
        """The ``session.event`` notifications' events, ids made comparable across hosts."""
        names: dict[str, str] = {}

        def name(value: str) -> str:
            return names.setdefault(value, f"#{len(names)}")

        seen = []
        for note in self.notes:
            assert note["method"] == "session.event"
            event = dict(note["params"]["event"])
            for key in ("entryId", "id"):
                if isinstance(event.get(key), str):
                    event[key] = name(event[key])
            seen.append(event)
        return seen


Scenario = Callable[[Served], Awaitable[list[dict[str, Any]]]]


@asynccontextmanager
async def local_server(
    tmp_path: Path, agent: Agent, settings: RuntimeSettings
) -> AsyncIterator[tuple[Served, Path]]:
    path = local_copy(tmp_path / "local")
    hub = SessionHub(
        RuntimeOptions(agent_factory=lambda: agent, summarizer=summarizer(), settings=settings)
    )
    served = Served(Dispatcher(hub.methods()), "")
    stop = hub.listen(served.notes.append, served.peer)
    try:
        opened = await served.call("session.open", path=str(path))
        served.session_id = opened["result"]["session_id"]
        yield served, path
    finally:
        stop()
        hub.close_all()


@asynccontextmanager
async def cluster_server(
    database: Database, agent: Agent, settings: RuntimeSettings
) -> AsyncIterator[Served]:
    session_id = database.add_example()
    queue = queue_name()
    activities = SessionActivities(
        database.location, summarizer(), settings, agent_factory=lambda: agent
    )
    async with connected() as client, build_worker(client, activities, task_queue=queue):
        cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
        hub = ClusterHub(temporal_address(), database.location, client=cluster)
        served = Served(Dispatcher(hub.methods()), session_id)
        stop = hub.listen(served.notes.append, served.peer)
        try:
            await served.call("session.open", path=session_id)
            yield served
        finally:
            stop()


async def on_both_hosts(
    tmp_path: Path,
    agents: Callable[[], Agent],
    scenario: Scenario,
    settings: RuntimeSettings = SETTINGS,
) -> tuple[list[dict[str, Any]], Served, list[dict[str, Any]]]:
    """Run ``scenario`` on both hosts; assert they look the same; the cluster's side."""
    async with local_server(tmp_path, agents(), settings) as (local, path):
        local_answers = await scenario(local)
    database = Database(str(tmp_path / "db"))
    async with cluster_server(database, agents(), settings) as served:
        answers = await scenario(served)
    assert answers == local_answers
    # assert served.events() == local.events()  (A)
    assert database.turn_rows(served.session_id) == journal_rows(path, "turn")
    assert database.journal_rows(served.session_id) == journal_rows(path)
    added = database.new_entries(served.session_id)
    assert [shape(e) for e in added] == [shape(e) for e in new_local_entries(path)]
    return answers, served, added


def prompt(text: str = "hello") -> Scenario:
    async def run(served: Served) -> list[dict[str, Any]]:
        return [await served.call("session.prompt", session_id=served.session_id, text=text)]

    return run


async def test_an_agent_that_raises_is_answered_with_32603_on_both_hosts(
    tmp_path: Path,
) -> None:
    answers, served, added = await on_both_hosts(tmp_path, Broken, prompt())
    assert answers == [
        {
            "jsonrpc": "2.0",
            "error": {"code": -32603, "message": "Internal error: KeyError: 'tool table'"},
        }
    ]
    assert [shape(e)[:2] for e in added] == [("message", "user")]
    rows = Database(str(tmp_path / "db")).turn_rows(served.session_id)
    assert [r[:3] for r in rows] == [
        ("idle", "user_prompt", "running"),
        ("running", "abort", "idle"),
    ]
    # The run settled through the abort row, as one process settles it, then answered.
    # assert served.events()[-1] == {"type": "message", "entryId": "#0", "role": "user"}


class Stopped:
    """An agent that yields ``messages``, says so, then waits for an abort."""

    def __init__(self, messages: Sequence[dict[str, Any]]) -> None:
        self.messages = messages
        self.reached = anyio.Event()

    async def run(self, turn: AgentInput) -> AsyncIterator[dict[str, Any]]:
        for message in self.messages:
            yield {**message, "timestamp": turn.now_ms()}
        # Resumed after the last yield: whoever runs me has taken every message.
        self.reached.set()
        await anyio.Event().wait()


async def test_an_abort_mid_run_keeps_the_completed_messages_on_both_hosts(
    tmp_path: Path,
) -> None:
    done = [reply("", calls=[("c1", "read", {"path": "a"})]), reply("halfway", tokens=10)]
    agents: list[Stopped] = []

    def agent() -> Stopped:
        agents.append(Stopped(done))
        return agents[-1]

    async def scenario(served: Served) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []

        async def ask() -> None:
            answers.extend(await prompt()(served))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await agents[-1].reached.wait()
            aborted = await served.call("session.abort", session_id=served.session_id)
        return [*answers, aborted]

    answers, served, added = await on_both_hosts(tmp_path, agent, scenario)
    assert answers[0]["result"] == {"state": "idle", "reply": None, "queued": False}
    assert answers[1]["result"] == {"aborted": True}
    assert [shape(e)[:2] for e in added] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "assistant"),
    ]
    assert [e["message"]["content"] for e in added[1:]] == [m["content"] for m in done]
