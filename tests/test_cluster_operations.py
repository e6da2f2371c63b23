"""Operation ids on the cluster: the outcome outlives the caller and its server (issue 36).

Against the real Temporal server, in-process workers (as tests/test_cluster_navigation.py): a
compaction whose caller goes away mid-way (its request cancelled, as when its server dies) goes
on in the session's workflow; another server, which never saw it, answers ``session.operation``
with "running", then with the outcome the first caller would have had, also once the
workflow's run has idled out. The blip (the Temporal server gone mid-request, ``-32008`` with
the id) is in tests/test_cluster_unreachable.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import WorkflowExecutionStatus  # noqa: E402

from orchestrator._cli.operation import ask_cluster  # noqa: E402
from orchestrator._core.errors import SessionError  # noqa: E402
from orchestrator._core.model import ModelRequest  # noqa: E402
from orchestrator._rpc.cluster_hub import ClusterHub  # noqa: E402
from orchestrator._rpc.errors import CANCELLED
from orchestrator._rpc.operations import UNKNOWN_OPERATION  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher
from orchestrator.testing import FunctionModel, summary_text  # noqa: E402
from tests.cluster_kit import Database, temporal_address  # noqa: E402
from tests.test_cluster import routes  # noqa: E402
from tests.test_cluster_navigation import (  # noqa: E402
    ASSISTANT,
    Cluster,
    call,
    cluster_serving,
)
from tests.test_rpc_operations import compacted  # noqa: E402

pytestmark = pytest.mark.anyio
COMMAND = (sys.executable, "-m", "orchestrator", "operation")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gate:
    """A summarizer that answers once released."""

    def __init__(self) -> None:
        self.called = anyio.Event()
        self.released = anyio.Event()

    async def answer(self, request: ModelRequest) -> str:
        self.called.set()
        await self.released.wait()
        return summary_text("summary of the history", purpose=request.purpose)


async def another_server(remote: Cluster) -> Dispatcher:
    """A new server over the same cluster, with the session open (it knows no operation)."""
    hub = ClusterHub(temporal_address(), remote.database.location, client=remote.cluster)
    rpc = Dispatcher(hub.methods())
    assert "result" in await call(rpc, "session.open", path=remote.session_id)
    return rpc


async def operation(rpc: Dispatcher, session_id: str, operation_id: str) -> dict[str, Any]:
    answer = await call(rpc, "session.operation", session_id=session_id, operationId=operation_id)
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


async def test_a_compaction_whose_caller_left_is_found_by_another_server(
    cluster_database: Database,
) -> None:
    gate = Gate()
    async with cluster_serving(cluster_database, routes(FunctionModel(gate.answer))) as remote:
        sid = remote.session_id
        with anyio.CancelScope() as caller:  # the caller (and its server) goes away mid-way

            async def leave() -> None:
                await gate.called.wait()
                caller.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(leave)
                await call(remote.rpc, "session.compress", session_id=sid, operationId="gone-1")
        rpc = await another_server(remote)
        assert await operation(rpc, sid, "gone-1") == {"operationId": "gone-1", "state": "running"}
        gate.released.set()
        while (done := await operation(rpc, sid, "gone-1"))["state"] == "running":
            await anyio.sleep(0.05)
        [entry] = cluster_database.new_compactions(sid)
        assert done == compacted(entry, "gone-1")
        # The run idles out (idle_s 0.2): a third server still finds the outcome in it.
        handle = remote.client.get_workflow_handle(sid)
        while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await anyio.sleep(0.05)
        third = await another_server(remote)
        assert await operation(third, sid, "gone-1") == done
        # A later run (another compaction): "gone-1" is found in the run before it.
        later = await call(third, "session.compress", session_id=sid, operationId="later-1")
        assert later["result"]["operationId"] == "later-1"
        assert await operation(await another_server(remote), sid, "gone-1") == done
        unknown = await call(third, "session.operation", session_id=sid, operationId="never")
        assert unknown["error"]["code"] == UNKNOWN_OPERATION
        assert unknown["error"]["data"] == {"operationId": "never"}
        # The command line asks Temporal directly, as any server does.
        asked = [*COMMAND, f"{sid}.jsonl", "gone-1", "--temporal", temporal_address()]
        shown = await anyio.run_process([*asked, "--json"])
        assert json.loads(shown.stdout) == done
        shown = await anyio.run_process(asked)
        assert shown.stdout.decode().splitlines() == [
            "operation gone-1: done",
            f"compacted: entry {entry['id']} (tokens before: {entry['tokensBefore']})",
        ]
        assert await ask_cluster(temporal_address(), sid, "gone-1") == done
        with pytest.raises(SessionError) as never:
            await ask_cluster(temporal_address(), sid, "never")
        assert str(never.value) == f"operation never is not known in session {sid}"
        refused = await anyio.run_process([*asked[:5], "never", *asked[6:]], check=False)
        assert (refused.returncode, refused.stdout, refused.stderr.decode()) == (
            1,
            b"",
            f"orchestrator operation: operation never is not known in session {sid}\n",
        )


async def test_without_waiting_on_the_cluster_and_a_cancelled_outcome_recalled(
    cluster_database: Database,
) -> None:
    gate = Gate()
    async with cluster_serving(cluster_database, routes(FunctionModel(gate.answer))) as remote:
        sid = remote.session_id
        started = await call(remote.rpc, "session.compress", session_id=sid, wait=False)
        operation_id = started["result"]["operationId"]
        assert started["result"] == {"operationId": operation_id, "state": "running"}
        await gate.called.wait()
        assert (await call(remote.rpc, "session.abort", session_id=sid))["result"] == {
            "aborted": True
        }
        while (here := await operation(remote.rpc, sid, operation_id))["state"] == "running":
            await anyio.sleep(0.05)
        assert here["state"] == "cancelled"
        assert here["error"]["code"] == CANCELLED
        assert here["error"]["data"]["operationId"] == operation_id
        # Another server reads the same outcome from the workflow's update.
        assert await operation(await another_server(remote), sid, operation_id) == here
        assert cluster_database.new_compactions(sid) == []


async def test_navigations_are_recalled_with_their_answer_or_their_error(
    cluster_database: Database,
) -> None:
    gate = Gate()
    gate.released.set()
    async with cluster_serving(cluster_database, routes(FunctionModel(gate.answer))) as remote:
        sid = remote.session_id
        moved = await call(
            remote.rpc, "session.tree.navigate", session_id=sid, target_id=ASSISTANT, wait=False
        )
        operation_id = moved["result"]["operationId"]
        while (here := await operation(remote.rpc, sid, operation_id))["state"] == "running":
            await anyio.sleep(0.05)
        assert here["state"] == "done"
        assert here["result"]["newLeafId"] == ASSISTANT
        refused = await call(
            remote.rpc, "session.tree.navigate", session_id=sid, target_id="nope", operationId="n"
        )
        assert refused["error"] == {
            "code": -32602,
            "message": "Entry nope not found",
            "data": {"operationId": "n"},
        }
        elsewhere = await another_server(remote)
        assert await operation(elsewhere, sid, operation_id) == here
        assert await operation(elsewhere, sid, "n") == {
            "operationId": "n",
            "state": "failed",
            "error": refused["error"],
        }
