"""Tree navigation: where the leaf goes, and what returns to the editor (as in pi).

Pure decisions over the tree, plus the one function that applies a navigation to a session.
Selecting a user message moves the active context to just *before* it (its parent) and hands its
text back to the editor, so the user can edit and resend it; selecting anything else makes that
entry the leaf. A branch summary, when there is one, is attached at the new position (D17) with
``fromId`` naming the abandoned leaf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import CUSTOM, CUSTOM_MESSAGE, Entry, role_of, text_of
from orchestrator._core.tree import SessionTree
from orchestrator._store.session import Session

LEAF_MARKER = "orchestrator/leaf"
"""``customType`` of the entry that records a navigation without a summary in the store.

pi keeps the leaf in memory and reopens a session at its last entry. Where no process keeps the
session in memory (a command, the cluster), a move without a summary is recorded as a ``custom``
entry under the new leaf (never part of the context; pi ignores it).
"""


def is_leaf_marker(entry: Entry) -> bool:
    """Whether ``entry`` is a leaf marker (ours: bookkeeping of a position, never content)."""
    return entry.get("type") == CUSTOM and entry.get("customType") == LEAF_MARKER


def position_is_recorded(session: Session) -> bool:
    """True when reopening the session already lands at the active leaf (no marker needed).

    A session reopens at its last entry: that is the leaf itself, or a leaf marker written under
    it by an earlier navigation to the same place (navigating there twice must not pile up
    markers). An empty session has no position to record.
    """
    entries = session.tree.entries
    if not entries:
        return True
    last = entries[-1]
    if last["id"] == session.leaf_id:
        return True
    return last.get("customType") == LEAF_MARKER and last.get("parentId") == session.leaf_id


def recorded_position(session: Session) -> Session:
    """``session`` with its leaf at the position a trailing leaf marker records.

    A session whose last entry is a leaf marker is at the marker's parent (as the process that
    moved the leaf saw it); anything else is at its last entry. Returns ``session`` itself.
    """
    entries = session.tree.entries
    if entries and entries[-1].get("type") == CUSTOM:
        last = entries[-1]
        parent = last.get("parentId")
        if last.get("customType") == LEAF_MARKER and (
            parent is None or parent in session.tree.by_id
        ):
            if parent is None:
                session.reset_leaf()
            else:
                session.branch(parent)
    return session


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigationTarget:
    """Where navigating to an entry puts the leaf.

    Attributes:
        target_id: The selected entry.
        new_leaf_id: The leaf after navigation (``None``: before the first entry).
        editor_text: Text to put back in the editor (user and custom messages), else ``None``.
    """

    target_id: str
    new_leaf_id: str | None
    editor_text: str | None


def navigation_target(tree: SessionTree, target_id: str) -> NavigationTarget:
    """Decide the new leaf and editor text for a navigation to ``target_id``.

    Raises:
        SessionError: ``Entry <id> not found``.
    """
    entry = tree.get(target_id)
    if role_of(entry) == "user":
        parent = tree.parent_of(entry)
        return NavigationTarget(
            target_id=target_id,
            new_leaf_id=parent["id"] if parent else None,
            editor_text=text_of(entry["message"].get("content")),
        )
    if entry.get("type") == CUSTOM_MESSAGE:
        parent = tree.parent_of(entry)
        return NavigationTarget(
            target_id=target_id,
            new_leaf_id=parent["id"] if parent else None,
            editor_text=text_of(entry.get("content")),
        )
    return NavigationTarget(target_id=target_id, new_leaf_id=target_id, editor_text=None)


def apply_navigation(
    session: Session,
    target: NavigationTarget,
    *,
    old_leaf_id: str | None,
    summary: str | None = None,
    details: dict[str, Any] | None = None,
    from_extension: bool = False,
) -> Entry | None:
    """Move the session's leaf; attach a branch summary there when one is given.

    Returns:
        The branch-summary entry, or ``None`` when no summary was attached.
    """
    if summary:
        return session.branch_with_summary(
            target.new_leaf_id,
            summary,
            from_id=old_leaf_id,
            details=details,
            from_extension=from_extension,
        )
    if target.new_leaf_id is None:
        session.reset_leaf()
    else:
        session.branch(target.new_leaf_id)
    return None
