"""A PostgreSQL store's connection to its session, and the owner lock it holds on it (D27).

:class:`~orchestrator._store.postgres.PostgresStore` builds on :class:`SessionConnection`: this
module holds what a store does to reach the database and to be the session's one writer
(connecting or borrowing, replacing a dropped connection, the advisory lock and the
``session_owners`` row that names its holder, the store's id and where it is); the store's own
module holds its queries (reading and conditional writes). They are apart because neither needs
the other's details: the writes only ask for "the connection, locked" (:meth:`_writer`).

Theory of operation:

* **One owner** (D27): :meth:`PostgresStore.own` takes a session-level advisory lock on the
  store's own connection, without waiting; a second store (in this process or any other, on
  any machine) is refused with :class:`~orchestrator._core.errors.SessionLockedError` naming the
  holder from ``session_owners``. The server drops the lock when the connection ends, so a
  killed owner never leaves a session locked. The key hashes the schema and the session id.

**Borrowed connections.** A store opened with a ``pool`` (a
:class:`psycopg_pool.ConnectionPool`, or anything lending connections the same way) borrows
one at its first use and gives it back at :meth:`close`, owner lock released, instead of
connecting and disconnecting: a cluster worker opens a store per activity (issue 10). The pool
is the caller's; the store never opens or closes it.

A store opened without a session id holds a new session: it learns its id from the header of
its first write (:meth:`SessionConnection._claim`). A store opened with an id refuses a header
carrying another one.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError, SessionLockedError
from orchestrator._core.printable import printable
from orchestrator._store.owner import default_owner
from orchestrator._store.postgres_schema import (
    advisory_key,
    connect,
    current_schema,
    first_line,
    host_name,
    redact,
)

Connection = psycopg.Connection[tuple[Any, ...]]


class ConnectionLender(Protocol):
    """Lends connections (:class:`psycopg_pool.ConnectionPool` is one)."""

    def getconn(self, timeout: float | None = None) -> Connection:
        """Borrow a connection (autocommit, schema current)."""
        ...

    def putconn(self, conn: Connection) -> None:
        """Give a borrowed connection back (the lender discards a broken one)."""
        ...


def _give_back(pool: ConnectionLender, conn: Connection, *, locked: bool) -> None:
    """Give a borrowed connection back without any session lock on it.

    A store releases its lock at :meth:`PostgresStore.close`; when that failed, or the store
    was dropped without closing, every advisory lock of the connection is released here, and a
    connection that cannot even do that is closed (the pool discards it; the server drops its
    locks with it).
    """
    if locked and not conn.closed:
        try:
            conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            conn.close()
    pool.putconn(conn)


class SessionConnection:
    """The connection to one session's database and the owner lock on it (module docstring).

    Args:
        url: The database URL.
        session_id: The session's id; ``None`` for a new session, whose header names it.
        lock: Take the owner lock at the first write when :meth:`own` was not called.
        pool: Borrow the connection from here instead of connecting.
    """

    def __init__(
        self,
        url: str,
        session_id: str | None,
        *,
        lock: bool,
        pool: ConnectionLender | None,
    ) -> None:
        self.url = url
        self._id = session_id
        self._use_lock = lock
        self._pool = pool
        self._conn: Connection | None = None
        self._schema: str | None = None
        self._locked_key: int | None = None
        self._owner_name: str | None = None
        self._pending_owner: str | None = None
        # Whether the connection ever held the owner lock (a borrowed one is cleared if so).
        self._lock_taken = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # -- identity ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        """The session's id (``None`` for a new session not yet written)."""
        return self._id

    @property
    def location(self) -> str:
        """The database URL without its password, then ``#`` and the session id."""
        # The id comes from a header, whoever wrote the file: escaped, so a message stays one line.
        return f"{redact(self.url)}#{printable(self._id) if self._id else '(new session)'}"

    @property
    def owned(self) -> bool:
        """Whether this store holds the owner lock."""
        return self._locked_key is not None

    # -- owning ------------------------------------------------------------------------------

    def own(self, owner: str) -> None:
        """Take the owner lock now, without waiting, until :meth:`close` (D27).

        A new session (no id yet) is locked at its first write, when its header names it.

        Raises:
            SessionLockedError: ``session is being changed by pid N on HOST (owner)``.
            SessionError: The database cannot be reached.
        """
        if self._id is None:
            self._pending_owner = owner
            return
        self._lock(owner)

    def _lock(self, owner: str) -> None:
        if self._locked_key is not None:
            return
        assert self._id is not None
        conn = self._db()
        key = advisory_key(self._schema_name(conn), self._id)
        with self._errors("lock it"):
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if row is None or not row[0]:
                raise SessionLockedError(
                    f"{self.location}: session is being changed by {self._holder(conn)}"
                )
            self._locked_key, self._owner_name = key, owner
            self._lock_taken = True
            conn.execute(
                "INSERT INTO session_owners (session_id, owner, pid, host, backend_pid)"
                " VALUES (%s, %s, %s, %s, pg_backend_pid())"
                " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
                " pid = excluded.pid, host = excluded.host,"
                " backend_pid = excluded.backend_pid, since = now()",
                (self._id, " ".join(owner.split()), os.getpid(), host_name()),
            )
            # A killed owner's lock went with its connection, but its row stayed: clear the rows
            # whose connection is gone, so the table names only live owners (issue 36).
            conn.execute(
                "DELETE FROM session_owners WHERE NOT EXISTS"
                " (SELECT 1 FROM pg_stat_activity a WHERE a.pid = session_owners.backend_pid)"
            )

    def _holder(self, conn: Connection) -> str:
        row = conn.execute(
            "SELECT pid, host, owner FROM session_owners WHERE session_id = %s", (self._id,)
        ).fetchone()
        if row is None:
            return "another process"
        # The row is whoever could write the table's: shown escaped, in one line.
        return f"pid {row[0]} on {printable(str(row[1]))} ({printable(str(row[2]))})"

    def _release(self) -> None:
        key, self._locked_key, self._owner_name = self._locked_key, None, None
        if key is None or self._conn is None or self._conn.closed:
            return
        try:
            self._conn.execute(
                "DELETE FROM session_owners WHERE session_id = %s"
                " AND backend_pid = pg_backend_pid()",
                (self._id,),
            )
            self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except psycopg.Error:
            pass  # closing the connection releases the lock anyway

    def close(self) -> None:
        """Release the owner lock and close (or give back) the connection. Idempotent."""
        self._release()
        conn, self._conn = self._conn, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if conn is not None:
            self._drop(conn)
        self._pending_owner = None

    def _drop(self, conn: Connection) -> None:
        """Close the connection, or give it back to the pool it came from (lock-free)."""
        locked, self._lock_taken = self._lock_taken, False
        if self._pool is None:
            conn.close()
        else:
            _give_back(self._pool, conn, locked=locked)

    def _db(self) -> Connection:
        """The store's connection; a broken one is replaced (see :meth:`_writer` for the lock)."""
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            # The server dropped the old connection, and the advisory lock with it: the next
            # write takes it again, or is refused like any newcomer's. What was written
            # meanwhile is caught by the next conditional write.
            self._drop(self._conn)
            self._conn, self._locked_key = None, None
            if self._finalizer is not None:
                self._finalizer.detach()
        if self._conn is None:
            if self._pool is None:
                conn = connect(self.url)
                finish = conn.close
            else:
                with self._errors("borrow a connection"):
                    conn = self._pool.getconn()
                finish = functools.partial(_give_back, self._pool, conn, locked=True)
            self._conn = conn
            # A store dropped without close() still closes or gives back its connection (and
            # so drops its lock: a pool resets what it takes back).
            self._finalizer = weakref.finalize(self, finish)
        return self._conn

    def _schema_name(self, conn: Connection) -> str:
        """The schema the session's tables are in (part of the owner lock's key)."""
        if self._schema is None:
            self._schema = current_schema(conn)
        return self._schema

    @contextmanager
    def _snapshot(self, conn: Connection) -> Iterator[None]:
        """A read-only transaction on one snapshot, so the row and the lines agree.

        No row lock: no writer waits for a reader, and a role with read access only can read.
        """
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise SessionError(f"{self.location}: cannot {doing}: {first_line(exc)}") from exc

    def _claim(self, first: Entry) -> None:
        """Learn a new session's id from its header; refuse a header naming another session."""
        if first.get("type") != "session" or not isinstance(first.get("id"), str):
            return
        named = str(first["id"])
        if self._id is None:
            self._id = named
        elif named != self._id:
            raise SessionError(
                f"{self.location}: the header names session {named}, not this store's"
            )

    def _writer(self) -> Connection:
        """The connection, holding the owner lock when this store uses one.

        The lock is taken for the owner :meth:`own` named (also again after a lost connection),
        else, when ``lock`` is on, under a default name, as the file store does.
        """
        if self._id is None:
            raise SessionError(
                f"{self.location}: a new session must start with its header (type 'session')"
            )
        conn = self._db()
        owner = self._pending_owner or self._owner_name
        if owner is None and self._use_lock:
            owner = default_owner()
        if owner is not None:
            self._lock(owner)
            self._pending_owner = None
        return conn
