"""Temporal's own workflow cancellation is an abort with D22's guarantees (issue 10).

``client.get_workflow_handle(session_id).cancel()`` while a compaction's model call hangs, while
the agent runs a turn, and while a navigation's branch summary is summarized: the work settles
through the tables' ``abort``/``cancel`` rows (the call or the agent is cancelled, nothing is
written, the journal's last step says cancelled), the request's caller gets the answer a
one-process ``session.abort`` gives, the run ends as cancelled, and the next request starts a
new run that serves it. The compaction's history is kept as a replay fixture
(``tests/data/temporal/cancel.json``, ``ORCHESTRATOR_RECORD=1``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError  # noqa: E402
from temporalio.exceptions import CancelledError  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from orchestrator._cluster.worker import workflow_runner  # noqa: E402
from orchestrator._cluster.workflow import SessionWorkflow  # noqa: E402
from orchestrator._core.model import ModelRequest  # noqa: E402
from orchestrator._rpc.hub import RuntimeOptions, SessionHub  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator.testing import (  # noqa: E402
    AgentHang,
    FunctionModel,
    ScriptedAgent,
    reply,
    summary_text,
)
from tests.cluster_kit import (  # noqa: E402
    Database,
    local_copy,
    sans_operation_id,
    save_history,
)
from tests.test_cluster import SETTINGS, routes  # noqa: E402
from tests.test_cluster_navigation import (  # noqa: E402
    OLD_LEAF,
    OTHER_TIP,
    USER_MESSAGE,
    Cluster,
    call,
    cluster_rows,
    cluster_serving,
    wait_for,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FirstCallHangs:
    """A summarizer whose first call hangs until it is cancelled; later calls answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0
        self.called = anyio.Event()

    async def answer(self, request: ModelRequest) -> str:
        self.calls += 1
        if self.calls == 1:
            self.called.set()
            try:
                await anyio.Event().wait()
            except BaseException:
                self.cancelled += 1
                raise
        return summary_text(f"summary of the {request.purpose}", purpose=request.purpose)

    def routes(self) -> SummaryRoutes:
        return routes(FunctionModel(self.answer, name="a"))


async def aborted_on_one_process(
    tmp_path: Path,
    method: str,
    params: dict[str, Any],
    started: Callable[[Dispatcher, str], Awaitable[None]],
    *,
    summarizer: SummaryRoutes,
    agent: ScriptedAgent | None = None,
) -> dict[str, Any]:
    """``method``'s answer on a one-process server when ``session.abort`` stops it."""
    path = local_copy(tmp_path / "local")
    options = RuntimeOptions(
        summarizer=summarizer,
        settings=SETTINGS,
        agent_factory=None if agent is None else (lambda: agent),
    )
    hub = SessionHub(options)
    rpc = Dispatcher(hub.methods())
    session_id = (await call(rpc, "session.open", path=str(path)))["result"]["session_id"]
    answers: list[dict[str, Any]] = []

    async def request() -> None:
        answers.append(await call(rpc, method, session_id=session_id, **params))

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(request)
            await started(rpc, session_id)
            assert (await call(rpc, "session.abort", session_id=session_id))["result"] == {
                "aborted": True
            }
    finally:
        hub.close_all()
    return answers[0]


async def cancelled_on_the_cluster(
    remote: Cluster,
    method: str,
    params: dict[str, Any],
    key: str,
    value: str,
    called: Sequence[object] = (None,),
) -> tuple[dict[str, Any], str]:
    """``method``'s answer when the session's workflow is cancelled once ``key`` is ``value``
    (and ``called`` is not empty: the agent has been called).

    Returns the answer and the cancelled run's history (replayed here), after checking that the
    run ended as cancelled.
    """
    handle = remote.client.get_workflow_handle(remote.session_id)
    answers: list[dict[str, Any]] = []

    async def request() -> None:
        answers.append(await call(remote.rpc, method, session_id=remote.session_id, **params))

    async with anyio.create_task_group() as group:
        group.start_soon(request)
        await wait_for(remote, key, value)
        while not called:
            await anyio.sleep(0.05)
        await handle.cancel()
    with pytest.raises(WorkflowFailureError) as ended:
        await handle.result()
    assert isinstance(ended.value.cause, CancelledError)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)
    return answers[0], history.to_json()


async def test_cancelling_the_workflow_mid_compaction_aborts_it_and_the_next_one_runs(
    tmp_path: Path, cluster_database: Database
) -> None:
    local_model = FirstCallHangs()

    async def summarizing(rpc: Dispatcher, session_id: str) -> None:
        await local_model.called.wait()

    local = await aborted_on_one_process(
        tmp_path, "session.compress", {}, summarizing, summarizer=local_model.routes()
    )
    model = FirstCallHangs()
    async with cluster_serving(cluster_database, model.routes()) as remote:
        sid = remote.session_id
        answer, history = await cancelled_on_the_cluster(
            remote, "session.compress", {}, "operationState", "summarizing"
        )
        assert sans_operation_id(answer["error"]) == sans_operation_id(local["error"])
        assert answer["error"]["code"] == -32003
        assert model.cancelled == 1
        assert cluster_database.new_compactions(sid) == []
        assert cluster_database.journal_rows(sid)[-1][:3] == ("summarizing", "cancel", "cancelled")
        assert cluster_database.turn_rows(sid)[-1][:3] == ("manual_compacting", "abort", "idle")
        # The next request starts a new run, which compacts.
        again = await call(remote.rpc, "session.compress", session_id=sid)
        assert again["result"]["compacted"] is True
        assert len(cluster_database.new_compactions(sid)) == 1
    if not is_database_url(cluster_database.location):
        save_history("cancel", history)


async def test_cancelling_the_workflow_mid_turn_stops_the_agent_and_the_next_prompt_runs(
    tmp_path: Path,
) -> None:
    local_agent = ScriptedAgent([[AgentHang()]])

    async def running(rpc: Dispatcher, session_id: str) -> None:
        while not local_agent.inputs:  # the agent runs (not only the turn's state)
            await anyio.sleep(0.05)

    local = await aborted_on_one_process(
        tmp_path,
        "session.prompt",
        {"text": "hello"},
        running,
        summarizer=FirstCallHangs().routes(),
        agent=local_agent,
    )
    database = Database(str(tmp_path / "db"))
    agent = ScriptedAgent([[AgentHang()], [reply("again")]])
    async with cluster_serving(database, FirstCallHangs().routes(), agent=agent) as remote:
        sid = remote.session_id
        before = database.new_entries(sid)
        answer, _ = await cancelled_on_the_cluster(
            remote, "session.prompt", {"text": "hello"}, "turnState", "running", agent.inputs
        )
        assert answer == local
        assert answer["result"]["reply"] is None
        # The user message is whole; the agent's run was stopped, none of it appended.
        added = database.new_entries(sid)[len(before) :]
        assert [e["message"]["role"] for e in added] == ["user"]
        assert database.turn_rows(sid)[-1][:4] == ("running", "abort", "idle", ("stop_agent",))
        again = await call(remote.rpc, "session.prompt", session_id=sid, text="again")
        assert again["result"]["reply"]["content"][0]["text"] == "again"


async def test_cancelling_the_workflow_mid_branch_summary_leaves_the_leaf_and_the_next_one_moves(
    tmp_path: Path, cluster_database: Database
) -> None:
    params = {"target_id": OTHER_TIP, "summarize": True}
    local_model = FirstCallHangs()

    async def summarizing(rpc: Dispatcher, session_id: str) -> None:
        await local_model.called.wait()

    local = await aborted_on_one_process(
        tmp_path, "session.tree.navigate", params, summarizing, summarizer=local_model.routes()
    )
    model = FirstCallHangs()
    async with cluster_serving(cluster_database, model.routes()) as remote:
        sid = remote.session_id
        before = cluster_database.entries(sid)
        answer, _ = await cancelled_on_the_cluster(
            remote, "session.tree.navigate", params, "operationState", "summarizing"
        )
        assert sans_operation_id(answer) == sans_operation_id(local)
        assert answer["result"]["cancelled"] is answer["result"]["aborted"] is True
        assert answer["result"]["newLeafId"] == OLD_LEAF
        assert model.cancelled == 1
        assert cluster_database.entries(sid) == before
        assert cluster_rows(cluster_database, sid)[-2:] == [
            ("operation", "summarizing", "cancel", "cancelled", {}),
            ("navigation", "summarizing", "cancel", "cancelled", {}),
        ]
        again = await call(remote.rpc, "session.tree.navigate", session_id=sid, **params)
        assert again["result"]["summaryEntryId"] is not None
        plain = await call(
            remote.rpc, "session.tree.navigate", session_id=sid, target_id=USER_MESSAGE
        )
        assert plain["result"]["editorText"] is not None
