"""No wedge: an activity that fails for the cluster's sake never leaves a session stuck.

In-process workers against the real Temporal server (and PostgreSQL where a connection is
killed), as in tests/test_cluster.py:

* ``prepare`` failing for good with a transient store error (after its retries): the caller is
  told the cluster failed (``UnavailableError``, ``-32008`` on the wire, not ``-32602``), the
  turn journal ends ``manual_compacting --activity_failed--> idle``, the session is idle, and
  the next ``session.compress`` commits.
* A turn whose append cannot reach the store: ``UnavailableError`` too, the turn journal ends
  ``running --activity_failed--> idle``, and the next prompt runs.
* ``finish`` (the last journal lines) never reaching the store: the commit stands.
* A navigation whose start cannot reach the store: ``UnavailableError``, the session idle.
* A PostgreSQL connection terminated (``pg_terminate_backend``) while the commit waits for the
  session's row: the commit is delivered again and commits once; no journal line twice.
* ``session.abort`` frees the session wherever a compaction stands (planning held behind a
  lock, the model call, the commit held behind the session's row): the session is idle and
  the next compaction runs.

The worker killed during ``prepare`` (SIGKILL, a second worker running) is in
tests/test_cluster_processes.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import Client  # noqa: E402
from temporalio.common import RetryPolicy as TemporalRetry  # noqa: E402

from orchestrator._cluster.calls import (  # noqa: E402
    Call,
    NavCall,
    NavReported,
    Op,
    Prepared,
    TurnCall,
    entry_id_for,
)
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import NavigateRequest  # noqa: E402
from orchestrator._cluster.navigation.activities import TreeActivities  # noqa: E402
from orchestrator._cluster.operation import flow as flow_module  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.turn.activities import TurnActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._core.entries import Entry  # noqa: E402
from orchestrator._core.errors import StoreUnavailableError, UnavailableError  # noqa: E402
from orchestrator._rpc.errors import UNAVAILABLE, error_for
from orchestrator.testing import ScriptedAgent, reply  # noqa: E402
from tests.cluster_kit import Database, connected, queue_name, save_history  # noqa: E402
from tests.test_cluster import HANG, HISTORY, PREFIX, SETTINGS, routes, scripted  # noqa: E402
from tests.test_cluster_turns import SETTINGS as TURN_SETTINGS  # noqa: E402
from tests.test_cluster_turns import summarizer as turn_summarizer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def quick_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Delivered activities retry twice, 0.1 s apart (the workflow reads the policy per call)."""
    quick = TemporalRetry(maximum_attempts=2, initial_interval=timedelta(milliseconds=100))
    monkeypatch.setattr(flow_module, "DELIVER", quick)


class FlakyStore(SessionActivities):
    """Activities whose planning cannot reach the store while ``down`` is set."""

    down = True
    attempts = 0

    def _prepare(self, op: Op, turn: TurnCall | None = None) -> Prepared:
        if self.down:
            type(self).attempts += 1
            raise StoreUnavailableError("postgresql://db: cannot connect: Connection refused")
        return super()._prepare(op, turn)


@asynccontextmanager
async def worker(client: Client, activities: SessionActivities) -> AsyncIterator[ClusterClient]:
    queue = queue_name()
    async with build_worker(client, activities, task_queue=queue):
        yield ClusterClient(client, task_queue=queue, idle_s=0.5)


async def idle(cluster: ClusterClient, session_id: str) -> dict[str, Any]:
    state = await cluster.state(session_id)
    assert state is not None
    assert (state["busy"], state["turnState"]) == (False, "idle")
    return state


@pytest.mark.usefixtures("quick_delivery")
async def test_planning_that_cannot_reach_the_store_is_unavailable_and_the_session_stays_usable(
    tmp_path: Any,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    summarizer = routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))
    activities = FlakyStore(database.location, summarizer, SETTINGS)
    async with connected() as client, worker(client, activities) as cluster:
        with pytest.raises(UnavailableError) as caught:
            await cluster.compress(session_id)
        message = str(caught.value)
        assert message.startswith("Cluster unavailable: prepare: ")
        assert "cannot connect" in message
        assert "\n" not in message
        assert error_for(caught.value).code == UNAVAILABLE  # -32008, not -32602
        assert FlakyStore.attempts == 2  # delivered again before giving up
        await idle(cluster, session_id)
        assert await cluster.abort(session_id) is False  # nothing left running to abort
        rows = [r[:3] for r in database.turn_rows(session_id)]
        assert rows == [
            ("idle", "manual_compact", "manual_compacting"),
            ("manual_compacting", "activity_failed", "idle"),
        ]
        assert database.new_compactions(session_id) == []

        FlakyStore.down = False  # the store is back: the same request works
        done = await cluster.compress(session_id)
        assert done.status == "committed"
        assert [e["id"] for e in database.new_compactions(session_id)] == [
            entry_id_for(done.operation_id)
        ]
        handle = client.get_workflow_handle(session_id)
        await handle.result()
        save_history("prepare_unavailable", (await handle.fetch_history()).to_json())


class LostFinish(SessionActivities):
    """Activities whose last journal lines (``finish``) never reach the store."""

    def _finish(self, call: Call) -> Entry | None:
        raise StoreUnavailableError("postgresql://db: cannot connect: Connection refused")


@pytest.mark.usefixtures("quick_delivery")
async def test_a_commit_stands_when_its_last_journal_lines_cannot_be_written(
    tmp_path: Any,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    summarizer = routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))
    activities = LostFinish(database.location, summarizer, SETTINGS)
    async with connected() as client, worker(client, activities) as cluster:
        done = await cluster.compress(session_id)
        assert done.status == "committed"  # a lost journal line does not undo a commit
        await idle(cluster, session_id)
    assert [e["id"] for e in database.new_compactions(session_id)] == [
        entry_id_for(done.operation_id)
    ]


@pytest.mark.usefixtures("quick_delivery")
async def test_a_navigation_that_cannot_reach_the_store_is_unavailable(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(self: TreeActivities, call: NavCall) -> NavReported:
        raise StoreUnavailableError("postgresql://db: cannot connect: Connection refused")

    monkeypatch.setattr(TreeActivities, "_start", unreachable)
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    target = database.entries(session_id)[2]["id"]
    activities = SessionActivities(database.location, routes(scripted("a", {})), SETTINGS)
    async with connected() as client, worker(client, activities) as cluster:
        with pytest.raises(UnavailableError, match=r"^Cluster unavailable: nav_start: "):
            await cluster.navigate(session_id, NavigateRequest(target_id=target))
        await idle(cluster, session_id)


class FlakyTurns(TurnActivities):
    """Turn activities whose appends cannot reach the store while ``down`` is set."""

    down = True

    def _append(self, call: TurnCall) -> None:
        if self.down:
            raise StoreUnavailableError("postgresql://db: cannot connect: Connection refused")
        super()._append(call)


@pytest.mark.usefixtures("quick_delivery")
async def test_a_turn_whose_append_cannot_reach_the_store_is_unavailable_and_the_next_runs(
    tmp_path: Any,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    agent = ScriptedAgent([[reply("hello back", tokens=10)]])
    activities = SessionActivities(
        database.location, turn_summarizer(), TURN_SETTINGS, agent_factory=lambda: agent
    )
    activities.turns = FlakyTurns(
        activities.stores, activities.settings, activities.turns.agent_factory
    )
    async with connected() as client, worker(client, activities) as cluster:
        with pytest.raises(UnavailableError, match=r"^Cluster unavailable: append: "):
            await cluster.prompt(session_id, "hello")
        await idle(cluster, session_id)
        assert [r[:3] for r in database.turn_rows(session_id)][-1] == (
            "running",
            "activity_failed",
            "idle",
        )
        assert database.new_entries(session_id) == []

        FlakyTurns.down = False
        done = await cluster.prompt(session_id, "hello")
        assert done.state == "idle"
        assert done.reply is not None
        assert done.reply["content"] == [{"type": "text", "text": "hello back"}]


# -- PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture
def named() -> Iterator[tuple[Database, str]]:
    """A database in a fresh schema whose worker connections carry a name of their own."""
    from tests.services import database_base_url, fresh_schema_url

    name = f"wedge-{uuid.uuid4().hex[:10]}"
    with fresh_schema_url(database_base_url()) as url:
        yield Database(f"{url}&application_name={name}"), name


def admin(database: Database, name: str) -> Any:
    """A connection of the test's own, not named like the worker's."""
    import psycopg

    return psycopg.connect(database.location.replace(f"&application_name={name}", ""))


def waiting(conn: Any, name: str) -> list[int]:
    """The worker's backends waiting for a lock."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (name,),
    ).fetchall()
    return [row[0] for row in rows]


async def until_waiting(conn: Any, name: str) -> list[int]:
    while not (pids := waiting(conn, name)):
        await anyio.sleep(0.05)
    return pids


class Held:
    """A side transaction of the test's own, holding a lock until released."""

    def __init__(self, database: Database, name: str, statement: str, *args: Any) -> None:
        self.conn = admin(database, name)
        self.conn.execute(statement, args)

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


async def test_a_commit_whose_connection_is_terminated_commits_after_a_retry(
    named: tuple[Database, str],
) -> None:
    database, name = named
    session_id = database.add_example()
    summarizer = routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))
    activities = SessionActivities(database.location, summarizer, SETTINGS)
    results: list[Any] = []
    async with connected() as client, worker(client, activities) as cluster:
        # Hold the session's row: the commit's transaction waits for it, in flight.
        held = Held(database, name, "SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", session_id)
        try:
            async with anyio.create_task_group() as group:

                async def compress() -> None:
                    results.append(await cluster.compress(session_id))

                group.start_soon(compress)
                with admin(database, name) as killer:
                    killer.autocommit = True
                    stuck = await until_waiting(killer, name)
                    for pid in stuck:
                        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                held.release()
        finally:
            held.release()
        await idle(cluster, session_id)
    (done,) = results
    assert done.status == "committed"  # the paid summary was not thrown away
    assert [e["id"] for e in database.new_compactions(session_id)] == [
        entry_id_for(done.operation_id)
    ]
    records = database.operation_records(session_id)
    steps = [r["data"]["step"] for r in records]
    assert steps == list(range(len(records)))  # the redelivered commit wrote no line twice
    assert [(r["from"], r["event"], r["to"]) for r in records][-1] == (
        "committing",
        "entry_appended",
        "committed",
    )
    activities.close()


Hold = Callable[[Database, str, str], Held]


def hold_planning(database: Database, name: str, session_id: str) -> Held:
    # Planning reads the session's lines: an exclusive lock on them holds it.
    return Held(database, name, "LOCK TABLE session_lines IN ACCESS EXCLUSIVE MODE")


def hold_commit(database: Database, name: str, session_id: str) -> Held:
    return Held(database, name, "SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", session_id)


@pytest.mark.parametrize(
    ("where", "hold", "ends"),
    [
        ("planning", hold_planning, {"cancelled"}),
        ("summarizing", None, {"cancelled"}),
        # A commit under way is not interrupted (one conditional append): it ends committed.
        ("committing", hold_commit, {"committed"}),
    ],
)
async def test_abort_frees_the_session_wherever_a_compaction_stands(
    named: tuple[Database, str], where: str, hold: Hold | None, ends: set[str]
) -> None:
    database, name = named
    session_id = database.add_example()
    history = [HANG, HISTORY] if where == "summarizing" else [HISTORY, HISTORY]
    summarizer = routes(scripted("a", {"history": history, "turn_prefix": [PREFIX, PREFIX]}))
    activities = SessionActivities(database.location, summarizer, SETTINGS)
    results: list[Any] = []
    async with connected() as client, worker(client, activities) as cluster:
        held = hold(database, name, session_id) if hold is not None else None
        try:
            async with anyio.create_task_group() as group:

                async def compress() -> None:
                    results.append(await cluster.compress(session_id))

                group.start_soon(compress)
                with admin(database, name) as watcher:
                    watcher.autocommit = True
                    if held is not None:
                        await until_waiting(watcher, name)
                    else:
                        while (await cluster.state(session_id) or {}).get(
                            "operationState"
                        ) != "summarizing":
                            await anyio.sleep(0.05)
                assert await cluster.abort(session_id) is True
                if held is not None:
                    # The store answers again; what was waiting for it settles.
                    await anyio.to_thread.run_sync(held.release)
        finally:
            if held is not None:
                held.release()
        (done,) = results
        assert done.status in ends
        await idle(cluster, session_id)
        again = await cluster.compress(session_id)  # usable again: not refused as busy
        assert again.status in {"committed", "skipped"}
    activities.close()
