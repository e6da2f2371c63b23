"""A pool of PostgreSQL connections for one process (issue 10).

A cluster worker opens a store for every activity; connecting each time (a TCP handshake, the
login, the schema check) cost more than the work itself. A worker keeps one
:class:`psycopg_pool.ConnectionPool` instead, lends its connections to the stores
(:class:`~orchestrator._store.postgres.PostgresStore` ``pool=``) and to the journals
(:class:`~orchestrator._store.postgres_journal.PostgresJournalSink` ``pool=``), and closes it
when it stops. psycopg_pool is psycopg's own maintained pool: it replaces connections the server
dropped, retires old ones and bounds how many are open, which a home-made list would not.

Every connection is autocommit with the schema current, as :func:`connect` makes them, and is
checked before it is lent (one round trip), so a connection the server dropped while idle is
replaced rather than failing an activity. A store gives its connection back with no session
lock held (:class:`~orchestrator._store.postgres.PostgresStore` releases it, or closes the
connection when it cannot), so a borrowed connection never carries a lock to its next borrower.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from orchestrator._core.errors import StoreUnavailableError
from orchestrator._store.postgres_schema import (
    connect,
    connection_info,
    ensure_schema,
    first_line,
    redact,
    scrub,
)

Connection = psycopg.Connection[tuple[Any, ...]]
Pool = ConnectionPool[Connection]

POOL_SIZE = 8
"""Connections a worker keeps at most: its threads that touch the store (asyncio's default
executor has min(32, CPUs + 4)) plus a few, so a thread rarely waits for one."""


def open_pool(url: str, *, max_size: int = POOL_SIZE, timeout_s: float = 30.0) -> Pool:
    """Open a pool of connections to ``url`` (one is made now, so a bad URL fails here).

    Args:
        url: The database URL.
        max_size: Connections at most.
        timeout_s: How long a borrower waits for a free connection before failing.

    Raises:
        SessionError: The URL is bad.
        StoreUnavailableError: The server cannot be reached, or the login is refused.
    """
    # One plain connection first: a bad URL or a refused login fails now with its own message
    # (the pool would retry in the background until the timeout), and the schema is migrated.
    connect(url).close()
    info = connection_info(url)

    def configure(conn: Connection) -> None:
        ensure_schema(conn, url)

    pool: Pool = ConnectionPool(
        info,
        connection_class=psycopg.Connection,
        kwargs={"autocommit": True},
        min_size=1,
        max_size=max_size,
        open=False,
        configure=configure,
        check=ConnectionPool.check_connection,
        timeout=timeout_s,
        name=f"orchestrator {redact(url)}",
    )
    try:
        pool.open(wait=True, timeout=timeout_s)
    except psycopg.Error as exc:
        pool.close()
        raise StoreUnavailableError(
            f"{redact(url)}: cannot connect: {scrub(url, first_line(exc))}"
        ) from exc
    return pool
