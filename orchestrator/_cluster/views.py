"""Views of a stored session as an operation or navigation found it (D27)."""

from __future__ import annotations

from typing import Any

from orchestrator._core.tree import SessionTree
from orchestrator._store.protocol import Tail
from orchestrator._store.session import Session


def planned_view(session: Session, expect: Tail, entry_id: str | None = None) -> Session:
    """``session`` cut back to the entries stored when the store ended at ``expect`` (D27).

    New entries get ``entry_id``. A session changed beyond recognition (``expect``'s last entry
    is gone) is returned as it is: a conditional write on it conflicts.
    """
    if session.tail() == expect or expect.last_id not in session.tree.by_id:
        return session
    entries = session.tree.entries
    cut = next(i for i, e in enumerate(entries) if e.get("id") == expect.last_id) + 1
    tree = SessionTree(session.header, entries[:cut])
    kwargs: dict[str, Any] = {} if entry_id is None else {"random_hex": lambda: entry_id}
    return Session(session.store, tree, persisted=True, tail=expect, **kwargs)
