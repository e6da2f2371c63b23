"""Tree navigation and fork on the cluster, against a real Temporal server (issue 10).

Each navigation runs through a one-process server (``SessionHub``) on a copy of the example
session and through ``serve --temporal``'s methods (``ClusterHub``, an in-process worker) on the
shared store, and the answers, the journal's steps (navigation and branch-summary operation) and
the tree afterwards are compared: the navigation table decides on both hosts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import Client  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from orchestrator._cluster.calls import Nav, NavCall, derived_id  # noqa: E402
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import NavigateRequest  # noqa: E402
from orchestrator._cluster.navigation.activities import TreeActivities  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker, workflow_runner  # noqa: E402
from orchestrator._cluster.workflow import SessionWorkflow  # noqa: E402
from orchestrator._rpc.cluster_hub import ClusterHub  # noqa: E402
from orchestrator._rpc.hub import RuntimeOptions, SessionHub  # noqa: E402
from orchestrator._rpc.protocol import Dispatcher, Peer  # noqa: E402
from orchestrator._runtime.agent import Agent  # noqa: E402
from orchestrator._runtime.hooks import Hooks  # noqa: E402
from orchestrator._runtime.navigation.moves import LEAF_MARKER  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator.testing import ScriptedAgent, reply, summary_text  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    local_copy,
    queue_name,
    sans_operation_id,
    save_history,
    temporal_address,
)
from tests.test_cluster import HANG, SETTINGS, routes, scripted  # noqa: E402

pytestmark = pytest.mark.anyio

OLD_LEAF = "935170bb"  # the example's last entry (a label on the main branch)
OTHER_TIP = "11a25bfa"  # the tip of the abandoned branch
USER_MESSAGE = "5c5581d4"  # a user message on that branch (its parent: be1e0823)
ASSISTANT = "8ff34739"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def summaries() -> SummaryRoutes:
    script = {
        "branch": [summary_text("the branch")] * 4,
        "history": [summary_text("the history")],
        "turn_prefix": [summary_text("prefix", purpose="turn_prefix")],
    }
    return routes(scripted("a", script))


async def call(rpc: Dispatcher, method: str, **params: Any) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = await rpc.handle_text(json.dumps(request), Peer())
    assert answer is not None
    result: dict[str, Any] = json.loads(answer)
    return result


@dataclass
class Cluster:
    """A cluster server over a store, its client, and the session it opened."""

    rpc: Dispatcher
    cluster: ClusterClient
    client: Client
    database: Database
    session_id: str


@asynccontextmanager
async def cluster_serving(
    database: Database,
    summarizer: SummaryRoutes,
    *,
    hooks: Hooks | None = None,
    history_bound: int = 5000,
    agent: Agent | None = None,
) -> AsyncIterator[Cluster]:
    session_id = database.add_example()
    queue = queue_name()
    async with connected() as client:
        activities = SessionActivities(
            database.location,
            summarizer,
            SETTINGS,
            hooks,
            agent_factory=None if agent is None else (lambda: agent),
        )
        async with build_worker(client, activities, task_queue=queue):
            cluster = ClusterClient(
                client, task_queue=queue, idle_s=0.2, history_bound=history_bound
            )
            hub = ClusterHub(temporal_address(), database.location, client=cluster)
            rpc = Dispatcher(hub.methods())
            opened = await call(rpc, "session.open", path=session_id)
            assert opened["result"]["leafId"] == OLD_LEAF
            yield Cluster(rpc, cluster, client, database, session_id)


@asynccontextmanager
async def local_serving(tmp_path: Path, summarizer: SummaryRoutes) -> AsyncIterator[Any]:
    path = local_copy(tmp_path / "local")
    hub = SessionHub(RuntimeOptions(summarizer=summarizer, settings=SETTINGS))
    rpc = Dispatcher(hub.methods())
    opened = (await call(rpc, "session.open", path=str(path)))["result"]
    try:
        yield rpc, opened["session_id"], path
    finally:
        hub.close_all()


def local_rows(path: Path) -> list[tuple[Any, ...]]:
    journal = Path(str(path) + ".journal")
    records = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    return [_row(r) for r in records if r["machine"] in ("navigation", "operation")]


def cluster_rows(database: Database, session_id: str) -> list[tuple[Any, ...]]:
    from orchestrator._cluster.stores import cluster_journal

    journal = cluster_journal(database.location, session_id)
    records = [r.as_json() for r in journal.records()]
    return [_row(r) for r in records if r["machine"] in ("navigation", "operation")]


def _row(record: dict[str, Any]) -> tuple[Any, ...]:
    facts = record["data"].get("facts", {})
    return (record["machine"], record["from"], record["event"], record["to"], facts)


NAVIGATIONS: list[dict[str, Any]] = [
    {"target_id": OTHER_TIP, "summarize": True},
    {"target_id": USER_MESSAGE},
    {"target_id": ASSISTANT, "summarize": True, "focus": "the tax", "label": "here"},
    {"target_id": ASSISTANT},  # the label is the leaf: a move back to the assistant message
    {"target_id": OLD_LEAF},
    {"target_id": OLD_LEAF, "summarize": True},  # the same position: nothing happens
    {"target_id": OTHER_TIP, "label": "tip"},
]


def comparable(answer: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
    """An answer with the ids the hosts choose differently (new entries, the operation's) named
    by their role."""
    new = {n["id"] for n in tree["nodes"]} - KNOWN
    out = sans_operation_id(answer)
    for key in ("newLeafId", "oldLeafId", "summaryEntryId"):
        if out.get(key) in new:
            out[key] = "<new>"
    return out


KNOWN = {
    json.loads(line)["id"]
    for line in (Path(__file__).parent / "data" / "example-session.jsonl").read_text().splitlines()
}


async def test_navigations_answer_and_journal_as_on_one_process_server(
    tmp_path: Path, cluster_database: Database
) -> None:
    async with (
        local_serving(tmp_path, summaries()) as (local, local_id, path),
        cluster_serving(cluster_database, summaries()) as remote,
    ):
        for params in NAVIGATIONS:
            one = await call(local, "session.tree.navigate", session_id=local_id, **params)
            two = await call(
                remote.rpc, "session.tree.navigate", session_id=remote.session_id, **params
            )
            tree_one = (await call(local, "session.tree", session_id=local_id))["result"]
            tree_two = (await call(remote.rpc, "session.tree", session_id=remote.session_id))[
                "result"
            ]
            assert comparable(two["result"], tree_two) == comparable(one["result"], tree_one)
            assert (tree_two["leafId"] in KNOWN) == (tree_one["leafId"] in KNOWN)
            if tree_one["leafId"] in KNOWN:
                assert tree_two["leafId"] == tree_one["leafId"]
            context_one = (await call(local, "session.context", session_id=local_id))["result"]
            context_two = (await call(remote.rpc, "session.context", session_id=remote.session_id))[
                "result"
            ]
            assert len(context_two["messages"]) == len(context_one["messages"])
        assert cluster_rows(cluster_database, remote.session_id) == local_rows(path)
        entries = cluster_database.entries(remote.session_id)
    summaries_written = [
        e for e in entries if e["type"] == "branch_summary" and e["id"] not in KNOWN
    ]
    assert ["the branch" in e["summary"] for e in summaries_written] == [True, True]
    assert summaries_written[0]["fromId"] == OLD_LEAF
    markers = [e for e in entries if e.get("customType") == LEAF_MARKER]
    assert [m["parentId"] for m in markers] == ["be1e0823", ASSISTANT, OLD_LEAF, OTHER_TIP]
    labels = [e for e in entries if e["type"] == "label" and e["id"] not in KNOWN]
    assert [(e["targetId"], e["label"]) for e in labels] == [
        (summaries_written[1]["id"], "here"),
        (OTHER_TIP, "tip"),
    ]


async def test_a_navigation_with_a_summary_replays(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    async with cluster_serving(database, summaries()) as remote:
        done = await call(
            remote.rpc,
            "session.tree.navigate",
            session_id=remote.session_id,
            target_id=OTHER_TIP,
            summarize=True,
        )
        assert done["result"]["summaryEntryId"] is not None
        history = await finished_history(remote)
    save_history("navigate_summary", history)


async def finished_history(remote: Cluster) -> str:
    handle = remote.client.get_workflow_handle(remote.session_id)
    await handle.result()
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)
    return history.to_json()


async def wait_for(remote: Cluster, key: str, value: str) -> None:
    while True:
        state = await remote.cluster.state(remote.session_id)
        if state and state.get(key) == value:
            return
        await anyio.sleep(0.05)


async def during(
    remote: Cluster, body: Callable[[], Coroutine[Any, Any, None]], method: str, **params: Any
) -> dict[str, Any]:
    """Call ``method`` while ``body`` runs beside it; returns its answer."""
    answers: list[dict[str, Any]] = []

    async def request() -> None:
        answers.append(await call(remote.rpc, method, session_id=remote.session_id, **params))

    async with anyio.create_task_group() as group:
        group.start_soon(request)
        await body()
    return answers[0]


async def test_abort_while_summarizing_cancels_and_writes_nothing(
    cluster_database: Database,
) -> None:
    hanging = routes(scripted("a", {"branch": [HANG]}))
    async with cluster_serving(cluster_database, hanging) as remote:
        before = cluster_database.entries(remote.session_id)

        async def abort() -> None:
            await wait_for(remote, "operationState", "summarizing")
            state = await remote.cluster.state(remote.session_id)
            assert state is not None
            assert (state["busy"], state["navigationState"]) == (True, "summarizing")
            aborted = await call(remote.rpc, "session.abort", session_id=remote.session_id)
            assert aborted["result"] == {"aborted": True}

        answer = await during(
            remote, abort, "session.tree.navigate", target_id=OTHER_TIP, summarize=True
        )
        assert sans_operation_id(answer["result"]) == {
            "cancelled": True,
            "aborted": True,
            "editorText": None,
            "newLeafId": OLD_LEAF,
            "oldLeafId": OLD_LEAF,
            "summaryEntryId": None,
            "shortSummary": None,
            "operationId": "<id>",
        }
        assert cluster_database.entries(remote.session_id) == before
        rows = cluster_rows(cluster_database, remote.session_id)
        assert rows[-2:] == [
            ("operation", "summarizing", "cancel", "cancelled", {}),
            ("navigation", "summarizing", "cancel", "cancelled", {}),
        ]
        history = await finished_history(remote)
    if not is_database_url(cluster_database.location):
        save_history("navigate_abort", history)


async def test_refusals_while_work_runs_are_the_one_process_servers(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    model = scripted("a", {"history": [HANG], "turn_prefix": [HANG], "branch": [HANG]})
    async with cluster_serving(database, routes(model)) as remote:
        rpc, sid = remote.rpc, remote.session_id

        async def navigate_while_compacting() -> None:
            await wait_for(remote, "operationState", "summarizing")
            refused = await call(rpc, "session.tree.navigate", session_id=sid, target_id=ASSISTANT)
            assert sans_operation_id(refused["error"]) == {
                "data": {"operationId": "<id>"},
                "code": -32001,
                "message": "Cannot navigate while the agent is working; wait for the turn "
                "to end or abort it",
            }
            await call(rpc, "session.abort", session_id=sid)

        compressed = await during(remote, navigate_while_compacting, "session.compress")
        assert compressed["error"]["code"] == -32003  # cancelled, as one server answers

        async def others_while_navigating() -> None:
            await wait_for(remote, "navigationState", "summarizing")
            again = await call(rpc, "session.tree.navigate", session_id=sid, target_id=ASSISTANT)
            assert sans_operation_id(again["error"]) == {
                "data": {"operationId": "<id>"},
                "code": -32001,
                "message": "A navigation is already running in this session",
            }
            compress = await call(rpc, "session.compress", session_id=sid)
            assert sans_operation_id(compress["error"]) == {
                "data": {"operationId": "<id>"},
                "code": -32001,
                "message": "Cannot compact while a navigation is running",
            }
            listed = (await call(rpc, "session.list"))["result"]["sessions"]
            assert [(s["busy"], s["state"]) for s in listed] == [(True, "idle")]
            closing = await call(rpc, "session.close", session_id=sid)
            assert closing["error"]["code"] == -32001
            await call(rpc, "session.abort", session_id=sid)

        navigated = await during(
            remote,
            others_while_navigating,
            "session.tree.navigate",
            target_id=OTHER_TIP,
            summarize=True,
        )
        assert navigated["result"]["cancelled"] is True
        rows = cluster_rows(database, sid)
        # The session machine refused the navigation during the compaction in the update's
        # validator: no navigation started, so only the admitted one left rows.
        started = [r for r in rows if r[:3] == ("navigation", "idle", "navigate")]
        assert [r[3] for r in started] == ["collecting"]


async def test_bad_parameters_are_refused_as_by_one_server(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    async with (
        local_serving(tmp_path, summaries()) as (local, local_id, _),
        cluster_serving(database, summaries()) as remote,
    ):
        for method, params in (
            ("session.tree.navigate", {"target_id": "nope"}),
            ("session.tree.navigate", {"target_id": ASSISTANT, "focus": "x"}),
            ("session.tree.navigate", {"target_id": ASSISTANT, "replace_instructions": True}),
            ("session.fork", {"entry_id": ASSISTANT}),
            ("session.fork", {"entry_id": "nope"}),
        ):
            one = await call(local, method, session_id=local_id, **params)
            two = await call(remote.rpc, method, session_id=remote.session_id, **params)
            assert sans_operation_id(two["error"]) == sans_operation_id(one["error"]), (
                method,
                params,
            )


async def test_hooks_on_the_worker_cancel_or_supply_the_summary(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    hooks = Hooks()
    seen: list[dict[str, Any]] = []

    def before(payload: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(payload["preparation"])
        if payload["preparation"]["targetId"] == ASSISTANT:
            return {"cancel": True}
        return {"summary": {"summary": "from the hook", "details": {"k": 1}}}

    trees: list[dict[str, Any]] = []
    hooks.on("session_before_tree", before)
    hooks.on("session_tree", trees.append)
    model = scripted("a", {})
    async with cluster_serving(database, routes(model), hooks=hooks) as remote:
        sid = remote.session_id
        cancelled = await call(
            remote.rpc, "session.tree.navigate", session_id=sid, target_id=ASSISTANT
        )
        assert cancelled["result"]["cancelled"] is True
        assert cancelled["result"]["aborted"] is False
        supplied = await call(
            remote.rpc,
            "session.tree.navigate",
            session_id=sid,
            target_id=OTHER_TIP,
            summarize=True,
        )
        entry_id = supplied["result"]["summaryEntryId"]
        assert supplied["result"]["newLeafId"] == entry_id
        (entry,) = [e for e in database.entries(sid) if e["id"] == entry_id]
        assert (entry["summary"], entry["fromExtension"], entry["parentId"]) == (
            "from the hook",
            True,
            OTHER_TIP,
        )
        # Asked for no summary: the hook's is ignored and the leaf only moves.
        plain = await call(
            remote.rpc, "session.tree.navigate", session_id=sid, target_id=USER_MESSAGE
        )
        assert plain["result"]["summaryEntryId"] is None
        assert plain["result"]["editorText"] is not None
    assert model.requests == []
    assert seen[1]["entriesToSummarize"]
    assert seen[1]["commonAncestorId"] == "be1e0823"
    assert [t["fromExtension"] for t in trees] == [True, None]


def started(
    database: Database, session_id: str, navigation_id: str, request: NavigateRequest
) -> tuple[TreeActivities, Nav]:
    """The tree's activities over ``database``, and a navigation as ``nav_start`` found it."""
    tree = TreeActivities(SessionActivities(database.location, summaries(), SETTINGS))
    nav = Nav(session_id=session_id, navigation_id=navigation_id, request=request)
    found = tree._start(NavCall(nav=nav))
    assert found.nav is not None
    return tree, found.nav


async def test_a_redelivered_leaf_move_writes_once(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    tree, nav = started(database, session_id, "nav1", NavigateRequest(target_id=ASSISTANT))
    call_ = NavCall(nav=nav, entry_id=derived_id("nav1", "leaf"))
    tree._switch(call_)
    tree._switch(call_)  # delivered again after a lost worker
    markers = [e for e in database.entries(session_id) if e.get("customType") == LEAF_MARKER]
    assert [(m["id"], m["parentId"]) for m in markers] == [(derived_id("nav1", "leaf"), ASSISTANT)]
    # Another writer came first: the move is refused, nothing written.
    moved = NavCall(nav=nav, entry_id=derived_id("nav2", "leaf"))
    from temporalio.exceptions import ApplicationError

    with pytest.raises(ApplicationError, match="nothing was applied") as caught:
        tree._switch(moved)
    assert caught.value.type == "Conflict"


async def test_fork_creates_a_session_in_the_store_as_one_server_does(
    tmp_path: Path, cluster_database: Database
) -> None:
    async with (
        local_serving(tmp_path, summaries()) as (local, local_id, _),
        cluster_serving(cluster_database, summaries()) as remote,
    ):
        one = (await call(local, "session.fork", session_id=local_id, entry_id=USER_MESSAGE))[
            "result"
        ]
        two = (
            await call(
                remote.rpc, "session.fork", session_id=remote.session_id, entry_id=USER_MESSAGE
            )
        )["result"]
        assert set(two) == set(one)
        for key in ("entries", "editorText", "cancelled", "busy", "state"):
            assert two[key] == one[key], key
        new_id = two["session_id"]
        assert two["path"] == new_id
        forked = cluster_database.entries(new_id)
        assert forked[-1]["id"] == two["leafId"]  # a fresh label entry, as in the local fork
        assert forked[-1]["type"] == "label"
        listed = (await call(remote.rpc, "session.list"))["result"]["sessions"]
        assert new_id in {s["session_id"] for s in listed}
        named = (
            await call(
                remote.rpc,
                "session.fork",
                session_id=remote.session_id,
                entry_id=USER_MESSAGE,
                path=f"{new_id}.jsonl",
            )
        )["error"]
        assert named == {"code": -32602, "message": f"{new_id}: already exists"}
        chosen = (
            await call(
                remote.rpc,
                "session.fork",
                session_id=remote.session_id,
                entry_id=USER_MESSAGE,
                path="my-fork.jsonl",
            )
        )["result"]
        assert (chosen["session_id"], chosen["path"]) == ("my-fork", "my-fork.jsonl")


async def test_a_hook_may_cancel_a_fork(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    hooks = Hooks()
    forked: list[Any] = []
    hooks.on("session_before_fork", lambda payload: {"cancel": True})
    hooks.on("session_fork", forked.append)
    async with cluster_serving(database, summaries(), hooks=hooks) as remote:
        answer = await call(
            remote.rpc, "session.fork", session_id=remote.session_id, entry_id=USER_MESSAGE
        )
    assert answer["result"] == {
        "session_id": None,
        "path": None,
        "editorText": answer["result"]["editorText"],
        "cancelled": True,
    }
    assert answer["result"]["editorText"]
    assert forked == []


async def test_a_busy_session_continues_as_new_and_keeps_serving(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    async with cluster_serving(database, summaries(), history_bound=30) as remote:
        sid = remote.session_id
        first = await call(remote.rpc, "session.tree.navigate", session_id=sid, target_id=OLD_LEAF)
        assert first["result"]["newLeafId"] == OLD_LEAF
        first_run = await remote.client.get_workflow_handle(sid).describe()
        targets = [OTHER_TIP, ASSISTANT, OLD_LEAF, USER_MESSAGE] * 2
        for target in targets:
            answer = await call(
                remote.rpc, "session.tree.navigate", session_id=sid, target_id=target
            )
            assert "result" in answer, answer
        done = await call(remote.rpc, "session.compress", session_id=sid)
        assert done["result"]["compacted"] is True
        last = await remote.client.get_workflow_handle(sid).describe()
        assert last.run_id != first_run.run_id
        runs = [w async for w in remote.client.list_workflows(f"WorkflowId = '{sid}'")]
    assert len(runs) >= 3


def hanging(
    stopped: list[str], entered: anyio.Event | None = None
) -> Callable[[dict[str, Any]], Coroutine[Any, Any, None]]:
    """A hook handler that never returns (with ``entered``: only the first time, which sets it,
    and later calls note ``again``); it notes in ``stopped`` when it is cancelled."""

    async def hang(payload: dict[str, Any]) -> None:
        if entered is not None:
            if entered.is_set():
                stopped.append("again")
                return
            entered.set()
        try:
            await anyio.Event().wait()
        except BaseException:
            stopped.append("stopped")
            raise

    return hang


async def test_abort_while_a_hook_hangs_stops_it_and_nothing_is_written(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    hooks = Hooks()
    stopped: list[str] = []
    hooks.on("session_before_tree", hanging(stopped))
    async with cluster_serving(database, summaries(), hooks=hooks) as remote:
        before = database.entries(remote.session_id)

        async def abort() -> None:
            await wait_for(remote, "navigationState", "consulting_hooks")
            await call(remote.rpc, "session.abort", session_id=remote.session_id)

        answer = await during(remote, abort, "session.tree.navigate", target_id=OTHER_TIP)
        assert (answer["result"]["cancelled"], answer["result"]["aborted"]) == (True, False)
        assert database.entries(remote.session_id) == before
        rows = cluster_rows(database, remote.session_id)
        assert rows[-1] == ("navigation", "consulting_hooks", "cancel", "cancelled", {})
    assert stopped == ["stopped"]


def write_behind(database: Database, session_id: str) -> None:
    """Another writer appends to the session (as an import or a command might)."""
    from orchestrator._cluster.stores import cluster_store
    from orchestrator._store.session import Session

    with contextlib.closing(cluster_store(database.location, session_id)) as store:
        Session.from_store(store).append_custom("elsewhere", {"n": 1})


async def test_another_writer_first_makes_the_move_a_conflict_with_nothing_applied(
    cluster_database: Database,
) -> None:
    hooks = Hooks()
    writer: list[str] = []
    writing = hooks.on(
        "session_before_tree", lambda payload: write_behind(cluster_database, writer[0])
    )
    async with cluster_serving(cluster_database, summaries(), hooks=hooks) as remote:
        writer.append(remote.session_id)
        for params in ({"target_id": ASSISTANT}, {"target_id": OTHER_TIP, "summarize": True}):
            before = cluster_database.entries(remote.session_id)
            answer = await call(
                remote.rpc, "session.tree.navigate", session_id=remote.session_id, **params
            )
            assert answer["error"]["code"] == -32007, params
            assert sans_operation_id(answer["error"])["data"] == {
                "kind": "conflict",
                "applied": False,
                "operationId": "<id>",
            }
            after = cluster_database.entries(remote.session_id)
            assert [e["id"] for e in after[: len(before)]] == [e["id"] for e in before]
            assert [e.get("customType") for e in after[len(before) :]] == ["elsewhere"]
        rows = cluster_rows(cluster_database, remote.session_id)
        assert [r[1:4] for r in rows if r[0] == "operation"][-1][2] == "conflict"
        assert rows[-1][:4] == ("navigation", "summarizing", "summary_failed", "failed")
        # The refused move holds nothing: the session is idle and the next navigation moves.
        state = await remote.cluster.state(remote.session_id)
        assert state is None or (state["busy"], state["navigationState"]) == (False, None)
        writing()  # no more writes behind
        moved = await call(
            remote.rpc, "session.tree.navigate", session_id=remote.session_id, target_id=ASSISTANT
        )
        assert moved["result"]["editorText"] is None
        assert moved["result"]["newLeafId"] == ASSISTANT


async def test_another_writer_after_the_move_makes_the_label_a_conflict_and_no_label_is_written(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    request = NavigateRequest(target_id=ASSISTANT, label="here")
    tree, nav = started(database, session_id, "nav1", request)
    tree._switch(NavCall(nav=nav, entry_id=derived_id("nav1", "leaf")))
    write_behind(database, session_id)  # between the move and its label
    before = database.entries(session_id)
    from temporalio.exceptions import ApplicationError

    label = NavCall(nav=nav, label_id=derived_id("nav1", "label"))
    with pytest.raises(ApplicationError, match="the label was not written") as caught:
        tree._label(label)
    assert caught.value.type == "Conflict"
    assert database.entries(session_id) == before
    # Without another writer the label is written, once, as a child of the new leaf.
    other = database.add_example()
    tree, nav = started(database, other, "nav2", request)
    tree._switch(NavCall(nav=nav, entry_id=derived_id("nav2", "leaf")))
    label = NavCall(nav=nav, label_id=derived_id("nav2", "label"))
    tree._label(label)
    tree._label(label)  # delivered again
    labels = [e for e in database.entries(other) if e["type"] == "label" and e["id"] not in KNOWN]
    assert [(e["id"], e["targetId"], e["parentId"]) for e in labels] == [
        (derived_id("nav2", "label"), ASSISTANT, ASSISTANT)
    ]


async def test_abort_while_session_tree_hangs_stops_it_and_the_move_stands_as_in_one_process(
    tmp_path: Path,
) -> None:
    stopped: list[str] = []
    called: list[anyio.Event] = []

    def hooks() -> Hooks:
        made = Hooks()
        entered = anyio.Event()
        called.append(entered)
        made.on("session_tree", hanging(stopped, entered))
        return made

    params = {"target_id": ASSISTANT, "label": "here"}
    path = local_copy(tmp_path / "local")
    options = RuntimeOptions(
        summarizer=summaries(), settings=SETTINGS, runtime_kwargs={"hooks": hooks()}
    )
    hub = SessionHub(options)
    local = Dispatcher(hub.methods())
    local_id = (await call(local, "session.open", path=str(path)))["result"]["session_id"]
    answers: list[dict[str, Any]] = []

    async def navigate_locally() -> None:
        answers.append(await call(local, "session.tree.navigate", session_id=local_id, **params))

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(navigate_locally)
            await called[0].wait()
            await call(local, "session.abort", session_id=local_id)
        local_tree = (await call(local, "session.tree", session_id=local_id))["result"]
    finally:
        hub.close_all()
    database = Database(str(tmp_path / "db"))
    async with cluster_serving(database, summaries(), hooks=hooks()) as remote:

        async def abort() -> None:
            await called[1].wait()
            aborted = await call(remote.rpc, "session.abort", session_id=remote.session_id)
            assert aborted["result"] == {"aborted": True}

        answer = await during(remote, abort, "session.tree.navigate", **params)
        tree = (await call(remote.rpc, "session.tree", session_id=remote.session_id))["result"]
        assert comparable(answer["result"], tree) == comparable(answers[0]["result"], local_tree)
        assert answer["result"]["cancelled"] is False
        labels = [e for e in database.entries(remote.session_id) if e["type"] == "label"]
        assert (labels[-1]["targetId"], labels[-1]["label"]) == (ASSISTANT, "here")
        rows = cluster_rows(database, remote.session_id)
        assert rows[-1][:4] == ("navigation", "switching_leaf", "switched", "done")
        again = await call(
            remote.rpc, "session.tree.navigate", session_id=remote.session_id, target_id=OLD_LEAF
        )
        assert again["result"]["newLeafId"] == OLD_LEAF
    # Stopped once on each host; the cluster ran it once more, for the next navigation only
    # (not a second delivery of the stopped one).
    assert stopped == ["stopped", "stopped", "again"]


async def test_a_prompt_while_navigating_is_refused_as_by_one_server(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    hanging = routes(scripted("a", {"branch": [HANG]}))
    agent = ScriptedAgent([[reply("hello")]])
    async with cluster_serving(database, hanging, agent=agent) as remote:

        async def prompt() -> None:
            await wait_for(remote, "navigationState", "summarizing")
            refused = await call(
                remote.rpc, "session.prompt", session_id=remote.session_id, text="hi"
            )
            assert refused["error"] == {
                "code": -32001,
                "message": "Cannot prompt while a navigation is running",
            }
            await call(remote.rpc, "session.abort", session_id=remote.session_id)

        answer = await during(
            remote, prompt, "session.tree.navigate", target_id=OTHER_TIP, summarize=True
        )
        assert answer["result"]["aborted"] is True
