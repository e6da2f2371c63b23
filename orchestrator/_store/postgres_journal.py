"""The lifecycle journal of a database session, in the same database (D24, issue 10).

:class:`~orchestrator._store.journal.Journal` writes through a small sink (``exists``, ``read``,
``append(line, durable)``); this is the sink for ``journal_lines``. Each record is one row, in
the order written, so reading gives the same bytes a journal file would hold and is parsed by
the same code. An operation record (``durable=True``) is an ordinary committed insert; a turn or
navigation record is committed with ``synchronous_commit`` off, the database's way of saying
"a crash may lose the last few", which is what the file journal promises for them.

The sinks of a process share one connection per database (:func:`_shared_connection`), never a
store's: a journal record written from another thread must not land inside a store's open
transaction, and each use holds the connection's lock for its whole transaction. A sink given a
``pool`` (a cluster worker's) borrows a connection for each use instead, so journals written
from many threads at once do not queue on one connection.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from orchestrator._core.errors import SessionError
from orchestrator._core.printable import printable
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._store.journal import Clock, Journal, _wall_clock
from orchestrator._store.journal_records import CLOSE_MARK, is_close_record
from orchestrator._store.postgres_connection import ConnectionLender
from orchestrator._store.postgres_schema import connect, first_line, redact

_Connection = psycopg.Connection[tuple[Any, ...]]
_shared: dict[tuple[int, str], tuple[threading.Lock, _Connection]] = {}
_shared_lock = threading.Lock()


def _shared_connection(url: str) -> tuple[threading.Lock, _Connection]:
    """This process's journal connection to ``url`` and the lock that takes turns on it.

    Every journal of a process shares one connection per database, so a worker with a thousand
    sessions open holds a thousand store connections, not two thousand. A broken connection
    (the server restarted) is replaced at the next use.
    """
    key = (os.getpid(), url)  # a forked child must not talk on its parent's socket
    with _shared_lock:
        held = _shared.get(key)
        if held is None or held[1].closed or held[1].broken:
            held = (threading.Lock(), connect(url))
            _shared[key] = held
            atexit.register(held[1].close)
        return held


class PostgresJournalSink:
    """Where a database session's journal lines go.

    Args:
        url: The database URL.
        session_id: The session whose journal this is.
        pool: Borrow a connection for each use from here, instead of the process's shared one.
    """

    def __init__(self, url: str, session_id: str, *, pool: ConnectionLender | None = None) -> None:
        self.url = url
        self.session_id = session_id
        self.location = f"{redact(url)}#{printable(session_id)} (journal)"
        self._pool = pool

    @contextmanager
    def _connection(self) -> Iterator[_Connection]:
        """A connection for one use: borrowed from the pool, or the shared one, locked."""
        if self._pool is not None:
            try:
                conn = self._pool.getconn()
            except psycopg.Error as exc:
                raise self._fail("borrow a connection", exc) from exc
            try:
                yield conn
            finally:
                self._pool.putconn(conn)
            return
        lock, conn = _shared_connection(self.url)
        with lock:
            yield conn

    def _fail(self, doing: str, exc: psycopg.Error) -> SessionError:
        return SessionError(f"{self.location}: cannot {doing}: {first_line(exc)}")

    # A record is one insert on a pooled connection: there is no file to open first.
    is_open = True

    def open(self) -> None:
        pass

    def exists(self) -> bool:
        """Whether any record was written."""
        with self._connection() as conn:
            try:
                row = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM journal_lines WHERE session_id = %s)",
                    (self.session_id,),
                ).fetchone()
            except psycopg.Error as exc:
                raise self._fail("read the journal", exc) from exc
        return bool(row and row[0])

    def read(self) -> bytes:
        """Every record, one line each, as a journal file holds them."""
        with self._connection() as conn:
            try:
                rows = conn.execute(
                    "SELECT line FROM journal_lines WHERE session_id = %s ORDER BY seq",
                    (self.session_id,),
                ).fetchall()
            except psycopg.Error as exc:
                raise self._fail("read the journal", exc) from exc
        return b"".join(f"{row[0]}\n".encode() for row in rows)

    def read_unsettled(self) -> bytes:
        """The records after the last close record, as :meth:`read` gives them (all, if none).

        The last row holding the close mark is found by the database, newest first along the
        primary key, and checked here as the file's is; only the rows after it are fetched: a
        session with months of history opens without sending that history over the wire.
        """
        mark, before = CLOSE_MARK.decode(), None
        with self._connection() as conn:
            try:
                while True:
                    row = conn.execute(
                        "SELECT seq, line FROM journal_lines WHERE session_id = %s"
                        " AND strpos(line, %s) > 0"
                        " AND seq < COALESCE(%s::bigint, 9223372036854775807)"
                        " ORDER BY seq DESC LIMIT 1",
                        (self.session_id, mark, before),
                    ).fetchone()
                    if row is None or is_close_record(row[1].encode()):
                        break
                    before = row[0]  # the mark's text, but not a close record: look before it
                after = -1 if row is None else row[0]
                rows = conn.execute(
                    "SELECT line FROM journal_lines WHERE session_id = %s AND seq > %s"
                    " ORDER BY seq",
                    (self.session_id, after),
                ).fetchall()
            except psycopg.Error as exc:
                raise self._fail("read the journal", exc) from exc
        return b"".join(f"{line}\n".encode() for (line,) in rows)

    def append(self, line: bytes, *, durable: bool) -> None:
        """Insert one record; committed durably when ``durable``, else without waiting for it."""
        text = line.decode("utf-8").removesuffix("\n")
        with self._connection() as conn:
            try:
                with conn.transaction():
                    if not durable:
                        conn.execute("SET LOCAL synchronous_commit TO OFF")
                    conn.execute(
                        "INSERT INTO journal_lines (session_id, line) VALUES (%s, %s)",
                        (self.session_id, text),
                    )
            except psycopg.Error as exc:
                raise self._fail("write the journal", exc) from exc

    def sync(self) -> None:
        """Make every record inserted so far durable.

        A transaction committed synchronously waits until the write-ahead log is on disk up to
        its commit, which covers every earlier commit made with ``synchronous_commit`` off. It
        must have a transaction id to log a commit at all, hence ``pg_current_xact_id()``.
        """
        with self._connection() as conn:
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_current_xact_id()")
            except psycopg.Error as exc:
                raise self._fail("sync the journal", exc) from exc


def postgres_journal(
    url: str,
    session_id: str,
    *,
    clock: Clock = _wall_clock,
    operation_machine: MachineDef | None = None,
    pool: ConnectionLender | None = None,
) -> Journal:
    """The journal of session ``session_id`` in the database at ``url`` (``pool``: see the sink)."""
    sink = PostgresJournalSink(url, session_id, pool=pool)
    return Journal(sink, clock=clock, operation_machine=operation_machine)
