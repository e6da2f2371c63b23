"""A cluster worker's pool and cache of parsed sessions (issue 10).

The activities are called directly (no Temporal server) over a directory and over PostgreSQL:
a worker that cached a session sees what another writer appended before its next activity, and
a commit planned before that append is still refused by the store. The pool is closed when the
worker stops (a Temporal server is needed for that one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.cache import Cached, SessionCache  # noqa: E402
from orchestrator._cluster.calls import Call, JournalLine, Op, entry_id_for  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.stores import WorkerStores, cluster_store  # noqa: E402
from orchestrator._core.loading import read_session  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator._store.session import Session  # noqa: E402
from orchestrator.testing import FunctionModel, summary_text  # noqa: E402
from tests.cluster_kit import Database  # noqa: E402

SETTINGS = RuntimeSettings(compaction=CompactionSettings(keep_recent_tokens=200))
LINE = JournalLine(seq=0, source="idle", event="compact", dest="preparing", effects=[])


def activities(database: Database, cache: SessionCache | None = None) -> SessionActivities:
    async def answer(request: Any) -> str:
        return summary_text("a summary", purpose=request.purpose)

    routes = SummaryRoutes(candidates=(FunctionModel(answer, name="m"),))
    stores = WorkerStores(database.location, cache=cache)
    return SessionActivities(database.location, routes, SETTINGS, stores=stores)


def planned(acts: SessionActivities, session_id: str) -> Op:
    """Run ``prepare`` and return the operation as the workflow then holds it."""
    op = Op(session_id=session_id, operation_id="op1")
    prepared = acts._prepare(op)
    return dataclasses.replace(
        op,
        expect_last_id=prepared.expect_last_id,
        expect_length=prepared.expect_length,
        planned=True,
    )


def commit_call(acts: SessionActivities, op: Op) -> Call:
    job = acts._journal_then_job(Call(op=op))
    job.ports.session.store.close()  # type: ignore[union-attr]
    texts: dict[str, str] = {part.purpose: "a summary" for part in job.parts}
    return Call(
        op=op,
        journal=[dataclasses.replace(LINE, seq=1)],
        entry_id=entry_id_for(op.operation_id),
        texts=texts,
        models={purpose: "m" for purpose in texts},
    )


def append_elsewhere(database: Database, session_id: str, note: str) -> str:
    """Another writer (another worker, another program) appends an entry; returns its id."""
    session = Session.from_store(cluster_store(database.location, session_id))
    try:
        return str(session.append_custom("note", {"note": note})["id"])
    finally:
        session.close()


def ids_seen(acts: SessionActivities, session_id: str) -> set[str]:
    session = acts._stored(Op(session_id=session_id, operation_id="look"))
    with contextlib.closing(session.store):
        return set(session.tree.by_id)


# -- the cache on its own ---------------------------------------------------------------------


def parsed(length: int) -> Any:
    result = read_session(b'{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/"}\n')
    result.result.tail = dataclasses.replace(result.result.tail, length=length)
    return result


def test_the_defaults_are_the_readmes() -> None:
    cache = SessionCache()
    assert (cache.max_sessions, cache.max_bytes) == (1000, 256 << 20)
    assert WorkerStores("postgresql://u@h/d").pool_size == 8


def test_the_cache_keeps_the_least_recently_used_out_first_by_count() -> None:
    cache = SessionCache(max_sessions=2, max_bytes=1000)
    for name in ("a", "b"):
        cache.put(name, (1,), parsed(10))
    assert cache.get("a", (1,)) is not None  # a is now the most recent
    cache.put("c", (1,), parsed(10))
    assert cache.get("b", (1,)) is None
    assert cache.get("a", (1,)) is not None
    assert cache.get("c", (1,)) is not None
    assert cache.stats.evicted == 1
    assert len(cache) == 2


def test_the_cache_keeps_at_most_its_bytes_and_never_a_session_larger_than_them() -> None:
    cache = SessionCache(max_sessions=10, max_bytes=100)
    cache.put("a", (1,), parsed(60))
    cache.put("b", (1,), parsed(60))
    assert cache.get("a", (1,)) is None
    assert cache.size_bytes == 60
    entry = cache.put("big", (1,), parsed(101))
    assert isinstance(entry, Cached)
    assert cache.get("big", (1,)) is None
    assert cache.get("b", (1,)) is not None
    assert SessionCache(max_sessions=0).put("a", (1,), parsed(1)) is not None
    assert len(SessionCache(max_sessions=0)) == 0


def test_a_parse_made_at_another_stamp_is_dropped_not_used() -> None:
    cache = SessionCache()
    cache.put("a", (1,), parsed(10))
    assert cache.get("a", (2,)) is None
    assert cache.stats.stale == 1
    assert cache.get("a", (1,)) is None  # dropped, not kept for later
    cache.put("a", (1,), parsed(10))
    assert cache.get("a", None) is None  # the session is gone from the store
    cache.put("a", (1,), parsed(10))
    cache.drop("a")
    cache.clear()
    assert (len(cache), cache.size_bytes) == (0, 0)


# -- freshness, over both stores --------------------------------------------------------------


def test_a_cached_session_is_read_again_when_another_writer_appended(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    acts = activities(cluster_database)
    try:
        op = planned(acts, session_id)
        first = acts._journal_then_job(Call(op=op))
        first.ports.session.store.close()  # type: ignore[union-attr]
        assert acts.stores.cache.stats.hits == 1
        again = acts._journal_then_job(Call(op=op))
        again.ports.session.store.close()  # type: ignore[union-attr]
        assert again.plan is first.plan  # planned once, kept with the parse

        added = append_elsewhere(cluster_database, session_id, "from elsewhere")

        assert added in ids_seen(acts, session_id)
        assert acts.stores.cache.stats.stale == 1
    finally:
        acts.close()


def test_a_commit_planned_before_another_writer_appended_is_refused(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    acts = activities(cluster_database)
    try:
        op = planned(acts, session_id)
        call = commit_call(acts, op)
        append_elsewhere(cluster_database, session_id, "meanwhile")

        reported = acts._commit(call)

        assert reported.outcome == "conflict"
        assert cluster_database.new_compactions(session_id) == []
    finally:
        acts.close()


class RacingCache(SessionCache):
    """Hands out a current parse, then lets another writer append before the caller commits."""

    def __init__(self, race: Callable[[], object]) -> None:
        super().__init__()
        self.race: Callable[[], object] | None = race

    def get(self, session_id: str, stamp: tuple[Any, ...] | None) -> Cached | None:
        found = super().get(session_id, stamp)
        if found is not None and self.race is not None:
            race, self.race = self.race, None
            race()
        return found


def test_a_cached_session_never_commits_against_a_tail_that_moved_after_the_check(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    cache = RacingCache(lambda: None)
    acts = activities(cluster_database, cache)
    try:
        op = planned(acts, session_id)
        call = commit_call(acts, op)
        cache.race = lambda: append_elsewhere(cluster_database, session_id, "in between")

        reported = acts._commit(call)

        assert cache.race is None  # the other writer did append after the cache was checked
        assert reported.outcome == "conflict"
        assert cluster_database.new_compactions(session_id) == []
    finally:
        acts.close()


def test_a_commit_keeps_the_session_current_and_finish_reads_the_entry(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    acts = activities(cluster_database)
    try:
        op = planned(acts, session_id)
        call = commit_call(acts, op)
        reported = acts._commit(call)
        assert reported.outcome == "ok"
        entry_id = call.entry_id
        assert entry_id is not None
        misses = acts.stores.cache.stats.misses
        redelivered = acts._commit(call)  # a commit delivered twice appends once
        assert redelivered.outcome == "ok"
        assert len(cluster_database.new_compactions(session_id)) == 1
        # A database says the stamp its commit left, so the session stayed cached with the
        # new entry; a file cannot, so it was dropped and read again.
        read_again = 0 if is_database_url(cluster_database.location) else 1
        assert acts.stores.cache.stats.misses == misses + read_again
        assert acts.stores.cache.stats.stale == 0

        finished = acts._finish(dataclasses.replace(call, status="committed"))
        assert finished is not None
        assert finished["id"] == entry_id
        assert acts._finish(dataclasses.replace(call, status="failed")) is None
        assert entry_id in ids_seen(acts, session_id)

        added = append_elsewhere(cluster_database, session_id, "after the commit")
        assert {added, entry_id} <= ids_seen(acts, session_id)
    finally:
        acts.close()


def test_a_session_not_in_the_store_is_refused_by_prepare(cluster_database: Database) -> None:
    from temporalio.exceptions import ApplicationError

    acts = activities(cluster_database)
    try:
        with pytest.raises(ApplicationError, match="not in"):
            acts._prepare(Op(session_id="no-such-session", operation_id="op1"))
    finally:
        acts.close()


# -- the pool -----------------------------------------------------------------------------------


def test_the_pool_lends_connections_back_and_closes_with_the_worker(pg_url: str) -> None:
    database = Database(pg_url)
    session_id = database.add_example()
    stores = WorkerStores(pg_url, pool_size=2)
    assert stores.pool is None  # opened at the first use
    for _ in range(3):  # more uses than connections: each store gave its connection back
        with contextlib.closing(stores.store(session_id)) as store:
            assert store.exists()
    pool = stores.pool
    assert pool is not None
    stats = pool.get_stats()
    assert stats["pool_available"] == stats["pool_size"] <= 2  # every connection is back
    journal = stores.journal(session_id)
    assert not journal.exists()
    stores.close()
    assert pool.closed
    assert stores.pool is None
    stores.close()  # idempotent


def test_a_pooled_connection_never_carries_a_session_lock_to_its_next_borrower(
    pg_url: str,
) -> None:
    from orchestrator._core.errors import SessionLockedError
    from orchestrator._store.postgres import PostgresStore

    database = Database(pg_url)
    session_id = database.add_example()
    stores = WorkerStores(pg_url, pool_size=1)
    try:
        owner = stores.store(session_id)
        assert isinstance(owner, PostgresStore)
        owner.own("first")
        with pytest.raises(SessionLockedError), PostgresStore(pg_url, session_id) as other:
            other.own("second")
        del owner  # dropped without close(): the connection goes back, the lock with it
        gc.collect()
        with PostgresStore(pg_url, session_id) as other:
            other.own("second")
    finally:
        stores.close()


def test_the_directory_store_has_no_pool(tmp_path: Any) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    stores = WorkerStores(database.location)
    with contextlib.closing(stores.store(session_id)) as store:
        assert store.stamp() is not None
        assert store.written is None
    assert stores.pool is None
    stores.close()


@pytest.mark.anyio
async def test_a_worker_closes_its_pool_when_it_stops(pg_url: str) -> None:
    from orchestrator._cluster.client import ClusterClient
    from orchestrator._cluster.worker import build_worker
    from tests.cluster_kit import connected, queue_name

    database = Database(pg_url)
    session_id = database.add_example()
    acts = activities(database)
    queue = queue_name()
    async with connected() as client:
        async with build_worker(client, acts, task_queue=queue):
            cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
            result = await cluster.compress(session_id)
            assert result.status == "committed"
            pool = acts.stores.pool
            assert pool is not None
            assert not pool.closed
        assert pool.closed
        assert acts.stores.pool is None
        assert len(acts.stores.cache) == 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- edges --------------------------------------------------------------------------------------


def test_a_session_with_nothing_to_compact_is_planned_without_keeping_a_plan(
    tmp_path: Any,
) -> None:
    import json

    database = Database(str(tmp_path / "db"))
    (tmp_path / "db").mkdir()
    header = {"type": "session", "version": 3, "id": "tiny", "timestamp": "t", "cwd": "/"}
    message = {"role": "user", "content": "hi", "timestamp": 1}
    entry = {"type": "message", "id": "e1", "parentId": None, "timestamp": "t", "message": message}
    lines = "".join(json.dumps(value) + "\n" for value in (header, entry))
    (tmp_path / "db" / "tiny.jsonl").write_text(lines)
    (tmp_path / "db" / "empty.jsonl").write_text("")
    acts = activities(database)
    try:
        prepared = acts._prepare(Op(session_id="tiny", operation_id="op1"))
        assert prepared.facts.get("has_work") is False
        job = acts._journal_then_job(Call(op=Op(session_id="tiny", operation_id="op1")))
        job.ports.session.store.close()  # type: ignore[union-attr]
        assert job.plan is None
        cached = acts.stores.cache.get("tiny", acts.stores.store("tiny").stamp())
        assert cached is not None
        assert cached.plans == {}
        # An empty file is no session for prepare, and a new empty one for a reader.
        from temporalio.exceptions import ApplicationError

        with pytest.raises(ApplicationError):
            acts._prepare(Op(session_id="empty", operation_id="op1"))
        session = acts._planned(Op(session_id="empty", operation_id="op1"))
        session.store.close()
        assert session.tree.entries == []
    finally:
        acts.close()


def test_a_file_stamp_that_cannot_be_read_is_an_error(tmp_path: Any) -> None:
    from orchestrator._core.errors import SessionError
    from orchestrator._store.jsonl import JsonlStore

    (tmp_path / "file").write_text("")
    with pytest.raises(SessionError):
        JsonlStore(tmp_path / "file" / "s.jsonl").stamp()
    assert JsonlStore(tmp_path / "missing.jsonl").stamp() is None


def test_database_stamps_move_with_every_write_and_find_entry_reads_one_line(
    pg_url: str,
) -> None:
    from orchestrator._store.postgres import PostgresStore

    database = Database(pg_url)
    session_id = database.add_example()
    with PostgresStore(pg_url, session_id) as store, PostgresStore(pg_url, session_id) as other:
        before = store.stamp()
        assert before is not None
        assert store.stamp() == before
        added = append_elsewhere(database, session_id, "a write")
        assert store.stamp() != before
        found = other.find_entry(added)
        assert found is not None
        assert found["id"] == added
        assert other.find_entry("no-such-entry") is None
        assert other.find_entry("nul\x00id") is None
    with PostgresStore(pg_url) as new:
        assert new.stamp() is None
        assert new.find_entry("x") is None


class Refusing:
    """A lender whose every loan fails, and whose connections cannot run a query."""

    def __init__(self) -> None:
        self.returned: list[Any] = []

    def getconn(self, timeout: float | None = None) -> Any:
        import psycopg

        raise psycopg.OperationalError("no connection free")

    def putconn(self, conn: Any) -> None:
        self.returned.append(conn)


class Broken:
    closed = False

    def execute(self, *_: Any) -> None:
        import psycopg

        raise psycopg.OperationalError("server closed the connection")

    def close(self) -> None:
        self.closed = True


def test_a_failed_loan_is_a_session_error_and_a_lock_never_travels_back(pg_url: str) -> None:
    from orchestrator._core.errors import SessionError
    from orchestrator._store.postgres import PostgresStore
    from orchestrator._store.postgres_connection import _give_back
    from orchestrator._store.postgres_journal import PostgresJournalSink

    pool = Refusing()
    with pytest.raises(SessionError, match="borrow a connection"):
        PostgresStore(pg_url, "s", pool=pool).exists()
    with pytest.raises(SessionError, match="borrow a connection"):
        PostgresJournalSink(pg_url, "s", pool=pool).exists()
    conn = Broken()
    _give_back(pool, conn, locked=True)  # type: ignore[arg-type]
    assert conn.closed  # it could not drop its locks: closed, so the server drops them
    assert pool.returned == [conn]


def test_a_pool_that_cannot_open_is_a_session_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg
    from psycopg_pool import ConnectionPool

    from orchestrator._core.errors import SessionError
    from orchestrator._store.postgres_pool import open_pool

    def refuse(*_: Any, **__: Any) -> None:
        raise psycopg.OperationalError("too many clients")

    monkeypatch.setattr(ConnectionPool, "open", refuse)
    with pytest.raises(SessionError, match="too many clients"):
        open_pool(pg_url)


@pytest.mark.anyio
async def test_a_request_no_worker_accepts_in_time_is_asked_again_for_the_same_update(
    tmp_path: Any,
) -> None:
    import asyncio
    from datetime import timedelta

    from orchestrator._cluster.client import ClusterClient
    from orchestrator._cluster.worker import build_worker
    from tests.cluster_kit import connected, queue_name

    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    queue = queue_name()
    async with connected() as client:
        cluster = ClusterClient(
            client, task_queue=queue, idle_s=0.2, rpc_timeout=timedelta(seconds=1)
        )
        calls: list[str | None] = []
        send = client.execute_update_with_start_workflow

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("id"))
            return await send(*args, **kwargs)

        client.execute_update_with_start_workflow = counted
        asked = asyncio.ensure_future(cluster.compress(session_id))
        while len(calls) < 2:  # no worker yet: the first call gave up and was sent again
            await asyncio.sleep(0.2)
        async with build_worker(client, activities(database), task_queue=queue):
            result = await asked
    assert result.status == "committed"
    assert len(set(calls)) == 1  # always the same update
    assert len(database.new_compactions(session_id)) == 1


@pytest.mark.anyio
async def test_a_cancelled_request_is_not_asked_again(tmp_path: Any) -> None:
    import asyncio
    from datetime import timedelta

    from orchestrator._cluster.client import ClusterClient
    from tests.cluster_kit import connected, queue_name

    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    async with connected() as client:
        cluster = ClusterClient(
            client, task_queue=queue_name(), idle_s=0.2, rpc_timeout=timedelta(seconds=30)
        )
        asked = asyncio.ensure_future(cluster.compress(session_id))
        await asyncio.sleep(0.5)
        asked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asked
        await client.get_workflow_handle(session_id).terminate()
