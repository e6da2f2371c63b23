"""The lifecycle journal of a database session, in the same database (D24, issue 10).

:class:`~orchestrator._store.journal.Journal` writes through a small sink (``exists``, ``read``,
``append(line, durable)``); this is the sink for ``journal_lines``. Each record is one row, in
the order written, so reading gives the same bytes a journal file would hold and is parsed by
the same code. An operation record (``durable=True``) is an ordinary committed insert; a turn or
navigation record is committed with ``synchronous_commit`` off, the database's way of saying
"a crash may lose the last few", which is what the file journal promises for them.

The sink has its own connection, never the store's: a journal record written from another
thread must not land inside the store's open transaction.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import psycopg

from orchestrator._core.errors import SessionError
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._store.journal import Clock, Journal, _wall_clock
from orchestrator._store.postgres_schema import connect, first_line, redact


class PostgresJournalSink:
    """Where a database session's journal lines go.

    Args:
        url: The database URL.
        session_id: The session whose journal this is.
    """

    def __init__(self, url: str, session_id: str) -> None:
        self.url = url
        self.session_id = session_id
        self.location = f"{redact(url)}#{session_id} (journal)"
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _db(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url)
            self._finalizer = weakref.finalize(self, self._conn.close)
        return self._conn

    def _fail(self, doing: str, exc: psycopg.Error) -> SessionError:
        return SessionError(f"{self.location}: cannot {doing}: {first_line(exc)}")

    def exists(self) -> bool:
        """Whether any record was written."""
        with self._lock:
            try:
                row = (
                    self._db()
                    .execute(
                        "SELECT EXISTS (SELECT 1 FROM journal_lines WHERE session_id = %s)",
                        (self.session_id,),
                    )
                    .fetchone()
                )
            except psycopg.Error as exc:
                raise self._fail("read the journal", exc) from exc
        return bool(row and row[0])

    def read(self) -> bytes:
        """Every record, one line each, as a journal file holds them."""
        with self._lock:
            try:
                rows = (
                    self._db()
                    .execute(
                        "SELECT line FROM journal_lines WHERE session_id = %s ORDER BY seq",
                        (self.session_id,),
                    )
                    .fetchall()
                )
            except psycopg.Error as exc:
                raise self._fail("read the journal", exc) from exc
        return b"".join(f"{row[0]}\n".encode() for row in rows)

    def append(self, line: bytes, *, durable: bool) -> None:
        """Insert one record; committed durably when ``durable``, else without waiting for it."""
        text = line.decode("utf-8").removesuffix("\n")
        with self._lock:
            conn = self._db()
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

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if conn is not None:
                conn.close()


def postgres_journal(
    url: str,
    session_id: str,
    *,
    clock: Clock = _wall_clock,
    operation_machine: MachineDef | None = None,
) -> Journal:
    """The journal of session ``session_id`` in the database at ``url``."""
    sink = PostgresJournalSink(url, session_id)
    return Journal(sink, clock=clock, operation_machine=operation_machine)
