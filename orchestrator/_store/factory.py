"""One place that turns a location into a store: a file path or a PostgreSQL URL (issue 10).

``postgresql://...`` (or ``postgres://...``) gives the database store, anything else the JSONL
file store. The database modules, and psycopg with them, are imported only for a URL, so the
file-based path never loads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator._store.locations import URL_SCHEMES as URL_SCHEMES
from orchestrator._store.locations import is_database_url as is_database_url
from orchestrator._store.protocol import SessionStore

if TYPE_CHECKING:
    # Annotations only: the journal loads the machine tables (transitions), a store does not.
    from orchestrator._store.journal import Journal
    from orchestrator._store.postgres import PostgresStore


def open_store(location: str | os.PathLike[str], session_id: str | None = None) -> SessionStore:
    """The store for ``location``: a PostgreSQL URL or a session file's path.

    Args:
        location: ``postgresql://USER@HOST/DATABASE`` or a path.
        session_id: For a database, the session (``None``: a new one, named by its header);
            ignored for a file, which holds one session.

    Returns:
        A store; nothing is read or connected until it is used.
    """
    if is_database_url(location):
        return open_database_store(str(location), session_id)
    from orchestrator._store.jsonl import JsonlStore

    return JsonlStore(Path(location))


def open_database_store(url: str, session_id: str | None = None) -> PostgresStore:
    """The PostgreSQL store of ``session_id`` at ``url`` (imports psycopg)."""
    from orchestrator._store.postgres import PostgresStore

    return PostgresStore(url, session_id)


def open_journal(location: str | os.PathLike[str], session_id: str | None = None) -> Journal:
    """The lifecycle journal beside a store: a ``.journal`` file, or rows in the same database.

    Raises:
        ValueError: A database location without a session id.
    """
    if is_database_url(location):
        if session_id is None:
            raise ValueError("a database journal needs the session id")
        from orchestrator._store.postgres_journal import postgres_journal

        return postgres_journal(str(location), session_id)
    from orchestrator._store.journal import Journal

    return Journal.open(location)
