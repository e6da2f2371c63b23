"""Forking: a new session holding one path of another (pi's fork, D28).

pi's ``createBranchedSession``: the new file gets a fresh header whose ``parentSession`` names
the source, then the path root→leaf without its label entries, then fresh label entries (chained
after the last path entry) for every label whose target is on the path. It is written at once
when the path holds an assistant message, else lazily like any new session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from orchestrator._core.entries import LABEL, Entry, role_of, text_of
from orchestrator._core.errors import SessionError
from orchestrator._core.tree import SessionTree
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session, new_header


def branched_session(
    source: Session,
    leaf_id: str | None,
    store: SessionStore,
    *,
    clock: Callable[[], int] | None = None,
) -> Session:
    """Create a new session in ``store`` holding ``source``'s path to ``leaf_id``.

    ``leaf_id=None`` gives an empty session (forking from a root user message).

    Raises:
        SessionError: ``Entry <id> not found`` when the leaf is unknown.
    """
    now = clock or source._clock
    path = source.tree.path(leaf_id) if leaf_id is not None else []
    if leaf_id is not None and not path:
        raise SessionError(f"Entry {leaf_id} not found")
    header = new_header(
        str(source.header.get("cwd", "/")), now(), parent_session=source.store.location
    )
    kept: list[Entry] = [e for e in path if e.get("type") != LABEL]
    tree = SessionTree(header, kept)
    session = Session(store, tree, persisted=False, clock=now, random_hex=source._random_hex)
    on_path = {e["id"] for e in kept}
    for target, label in source.tree.labels.items():
        if target in on_path:
            session.append_entry(LABEL, {"targetId": target, "label": label})
    if any(role_of(e) == "assistant" for e in kept):
        session.flush()
    return session


def fork_target(source: Session, entry_id: str) -> tuple[str | None, str]:
    """Where a fork from a user message starts, and the message's text for the editor.

    Returns:
        ``(leaf id of the new session's path, editor text)``; the leaf is the message's parent
        (``None`` when the message is a root).

    Raises:
        SessionError: ``Invalid entry ID for forking`` when the entry is not a user message.
    """
    entry = source.tree.by_id.get(entry_id)
    if entry is None or role_of(entry) != "user":
        raise SessionError("Invalid entry ID for forking")
    parent = source.tree.parent_of(entry)
    return (parent["id"] if parent is not None else None), text_of(entry["message"].get("content"))


def fork_path(location: str | os.PathLike[str]) -> Path:
    """A free file name beside ``location`` for a fork: ``<stem>.fork<N><suffix>``.

    Raises:
        SessionError: ten thousand forks already sit beside it.
    """
    source = Path(location)
    for n in range(1, 10_000):
        candidate = source.with_name(f"{source.stem}.fork{n}{source.suffix}")
        if not candidate.exists():
            return candidate
    raise SessionError(f"{source}: too many forks beside it")
