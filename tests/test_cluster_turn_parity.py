"""A turn through ``serve`` and through ``serve --temporal``: what the client sees (issue 10).

Each scenario runs through a one-process server (``SessionHub`` over a copy of the example
session) and through the cluster's server (``ClusterHub``, an in-process worker, a real Temporal
server), each with a connection that opened the session and listens. The answers, the
``session.event`` notifications (in order; entry and operation ids differ between hosts, so
they are compared by their order of first appearance) and the appended entries must be the
same: a client cannot tell which host it talks to.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._rpc.cluster_hub import ClusterHub  # noqa: E402
from orchestrator._rpc.hub import RpcHub, RuntimeOptions, SessionHub  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher, Peer  # noqa: E402
from orchestrator._runtime.agent import Agent, AgentInput  # noqa: E402
from orchestrator._runtime.navigation.moves import LEAF_MARKER  # noqa: E402
from orchestrator._runtime.turn.replies import OVERFLOW_FAILED  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator.testing import ScriptedAgent, error_reply, reply  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    journal_rows,
    local_copy,
    queue_name,
    shape,
    temporal_address,
)
from tests.test_cluster_navigation import OLD_LEAF, OTHER_TIP, USER_MESSAGE  # noqa: E402
from tests.test_cluster_turns import (  # noqa: E402
    OVER,
    OVERFLOW,
    SETTINGS,
    Broken,
    new_local_entries,
    summarizer,
)  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Served:
    """A server as a client sees it: calls, and the notifications it was sent."""

    rpc: Dispatcher
    session_id: str
    hub: RpcHub
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
        """The ``session.event`` notifications' events, comparable across hosts."""
        for note in self.notes:
            assert note["method"] == "session.event"
            assert note["params"]["session_id"] == self.session_id
        seen: list[dict[str, Any]] = comparable([n["params"]["event"] for n in self.notes])
        return seen


IDS = ("entryId", "id", "previousSessionFile", "newSessionFile", "operationId")
"""Keys whose values each host makes up (entry and operation ids, where sessions are)."""


def comparable(value: Any) -> Any:
    """``value`` with made-up ids named by first appearance and timestamps zeroed."""
    names: dict[str, str] = {}

    def walk(item: Any) -> Any:
        if isinstance(item, list):
            return [walk(x) for x in item]
        if not isinstance(item, dict):
            return item
        out = {}
        for key, x in item.items():
            if key in IDS and isinstance(x, str):
                x = names.setdefault(x, f"#{len(names)}")
            elif key == "timestamp":
                x = 0
            out[key] = walk(x)
        return out

    return walk(value)


Scenario = Callable[[Served], Awaitable[list[dict[str, Any]]]]


@asynccontextmanager
async def local_server(
    tmp_path: Path, agent: Agent, settings: RuntimeSettings
) -> AsyncIterator[tuple[Served, Path]]:
    path = local_copy(tmp_path / "local")
    hub = SessionHub(
        RuntimeOptions(agent_factory=lambda: agent, summarizer=summarizer(), settings=settings)
    )
    served = Served(Dispatcher(hub.methods()), "", hub)
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
        served = Served(Dispatcher(hub.methods()), session_id, hub)
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
    *,
    moves: bool = False,
) -> tuple[list[dict[str, Any]], Served, list[dict[str, Any]]]:
    """Run ``scenario`` on both hosts; assert they look the same; the cluster's side."""
    async with local_server(tmp_path, agents(), settings) as (local, path):
        local_answers = await scenario(local)
    database = Database(str(tmp_path / "db"))
    async with cluster_server(database, agents(), settings) as served:
        answers = await scenario(served)
    assert comparable(answers) == comparable(local_answers)
    assert served.events() == local.events()
    journaled = Path(f"{path}.journal").exists()  # nothing journaled: no journal beside
    assert database.turn_rows(served.session_id) == (
        journal_rows(path, "turn") if journaled else []
    )
    assert database.journal_rows(served.session_id) == (journal_rows(path) if journaled else [])
    added = database.new_entries(served.session_id)
    if moves:
        # A leaf move is stored as a marker entry there (docs/scale-out.md, Navigation).
        added = [e for e in added if e.get("customType") != LEAF_MARKER]
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
    assert served.events()[-1] == {"type": "message", "entryId": "#0", "role": "user"}


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


def scripted(turns: Sequence[Sequence[dict[str, Any]]]) -> Callable[[], Agent]:
    return lambda: ScriptedAgent(turns)


AUTO_COMPACTION = [
    "auto_compaction_start",
    "in_progress",
    "completed",
    "session_compact",
    "auto_compaction_end",
]
"""An automatic compaction that committed, as the notifications tell it."""


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] if e["type"] != "compaction_update" else e["status"] for e in events]


async def test_a_threshold_compaction_sends_the_same_notifications_in_the_same_order(
    tmp_path: Path,
) -> None:
    turns = [[reply("a long answer", tokens=OVER)], [reply("continued", tokens=1000)]]
    _, served, _ = await on_both_hosts(tmp_path, scripted(turns), prompt())
    assert types(served.events()) == [
        "message",
        "message",
        *AUTO_COMPACTION,
        "message",
    ]
    end = served.events()[6]
    assert end["result"]["summary"].startswith("## Goal\nsummary of the")  # gate-passing (D32)
    assert (end["aborted"], end["willRetry"]) == (False, False)


async def test_an_overflow_and_a_transient_error_send_the_same_notifications(
    tmp_path: Path,
) -> None:
    turns = [
        [error_reply("503 service unavailable")],
        [error_reply(OVERFLOW)],
        [reply("fits now", tokens=1000)],
    ]
    _, served, _ = await on_both_hosts(tmp_path, scripted(turns), prompt())
    seen = served.events()
    assert types(seen) == [
        "message",
        "message",
        "auto_retry_start",
        "message",
        *AUTO_COMPACTION,
        "message",
        "auto_retry_end",
    ]
    assert seen[2]["errorMessage"] == "503 service unavailable"
    assert seen[8]["willRetry"] is True
    assert seen[8]["result"]["details"]["modifiedFiles"]
    assert seen[-1] == {"type": "auto_retry_end", "success": True, "attempt": 1}


async def test_overflow_recovery_giving_up_tells_session_compact_failed_on_both_hosts(
    tmp_path: Path,
) -> None:
    turns = [[error_reply(OVERFLOW)], [error_reply(OVERFLOW)]]
    _, served, _ = await on_both_hosts(tmp_path, scripted(turns), prompt())
    seen = served.events()
    assert types(seen) == [
        "message",
        "message",
        *AUTO_COMPACTION,
        "message",
        "auto_compaction_end",
        "session_compact_failed",
    ]
    compacted = seen[5]
    assert (compacted["reason"], compacted["willRetry"]) == ("overflow", True)
    assert seen[-1] == {
        "type": "session_compact_failed",
        "reason": "overflow",
        "errorMessage": OVERFLOW_FAILED,
        "aborted": False,
        "willRetry": False,
        "fromExtension": False,
    }


async def test_a_compress_sends_the_same_notifications_and_answer(tmp_path: Path) -> None:
    async def compress(served: Served) -> list[dict[str, Any]]:
        return [await served.call("session.compress", session_id=served.session_id)]

    answers, served, _ = await on_both_hosts(tmp_path, scripted([]), compress)
    assert answers[0]["result"]["compacted"] is True
    assert types(served.events()) == ["in_progress", "completed", "session_compact"]


async def test_only_the_connections_that_opened_the_session_hear_its_events(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    agent = ScriptedAgent([[reply("hi", tokens=10)]])
    async with cluster_server(database, agent, SETTINGS) as served:
        other = Served(served.rpc, served.session_id, served.hub)
        everyone: list[dict[str, Any]] = []
        hub = served.hub
        stop_other = hub.listen(other.notes.append, other.peer)
        stop_all = hub.listen(everyone.append)
        try:
            await prompt()(served)
        finally:
            stop_other()
            stop_all()
    assert other.notes == []
    assert len(served.notes) == 2
    assert everyone == served.notes


async def test_a_navigation_tells_the_leaf_move_as_one_process(tmp_path: Path) -> None:
    async def navigate(served: Served) -> list[dict[str, Any]]:
        target = {"session_id": served.session_id, "target_id": OTHER_TIP}
        return [await served.call("session.tree.navigate", **target)]

    answers, served, _ = await on_both_hosts(tmp_path, scripted([]), navigate, moves=True)
    assert answers[0]["result"]["newLeafId"] == OTHER_TIP
    assert served.events() == [
        {
            "type": "session_tree",
            "newLeafId": OTHER_TIP,
            "oldLeafId": OLD_LEAF,
            "summaryEntryId": None,
        }
    ]


async def test_a_compaction_that_leaves_the_context_over_the_line_says_so_on_both_hosts(
    tmp_path: Path,
) -> None:
    # A threshold of 100 tokens: even the compacted context is over it (D19: not again).
    tight = dataclasses.replace(
        SETTINGS,
        context_window=20_000,
        compaction=CompactionSettings(keep_recent_tokens=200, reserve_tokens=19_900),
    )
    turns = [[reply("a long answer", tokens=20_000)], [reply("continued", tokens=10)]]
    _, served, _ = await on_both_hosts(tmp_path, scripted(turns), prompt(), tight)
    (end,) = [e for e in served.events() if e["type"] == "auto_compaction_end"]
    assert end["stillOverThreshold"] is True
    assert end["errorMessage"].startswith("Context is still over the compaction threshold")


async def test_a_fork_is_told_on_the_forked_session_as_one_process(tmp_path: Path) -> None:
    async def fork(served: Served) -> list[dict[str, Any]]:
        target = {"session_id": served.session_id, "entry_id": USER_MESSAGE}
        answer = (await served.call("session.fork", **target))["result"]
        # Where the fork lives is each host's own (a file beside, or the store's id).
        return [{"cancelled": answer["cancelled"], "editorText": answer["editorText"]}]

    answers, served, _ = await on_both_hosts(tmp_path, scripted([]), fork)
    assert answers[0]["cancelled"] is False
    assert served.events() == [
        {
            "type": "session_fork",
            "previousSessionFile": "#0",
            "newSessionFile": "#1",
            "entryId": "#2",
        }
    ]
    (note,) = served.notes
    assert note["params"]["event"]["entryId"] == USER_MESSAGE
