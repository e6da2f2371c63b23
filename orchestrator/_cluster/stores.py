"""Where the cluster's sessions live: a store every worker can reach.

``--database`` names it. A PostgreSQL URL is the fleet's store (sessions and journals in one
database, :mod:`orchestrator._store.factory`); a directory is one machine's
(``<dir>/<session id>.jsonl``, with the journal beside each file), which every worker process
on that machine can share, because the file store's conditional append is safe across
processes (D27).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator._store.factory import is_database_url, open_journal, open_store
from orchestrator._store.journal import Journal
from orchestrator._store.protocol import SessionStore


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


def shown(database: str) -> str:
    """``database`` without its password, for messages and logs."""
    scheme, sep, rest = database.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        return f"{scheme}://{credentials.partition(':')[0]}@{host}"
    return database
