"""``serve --temporal``'s methods, in process, against a real Temporal server (issue 10).

The same requests as a one-process server answers, through :class:`Dispatcher`, with an
in-process worker; the answers have the same shapes and the same error codes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import CompressResult  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._core.errors import Cancelled, ConflictError, ModelError  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._lifecycle.names import OperationState  # noqa: E402
from orchestrator._rpc.cluster_hub import NO_WORKER_AGENT, ClusterHub, compress_answer  # noqa: E402
from orchestrator._rpc.hub import RuntimeOptions, SessionHub  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher, Peer  # noqa: E402
from orchestrator._runtime.agent import Agent  # noqa: E402
from orchestrator._runtime.operation.routes import RouteSettings, build_summarizer  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator.testing import ScriptedAgent, reply  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    local_copy,
    queue_name,
    sans_operation_id,
    temporal_address,
)

pytestmark = pytest.mark.anyio
SETTINGS = RuntimeSettings(compaction=CompactionSettings(keep_recent_tokens=200))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def serving(
    database: Database, agent_factory: Callable[[], Agent] | None = None
) -> AsyncIterator[Dispatcher]:
    queue = queue_name()
    async with connected() as client:
        activities = SessionActivities(
            database.location,
            build_summarizer(RouteSettings()),
            SETTINGS,
            agent_factory=agent_factory,
        )
        async with build_worker(client, activities, task_queue=queue):
            cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
            hub = ClusterHub(temporal_address(), database.location, client=cluster)
            yield Dispatcher(hub.methods())


async def call(dispatcher: Dispatcher, method: str, **params: Any) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = await dispatcher.handle_text(json.dumps(request), Peer())
    assert answer is not None
    result: dict[str, Any] = json.loads(answer)
    return result


async def test_the_cluster_server_answers_as_a_one_process_server(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    async with serving(database) as rpc:
        opened = (await call(rpc, "session.open", path=f"{session_id}.jsonl"))["result"]
        assert (opened["session_id"], opened["busy"], opened["state"]) == (
            session_id,
            False,
            "idle",
        )
        assert opened["entries"] == len(database.entries(session_id))
        listed = (await call(rpc, "session.list"))["result"]["sessions"]
        assert [s["session_id"] for s in listed] == [session_id]
        tree = (await call(rpc, "session.tree", session_id=session_id))["result"]
        assert tree["leafId"] == opened["leafId"]
        done = (await call(rpc, "session.compress", session_id=session_id))["result"]
        assert done["compacted"] is True
        assert [e["id"] for e in database.new_compactions(session_id)] == [done["entryId"]]
        context = (await call(rpc, "session.context", session_id=session_id))["result"]
        assert context["leafId"] == done["entryId"]
        assert (await call(rpc, "session.abort", session_id=session_id))["result"] == {
            "aborted": False
        }
        for method, extra in (
            ("session.tree.navigate", {"target_id": "x"}),
            ("session.fork", {"entry_id": "x"}),
        ):
            refused = (await call(rpc, method, session_id=session_id, **extra))["error"]
            assert sans_operation_id(refused) == {
                "code": -32602,
                "message": "Entry x not found",
                **({"data": {"operationId": "<id>"}} if method == "session.tree.navigate" else {}),
            }
        # A worker without an agent refuses a prompt as a server without --model does, naming
        # the workers' --model (this server's would do nothing).
        refused = (await call(rpc, "session.prompt", session_id=session_id, text="hi"))["error"]
        assert refused == {"code": -32601, "message": NO_WORKER_AGENT}
        assert (await call(rpc, "session.close", session_id=session_id))["result"] == {
            "closed": True
        }
        unknown = (await call(rpc, "session.tree", session_id=session_id))["error"]
        assert unknown == {"code": -32602, "message": f"Unknown session: {session_id}"}
        missing = (await call(rpc, "session.open", path="nobody"))["error"]
        assert missing["code"] == -32602
        assert "no such session" in missing["message"]
        nameless = (await call(rpc, "session.open", path="/"))["error"]
        assert nameless == {"code": -32602, "message": "'/': not a session id"}


def test_compress_answers_map_every_ending_as_the_one_process_server_does() -> None:
    skipped = CompressResult(
        status=OperationState.SKIPPED, reason="Nothing to compact", operation_id="op"
    )
    assert compress_answer(skipped) == {"compacted": False, "reason": "Nothing to compact"}
    with pytest.raises(Cancelled):
        compress_answer(CompressResult(status=OperationState.CANCELLED, operation_id="op"))
    with pytest.raises(ConflictError):
        compress_answer(
            CompressResult(status=OperationState.CONFLICT, error="moved", operation_id="op")
        )
    with pytest.raises(ModelError) as failed:
        compress_answer(
            CompressResult(
                status=OperationState.FAILED, error="x", error_kind="transient", operation_id="op"
            )
        )
    assert failed.value.kind == "transient"


def one_process(agent: Agent) -> Dispatcher:
    options = RuntimeOptions(
        agent_factory=lambda: agent,
        summarizer=build_summarizer(RouteSettings()),
        settings=SETTINGS,
    )
    return Dispatcher(SessionHub(options).methods())


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """A prompt's answer without what two runs never share (timestamps)."""
    result = dict(answer["result"])
    if result.get("reply") is not None:
        result["reply"] = {k: v for k, v in result["reply"].items() if k != "timestamp"}
    return {**answer, "result": result}


async def test_a_prompt_through_the_cluster_answers_as_through_one_process(
    tmp_path: Path,
) -> None:
    script = [[reply("Hello back.", tokens=1200)]]
    local = one_process(ScriptedAgent(script))
    path = local_copy(tmp_path / "local")
    opened = (await call(local, "session.open", path=str(path)))["result"]
    local_answer = await call(local, "session.prompt", session_id=opened["session_id"], text="hi")
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    agent = ScriptedAgent(script)
    async with serving(database, lambda: agent) as rpc:
        await call(rpc, "session.open", path=session_id)
        answer = await call(rpc, "session.prompt", session_id=session_id, text="hi")
        listed = (await call(rpc, "session.list"))["result"]["sessions"]
        missing_text = await call(rpc, "session.prompt", session_id=session_id)
        unknown = await call(rpc, "session.prompt", session_id="nobody", text="hi")
    assert comparable(answer) == comparable(local_answer)
    assert answer["result"]["state"] == "idle"
    assert answer["result"]["reply"]["content"] == [{"type": "text", "text": "Hello back."}]
    assert (listed[0]["state"], listed[0]["busy"]) == ("idle", False)
    local_missing = await call(local, "session.prompt", session_id=opened["session_id"])
    assert missing_text["error"]["code"] == local_missing["error"]["code"] == -32602
    local_unknown = await call(local, "session.prompt", session_id="nobody", text="hi")
    assert unknown["error"] == local_unknown["error"]
    await call(local, "session.close", session_id=opened["session_id"])


class IdleWorkflows:
    """The one query ``session.close`` makes of the cluster: every session is idle."""

    async def state(self, session_id: str) -> dict[str, Any]:
        return {"busy": False}


async def test_closing_a_cluster_session_tells_every_connection_that_followed_it(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    workflows: Any = IdleWorkflows()
    hub = ClusterHub("127.0.0.1:1", database.location, client=workflows)
    rpc = Dispatcher(hub.methods())
    owner, follower = Peer(), Peer()
    received: dict[Peer, list[dict[str, Any]]] = {owner: [], follower: []}
    for peer in (owner, follower):
        hub.listen(received[peer].append, peer)

    async def call(peer: Peer, method: str, **params: Any) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer: dict[str, Any] = await rpc.handle(request, peer)
        return answer

    for peer in (owner, follower):
        assert (await call(peer, "session.open", path=session_id))["result"]["busy"] is False
    assert (await call(owner, "session.close", session_id=session_id))["result"] == {"closed": True}
    ended = {"session_id": session_id, "event": {"type": "session_closed"}}
    assert [n["params"] for n in received[follower]] == [ended]
    assert [n["params"] for n in received[owner]] == [ended]
    assert session_id not in follower.topics
    unknown = (await call(follower, "session.tree", session_id=session_id))["error"]
    assert unknown == {"code": -32602, "message": f"Unknown session: {session_id}"}
