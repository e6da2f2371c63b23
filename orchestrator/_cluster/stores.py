"""Where the cluster's sessions live: a store every worker can reach.

``--database`` names it. A PostgreSQL URL is the fleet's store (sessions and journals in one
database, :mod:`orchestrator._store.factory`); a directory is one machine's
(``<dir>/<session id>.jsonl``, with the journal beside each file), which every worker process
on that machine can share, because the file store's conditional append is safe across
processes (D27).

A worker reaches them through :class:`WorkerStores`: one connection pool per worker process
and a cache of parsed sessions (:mod:`orchestrator._cluster.cache`), through which every
activity that reads a session reads it (:meth:`WorkerStores.session`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from orchestrator._cluster.cache import Cached, SessionCache
from orchestrator._core.entries import Entry
from orchestrator._core.load_result import LoadResult
from orchestrator._core.loading import ParsedSession
from orchestrator._core.tree import SessionTree
from orchestrator._store.factory import is_database_url, open_journal, open_store
from orchestrator._store.journal import Journal
from orchestrator._store.protocol import SessionStore, Tail
from orchestrator._store.session import Session

if TYPE_CHECKING:
    from orchestrator._store.postgres_pool import Pool


class StampedStore(SessionStore, Protocol):
    """A store that can say whether a parse of it is still current (both cluster stores)."""

    def stamp(self) -> tuple[Any, ...] | None:
        """A value that changes with every write, read fresh; ``None``: nothing stored."""
        ...

    @property
    def loaded(self) -> tuple[tuple[Any, ...], ParsedSession] | None:
        """The last parse and the stamp it was made at."""
        ...

    @property
    def written(self) -> tuple[Any, ...] | None:
        """The stamp this store's last write left, when it can know it exactly."""
        ...

    def prime(self, stamp: tuple[Any, ...], parsed: ParsedSession) -> None:
        """Use a parse made at ``stamp`` by another store of the same session."""
        ...


def session_path(database: str, session_id: str) -> Path:
    """The file of ``session_id`` in a directory store."""
    return Path(database) / f"{session_id}.jsonl"


def cluster_store(database: str, session_id: str) -> SessionStore:
    """The store of ``session_id`` in ``database`` (close it when done)."""
    if is_database_url(database):
        return open_store(database, session_id)
    return open_store(session_path(database, session_id))


def cluster_journal(database: str, session_id: str) -> Journal:
    """The lifecycle journal of ``session_id`` in ``database``."""
    if is_database_url(database):
        return open_journal(database, session_id)
    return open_journal(session_path(database, session_id))


def fixed_id(entry_id: str | None) -> Callable[[], str] | None:
    """What makes new entries' ids when the one new entry's id is fixed (``None``: random)."""
    if entry_id is None:
        return None
    return lambda: entry_id


def shown(database: str) -> str:
    """``database`` without its password, for messages and logs."""
    scheme, sep, rest = database.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        return f"{scheme}://{credentials.partition(':')[0]}@{host}"
    return database


class WorkerStores:
    """A worker's way to its sessions: pooled connections and a cache of parsed sessions.

    For a PostgreSQL ``database`` it keeps one connection pool
    (:mod:`orchestrator._store.postgres_pool`), opened at the first use and closed by
    :meth:`close` (the worker calls it when it stops); stores and journals borrow from it. For a
    directory there is nothing to pool (a file store opens its file per use, which is cheap);
    both keep a :class:`~orchestrator._cluster.cache.SessionCache`.

    Args:
        database: Where sessions live (a URL or a directory).
        cache: The parsed sessions' cache (default: :class:`SessionCache` with its defaults).
        pool_size: Connections the pool keeps at most.
    """

    def __init__(
        self, database: str, *, cache: SessionCache | None = None, pool_size: int = 8
    ) -> None:
        self.database = database
        self.cache = cache if cache is not None else SessionCache()
        self.pool_size = pool_size
        self._pool: Pool | None = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> Pool | None:
        """The open pool (``None`` for a directory, or before the first use, or once closed)."""
        return self._pool

    def store(self, session_id: str) -> StampedStore:
        """A store of ``session_id`` (close it when done: its connection goes back)."""
        if not is_database_url(self.database):
            from orchestrator._store.jsonl import JsonlStore

            return JsonlStore(session_path(self.database, session_id))
        from orchestrator._store.postgres import PostgresStore

        return PostgresStore(self.database, session_id, pool=self._open_pool())

    def session(
        self, session_id: str, *, random_hex: Callable[[], str] | None = None
    ) -> tuple[Session, Cached | None]:
        """The session as stored now, from the cache when it is current (close its store).

        The store's stamp is read first (one small query, or a ``stat``); a cached parse made at
        another stamp is dropped and the session read again, so what this returns is never
        older than the store was when it was called.

        Args:
            session_id: The session.
            random_hex: The ids new entries get (default: random).

        Returns:
            The session, and its cache entry (``None`` when the session is not stored: the
            session is then a new, empty one).
        """
        kwargs: dict[str, Any] = {} if random_hex is None else {"random_hex": random_hex}
        store = self.store(session_id)
        try:
            cached = self.cache.get(session_id, store.stamp())
            if cached is not None:
                store.prime(cached.stamp, cached.parsed)
            else:
                store.load()
                if store.loaded is not None:
                    cached = self.cache.put(session_id, *store.loaded)
            if cached is None or cached.parsed.result.header is None:
                return Session.from_store(store, **kwargs), None
            return _session_of(store, cached.parsed.result, kwargs), cached
        except BaseException:
            store.close()
            raise

    def remember(
        self,
        session_id: str,
        session: Session,
        cached: Cached | None,
        added: Sequence[Entry],
        base: Tail,
    ) -> None:
        """After this worker wrote ``added`` after ``base``: keep the session so, or forget it.

        Kept only when the store read its new stamp in the write's own transaction (a
        database; a file cannot say), the write extended exactly the parse that was cached
        (``base``, the tail the write was conditional on, was its tail), and that parse needed
        no migration (whose first write is a rewrite). Otherwise the next use reads the session
        again.
        """
        written = cast("StampedStore", session.store).written
        result = None if cached is None else cached.parsed.result
        if written is None or result is None or result.migrated or result.tail != base:
            self.cache.drop(session_id)
            return
        assert cached is not None
        grown = dataclasses.replace(result, entries=[*result.entries, *added], tail=session.tail())
        self.cache.put(session_id, written, dataclasses.replace(cached.parsed, result=grown))

    def journal(self, session_id: str) -> Journal:
        """The lifecycle journal of ``session_id``."""
        if not is_database_url(self.database):
            return open_journal(session_path(self.database, session_id))
        from orchestrator._store.postgres_journal import postgres_journal

        return postgres_journal(self.database, session_id, pool=self._open_pool())

    def close(self) -> None:
        """Close the pool and forget every cached session; a later use opens a new pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        self.cache.clear()

    def _open_pool(self) -> Pool:
        with self._lock:
            if self._pool is None:
                from orchestrator._store.postgres_pool import open_pool

                self._pool = open_pool(self.database, max_size=self.pool_size)
            return self._pool


def _session_of(store: SessionStore, result: LoadResult, kwargs: dict[str, Any]) -> Session:
    """A session over ``store`` from a parse of it (as :meth:`Session.from_store` builds one).

    The tree is new for every use (indexing copies the entry list), so a write that adds to it
    never changes the cached parse.
    """
    assert result.header is not None
    return Session(
        store,
        SessionTree(result.header, result.entries),
        persisted=True,
        problems=result.problems,
        migrated=result.migrated,
        tail=result.tail,
        **kwargs,
    )
