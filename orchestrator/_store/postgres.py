"""The PostgreSQL store: one session's lines in a database, behind the store protocol (issue 10).

Its connection and owner lock (one owner, borrowed connections, a new session's id) are in
:mod:`~orchestrator._store.postgres_connection`; how a line becomes a row, in
:mod:`~orchestrator._store.postgres_lines`.

Theory of operation (the same promises as the file store, D2, D3, D4 and D27):

* **Lines, not objects.** A session is its lines in order (``session_lines``), each the exact
  text a pi file holds without its newline: the header at ``seq`` 0, then one entry per line.
  :meth:`PostgresStore.load` joins them into the bytes a file would hold and parses those with
  the same parser as the file and memory stores, so unknown types and fields survive untouched
  (D2), damage is reported the same way (D3), and :meth:`PostgresStore.export_bytes` gives back
  a pi file byte for byte. ``entry_id`` and ``entry_type`` are copies for queries only.
* **Where it ends** (the :class:`~orchestrator._store.protocol.Tail`) is kept on the session's
  row (``sessions``): the last entry id and the length the session has as a file. So a tail read
  from a file equals the tail of the same session imported here, and ``version``, bumped by every
  write, is the row version.
* **Conditional writes are transactions** (D27). An append or rewrite locks the session's row
  (``SELECT ... FOR UPDATE``), compares its tail with ``expect``, and either writes the lines
  and the new tail and commits, or raises :class:`~orchestrator._core.errors.ConflictError`
  and rolls back: nothing is written. Creating a session inserts its row; two creators race on
  the primary key and the loser is refused the same way.
* **Durable on return.** Every write is a committed transaction; :meth:`sync` has nothing to do.
  Only whole lines are ever stored, so there is no torn tail to move aside: a file with one is
  refused at import (:meth:`PostgresStore.import_bytes`), and so are bytes PostgreSQL text cannot
  hold (invalid UTF-8, NUL).

**Stamps.** :meth:`stamp` reads, in one query, a value that changes with every write to the
session (the row version, the rewrite count, the tail and the creation time): a caller that kept
a parse made at some stamp (:attr:`loaded`) knows it is still the session exactly when the stamp
is unchanged, and may give it to a fresh store (:meth:`prime`) so that a conditional append does
not read and parse the whole session again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from orchestrator._core.entries import Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import EMPTY_TAIL, LoadResult, Tail
from orchestrator._core.loading import (
    ParsedSession,
    append_refusal,
    read_session,
    rewrite_refusal,
)
from orchestrator._core.migration import RandomHex, header_version, uuid_hex
from orchestrator._store.jsonl import write_pi_line
from orchestrator._store.postgres_connection import Connection, ConnectionLender, SessionConnection
from orchestrator._store.postgres_lines import ids_of, line_row, nul_id_refusal
from orchestrator._store.tail import changed, check_tail, tail_after, tail_of_bytes

Stamp = tuple[Any, ...]
"""Changes with every write to a session (:meth:`PostgresStore.stamp`); compare, never parse."""
_STAMPED = "version, rewrites, last_id, length, created_at"
"""The ``sessions`` columns a stamp is made of, in order (a re-created session has a new time)."""


class PostgresStore(SessionConnection):
    """One session kept in a PostgreSQL database.

    Args:
        url: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?options]``.
        session_id: The session's id; ``None`` for a new session, whose header names it.
        lock: Take the owner lock at the first write when :meth:`own` was not called. Turn off
            only where another mechanism guarantees one writer.
        random_hex: Randomness for ids a v1 migration assigns on load.
        pool: Borrow the connection from here (given back at :meth:`close`) instead of
            connecting; the lender's connections must be autocommit with the schema current.
    """

    def __init__(
        self,
        url: str,
        session_id: str | None = None,
        *,
        lock: bool = True,
        random_hex: RandomHex = uuid_hex,
        pool: ConnectionLender | None = None,
    ) -> None:
        super().__init__(url, session_id, lock=lock, pool=pool)
        self._random_hex = random_hex
        # The parsed session as of a number of rewrites: what the write refusals look at.
        self._state: tuple[int, ParsedSession] | None = None
        # How many rewrites the session had when this store last read or wrote it: a rewrite by
        # another writer that happens to end at the same tail is still a conflict.
        self._seen_rewrites: int | None = None
        self._end: Tail | None = None
        # The stamp of what the last load parsed (``_loaded``), or that the last write left.
        self._stamp: Stamp | None = None
        self._loaded: tuple[Stamp, ParsedSession] | None = None

    # -- reading -----------------------------------------------------------------------------

    def exists(self) -> bool:
        """True when the session has a row (a header was stored)."""
        if self._id is None:
            return False
        with self._errors("read it"):
            row = self._db().execute("SELECT 1 FROM sessions WHERE id = %s", (self._id,)).fetchone()
        return row is not None

    def load(self) -> LoadResult:
        """Read every line and parse them as a file's bytes (D3); a missing session is empty.

        Raises:
            SessionError: The database cannot be reached or read.
        """
        if self._id is None:
            self._end = EMPTY_TAIL
            return LoadResult(header=None)
        conn = self._db()
        with self._errors("read it"), self._snapshot(conn):
            row = conn.execute(
                f"SELECT {_STAMPED} FROM sessions WHERE id = %s", (self._id,)
            ).fetchone()
            if row is None:
                self._end = EMPTY_TAIL
                return LoadResult(header=None)
            data = self._read_lines(conn)
        parsed = read_session(data, random_hex=self._random_hex)
        stamp = self._stamped(row)
        parsed.result.tail = self._end = Tail(last_id=row[2], length=int(row[3]))
        self._state = (int(row[1]), parsed)
        self._loaded = (stamp, parsed)
        return parsed.result

    def stamp(self) -> Stamp | None:
        """The session's stamp now, read fresh (one query); ``None`` when it is not stored.

        Two equal stamps mean no write happened in between: every append and rewrite bumps the
        row version, and a session deleted and created again has a new creation time.
        """
        if self._id is None:
            return None
        with self._errors("read it"):
            row = (
                self._db()
                .execute(f"SELECT {_STAMPED} FROM sessions WHERE id = %s", (self._id,))
                .fetchone()
            )
        return None if row is None else self._stamped(row)

    @property
    def loaded(self) -> tuple[Stamp, ParsedSession] | None:
        """The last parse this store made or was primed with, and the stamp it was made at."""
        return self._loaded

    @property
    def written(self) -> Stamp | None:
        """The stamp this store's last write left (read in its transaction), else ``None``."""
        return self._stamp

    def prime(self, stamp: Stamp, parsed: ParsedSession) -> None:
        """Take a parse another store of this session made at ``stamp`` as this store's own.

        A conditional write then compares the stored tail as always, and reparses only when the
        session was rewritten since: the parse is trusted only while the rewrite count agrees.
        """
        self._loaded = (stamp, parsed)
        self._state = (int(stamp[1]), parsed)
        self._seen_rewrites = int(stamp[1])
        self._end = Tail(last_id=stamp[2], length=int(stamp[3]))

    def _stamped(self, row: tuple[Any, ...]) -> Stamp:
        """A stamp from a row of :data:`_STAMPED`; the rewrite count is what this store saw."""
        self._seen_rewrites = int(row[1])
        return (int(row[0]), int(row[1]), row[2], int(row[3]), row[4])

    def export_bytes(self) -> bytes:
        """The session as a pi file holds it, byte for byte.

        Raises:
            SessionError: There is no such session, or the database cannot be read.
        """
        if self._id is None:
            raise SessionError(f"{self.location}: no session id given")
        conn = self._db()
        with self._errors("read it"), self._snapshot(conn):
            row = conn.execute("SELECT 1 FROM sessions WHERE id = %s", (self._id,)).fetchone()
            if row is None:
                raise SessionError(f"{self.location}: no such session in the database")
            return self._read_lines(conn)

    def tail(self) -> Tail:
        """Where the session ends now, read fresh from its row (D27)."""
        if self._id is None:
            return EMPTY_TAIL
        with self._errors("read it"):
            row = (
                self._db()
                .execute(
                    "SELECT last_id, length, rewrites FROM sessions WHERE id = %s", (self._id,)
                )
                .fetchone()
            )
        if row is None:
            return EMPTY_TAIL
        self._seen_rewrites = int(row[2])
        return Tail(last_id=row[0], length=int(row[1]))

    def has_entry(self, entry_id: str) -> bool:
        """Whether an entry with this id is stored, without loading the session.

        A commit retried after its worker died can ask this first, with the entry id the
        journal recorded for it, and so never append the same entry twice.
        """
        if self._id is None or "\x00" in entry_id:  # such an id is never stored
            return False
        with self._errors("read it"):
            row = (
                self._db()
                .execute(
                    "SELECT 1 FROM session_lines WHERE session_id = %s AND entry_id = %s LIMIT 1",
                    (self._id, entry_id),
                )
                .fetchone()
            )
        return row is not None

    def find_entry(self, entry_id: str) -> Entry | None:
        """The stored entry with this id (its line parsed), without loading the session."""
        if self._id is None or "\x00" in entry_id:  # such an id is never stored
            return None
        with self._errors("read it"):
            row = (
                self._db()
                .execute(
                    "SELECT line FROM session_lines WHERE session_id = %s AND entry_id = %s"
                    " ORDER BY seq LIMIT 1",
                    (self._id, entry_id),
                )
                .fetchone()
            )
        if row is None:
            return None
        # Only lines that parsed as JSON objects have an entry_id (postgres_lines.line_row).
        entry: Entry = json.loads(row[0])
        return entry

    # -- writing -----------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry], *, expect: Tail | None = None) -> Tail:
        """Append entries as lines in one transaction.

        Args:
            entries: The entries; a new session's first must be its header.
            expect: Write only if the session still ends here (D27).

        Returns:
            Where the session ends after the write.

        Raises:
            SessionLockedError: Another store or process owns the session.
            ConflictError: The session no longer ends at ``expect``; nothing was written.
            SessionError: For the same reasons as ``JsonlStore.append``, or the database failed.
        """
        if not entries:
            return expect or self._end or self.tail()
        lines = [write_pi_line(entry) for entry in entries]
        self._refuse_nul_ids(entries)
        self._claim(entries[0])
        conn = self._writer()
        assert self._id is not None
        with self._errors("write it"), conn.transaction():
            row = self._row_for_update(conn)
            found = self._check(row, expect)
            state = self._parsed(conn, row)
            refusal = append_refusal(self.location, state, entries)
            if refusal:
                raise SessionError(refusal)
            count = 0 if row is None else int(row[2])
            end = tail_after(found, entries, found.length + sum(map(len, lines)))
            if row is None:
                written = self._insert_session(conn, count + len(lines), end)
            else:
                written = conn.execute(
                    "UPDATE sessions SET line_count = %s, last_id = %s, length = %s,"
                    " version = version + 1, updated_at = now()"
                    f" WHERE id = %s RETURNING {_STAMPED}",
                    (count + len(lines), end.last_id, end.length, self._id),
                ).fetchone()
            self._copy_lines(conn, count, lines)
        self._wrote(written)
        rewrites = 0 if row is None else int(row[3])
        self._seen_rewrites = rewrites
        if state.result.header is None:
            state = read_session(b"".join(lines), random_hex=self._random_hex)
        self._state = (rewrites, state)
        self._end = end
        return end

    def rewrite(
        self, header: Entry, entries: Sequence[Entry], *, expect: Tail | None = None
    ) -> Tail:
        """Replace every line with ``header`` and ``entries`` in one transaction.

        Args:
            header: The session header.
            entries: Every entry, in order.
            expect: Replace only if the session still ends here (D27).

        Returns:
            Where the session ends after the rewrite.

        Raises:
            SessionLockedError: Another store or process owns the session.
            ConflictError: The session no longer ends at ``expect``; nothing was written.
            SessionError: ``header`` is not a session header (or names another session), the
                stored session has problems a rewrite would erase (D3), or the database failed.
        """
        if header.get("type") != "session" or not isinstance(header.get("id"), str):
            raise SessionError(
                f"cannot rewrite {self.location}: the header is not a session header"
            )
        lines = [write_pi_line(entry) for entry in (header, *entries)]
        self._refuse_nul_ids([header, *entries])
        self._claim(header)
        conn = self._writer()
        with self._errors("write it"), conn.transaction():
            row = self._row_for_update(conn)
            self._check(row, expect)
            refusal = rewrite_refusal(self.location, self._parsed(conn, row))
            if refusal:
                raise SessionError(refusal)
            end = tail_after(None, entries, sum(map(len, lines)))
            if row is None:
                written = self._insert_session(conn, len(lines), end)
                rewrites = 0
            else:
                conn.execute("DELETE FROM session_lines WHERE session_id = %s", (self._id,))
                written = conn.execute(
                    "UPDATE sessions SET line_count = %s, last_id = %s, length = %s,"
                    " version = version + 1, rewrites = rewrites + 1, updated_at = now()"
                    f" WHERE id = %s RETURNING {_STAMPED}",
                    (len(lines), end.last_id, end.length, self._id),
                ).fetchone()
                rewrites = int(row[3]) + 1
            self._copy_lines(conn, 0, lines)
        self._wrote(written)
        result = LoadResult(header=header, entries=list(entries))
        self._seen_rewrites = rewrites
        self._state = (
            rewrites,
            ParsedSession(result=result, stored_version=header_version(header)),
        )
        self._end = end
        return end

    def import_bytes(self, data: bytes, *, source: str = "the data") -> Tail:
        """Store a whole pi file as a new session, line for line (``orchestrator import``).

        Every line is kept as written, damaged ones included, so :meth:`export_bytes` gives the
        same bytes back and :meth:`load` reports the same problems as the file would.

        Args:
            data: The file's bytes.
            source: Where they come from, for messages (the file's path).

        Returns:
            Where the imported session ends.

        Raises:
            SessionError: The bytes are not a session (no header, or an empty id), end in an
                unterminated line, hold a line PostgreSQL text cannot carry (invalid UTF-8,
                NUL), name another session than this store's, or the session already exists.
        """
        parsed = read_session(data, random_hex=self._random_hex)
        header = parsed.result.header
        if header is None:
            details = "; ".join(str(p) for p in parsed.result.problems) or "no session header"
            raise SessionError(f"{source}: not a session file ({details})")
        if header.get("id") == "":
            # Nothing could name it again (``export``, ``session.open``): refused, not stored.
            raise SessionError(f"{source}: line 1: the session id is empty; nothing was written")
        if not data.endswith(b"\n"):
            number = data.count(b"\n") + 1
            raise SessionError(
                f"{source}: line {number}: the last line does not end in a newline "
                "(a torn write?); a database session holds whole lines only"
            )
        lines = data.split(b"\n")[:-1]
        for number, line in enumerate(lines, start=1):
            if b"\x00" in line:
                raise SessionError(
                    f"{source}: line {number}: holds a NUL byte, which PostgreSQL cannot store"
                )
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise SessionError(
                    f"{source}: line {number}: not valid UTF-8, which PostgreSQL text cannot store"
                ) from None
            refusal = nul_id_refusal(f"{source}: line {number}", ids_of(text)[0])
            if refusal:
                raise SessionError(refusal)
        self._claim(header)
        if self.exists():
            raise SessionError(f"{self.location}: the session already exists in the database")
        conn = self._writer()
        end = tail_of_bytes(data)
        with self._errors("write it"), conn.transaction():
            if self._row_for_update(conn) is not None:
                raise SessionError(f"{self.location}: the session already exists in the database")
            written = self._insert_session(conn, len(lines), end)
            self._copy_lines(conn, 0, [line + b"\n" for line in lines])
        self._wrote(written)
        self._state = (0, parsed)
        self._seen_rewrites = 0
        self._end = end
        return end

    def sync(self) -> None:
        """Nothing to do: every write was a committed transaction."""

    def close(self) -> None:
        """Release the owner lock and close (or give back) the connection. Idempotent."""
        super().close()
        self._state = None

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------------------

    def _refuse_nul_ids(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            refusal = nul_id_refusal(self.location, entry.get("id"))
            if refusal:
                raise SessionError(refusal)

    def _check(self, row: tuple[Any, ...] | None, expect: Tail | None) -> Tail:
        """Refuse unless the session still ends at ``expect`` and was not rewritten (D27)."""
        found = EMPTY_TAIL if row is None else Tail(last_id=row[0], length=int(row[1]))
        if expect is None:
            return found
        check_tail(self.location, expect, found)
        if row is not None and self._seen_rewrites not in (None, int(row[3])):
            # A rewrite may end at the same entry and length: its count tells it apart.
            raise changed(self.location, "another writer rewrote it")
        return found

    def _row_for_update(self, conn: Connection) -> tuple[Any, ...] | None:
        return conn.execute(
            "SELECT last_id, length, line_count, rewrites FROM sessions WHERE id = %s FOR UPDATE",
            (self._id,),
        ).fetchone()

    def _parsed(self, conn: Connection, row: tuple[Any, ...] | None) -> ParsedSession:
        """What the write refusals look at: reparsed only when another store rewrote it."""
        if row is None:
            return read_session(b"", random_hex=self._random_hex)
        if self._state is not None and self._state[0] == int(row[3]):
            return self._state[1]
        parsed = read_session(self._read_lines(conn), random_hex=self._random_hex)
        self._state = (int(row[3]), parsed)
        return parsed

    def _read_lines(self, conn: Connection) -> bytes:
        rows = conn.execute(
            "SELECT line FROM session_lines WHERE session_id = %s ORDER BY seq", (self._id,)
        )
        return b"".join(f"{row[0]}\n".encode() for row in rows)

    def _insert_session(self, conn: Connection, count: int, end: Tail) -> tuple[Any, ...] | None:
        created = conn.execute(
            "INSERT INTO sessions (id, line_count, last_id, length) VALUES (%s, %s, %s, %s)"
            f" ON CONFLICT (id) DO NOTHING RETURNING {_STAMPED}",
            (self._id, count, end.last_id, end.length),
        )
        if created.rowcount != 1:
            raise changed(self.location, "another writer created it")
        return created.fetchone()

    def _wrote(self, row: tuple[Any, ...] | None) -> None:
        """Remember the stamp a committed write left (its own transaction read it)."""
        self._stamp = None if row is None else self._stamped(row)

    def _copy_lines(self, conn: Connection, first_seq: int, lines: Sequence[bytes]) -> None:
        assert self._id is not None
        with (
            conn.cursor() as cursor,
            cursor.copy(
                "COPY session_lines (session_id, seq, line, entry_id, entry_type) FROM STDIN"
            ) as copy,
        ):
            for offset, line in enumerate(lines):
                copy.write_row(line_row(self._id, first_seq + offset, line))
