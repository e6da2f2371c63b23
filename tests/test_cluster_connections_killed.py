"""A worker's PostgreSQL connections killed under it (``pg_terminate_backend``) (issue 10).

The activities are called directly, as in tests/test_cluster_cache.py, over PostgreSQL with a
pool of their own, named by ``application_name`` so that only this test's connections are
killed (other tests share the server). Killed while idle in the pool, the next activity works
on new connections; killed while a commit waits for the session's row, that commit fails in one
line with nothing written and a transient error (the activity is delivered again, not failed:
the summary it commits was paid for), the journal holds exactly what was recorded, and the
commit delivered again appends the compaction once and its journal line not twice.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.delivery import transient  # noqa: E402
from orchestrator._cluster.stores import cluster_journal  # noqa: E402
from tests.cluster_kit import Database  # noqa: E402
from tests.test_cluster_cache import activities, commit_call, planned  # noqa: E402


@pytest.fixture
def named() -> Iterator[tuple[Database, str]]:
    """A database in a fresh schema whose connections carry a name of their own."""
    from tests.services import database_base_url, fresh_schema_url

    name = f"kill-{uuid.uuid4().hex[:10]}"
    with fresh_schema_url(database_base_url()) as url:
        yield Database(f"{url}&application_name={name}"), name


def admin(database: Database, name: str) -> Any:
    """A connection of the test's own, not named like the worker's."""
    import psycopg

    return psycopg.connect(database.location.replace(f"&application_name={name}", ""))


def backends(conn: Any, name: str, *, waiting: bool = False) -> list[int]:
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    if waiting:
        query += " AND wait_event_type = 'Lock'"
    return [row[0] for row in conn.execute(query, (name,)).fetchall()]


def terminate(conn: Any, pids: list[int]) -> None:
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_connections_killed_in_the_pool_are_replaced_for_the_next_activity(
    named: tuple[Database, str],
) -> None:
    database, name = named
    session_id = database.add_example()
    acts = activities(database)
    try:
        op = planned(acts, session_id)  # the pool is open, its connections idle
        with admin(database, name) as conn:
            conn.autocommit = True
            killed = backends(conn, name)
            assert killed
            terminate(conn, killed)
            call = commit_call(acts, op)  # journals through the pool: new connections

            assert acts._commit(call).outcome == "ok"
            assert set(backends(conn, name)).isdisjoint(killed)
        assert len(database.new_compactions(session_id)) == 1
    finally:
        acts.close()


def test_a_commit_whose_connection_is_killed_in_flight_is_transient_then_commits_once(
    named: tuple[Database, str],
) -> None:
    database, name = named
    session_id = database.add_example()
    before = database.entries(session_id)
    acts = activities(database)
    try:
        call = commit_call(acts, planned(acts, session_id))
        journaled = len(cluster_journal(database.location, session_id).records())
        failures: list[BaseException] = []

        def commit() -> None:
            try:
                acts._commit(call)
            except Exception as error:  # noqa: BLE001 - what the activity's wrapper sees
                failures.append(error)

        with admin(database, name) as conn:
            # Hold the session's row: the commit's transaction waits for it, in flight.
            conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
            committing = threading.Thread(target=commit)
            committing.start()
            with admin(database, name) as killer:
                killer.autocommit = True
                while not (stuck := backends(killer, name, waiting=True)):
                    committing.join(0.05)
                terminate(killer, stuck)
            committing.join()
            conn.rollback()
        # Not a failed commit (the table would throw the paid summary away): a transient
        # store error, which the activity reports retryable (StoreUnavailable) to be delivered
        # again.
        (failure,) = failures
        assert transient(failure)
        assert "cannot write it" in str(failure)
        assert database.entries(session_id) == before  # nothing half-written
        # The commit journals its lines first: they are there, once each, and nothing else.
        journal = cluster_journal(database.location, session_id)
        assert len(journal.records()) == journaled + 1

        # Delivered again (as Temporal's retry does: a resend), on a new connection: one
        # compaction, and the journal line is not written twice.
        again = acts._commit(dataclasses.replace(call, resend=True))
        assert again.outcome == "ok"
        assert len(database.new_compactions(session_id)) == 1
        assert len(cluster_journal(database.location, session_id).records()) == journaled + 1
    finally:
        acts.close()
