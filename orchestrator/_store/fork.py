"""Forking: a new session holding one path of another (pi's fork, D28).

pi's ``createBranchedSession``: the new file gets a fresh header whose ``parentSession`` names
the source (an absolute path, as pi writes it), then the path root→leaf without its label
entries, then fresh label entries (chained after the last path entry) for every label whose
target is on the path. It is written at once when the path holds an assistant message, else
lazily like any new session.

D28 (pi#5669): pi leaves an entry whose parent was a dropped label pointing at that label, so
the fork has an unknown parent and its context stops there. I re-parent such an entry to its
nearest copied ancestor, which on a path is simply the entry copied before it. The fork then
passes ``check`` and its context is the source's context at the fork point. Entries are copied,
never changed in place: the source session is untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from orchestrator._core.entries import LABEL, MESSAGE, Entry, role_of, text_of
from orchestrator._core.errors import EntryNotFoundError, SessionError
from orchestrator._core.tree import SessionTree
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session, new_header


def branched_session(
    source: Session,
    leaf_id: str | None,
    store: SessionStore,
    *,
    clock: Callable[[], int] | None = None,
    session_id: str | None = None,
    tree: SessionTree | None = None,
) -> Session:
    """Create a new session in ``store`` holding ``source``'s path to ``leaf_id``.

    ``leaf_id=None`` gives an empty session (forking from a root user message). ``session_id``
    names the new session (default: a fresh UUID), e.g. the id a database store was opened with.
    ``tree``: the source's tree to read (default: its own), a :meth:`~SessionTree.snapshot` for
    a fork made in a worker thread while the source may grow.

    Raises:
        SessionError: ``Entry <id> not found`` when the leaf is unknown.
    """
    now = clock or source._clock
    tree = tree if tree is not None else source.tree
    path = tree.path(leaf_id) if leaf_id is not None else []
    if leaf_id is not None and not path:
        raise EntryNotFoundError(leaf_id)
    header = new_header(
        str(source.header.get("cwd", "/")),
        now(),
        parent_session=parent_session(source),
        session_id=session_id,
    )
    if isinstance(store, JsonlStore) and isinstance(source.store, JsonlStore):
        # A fork of a private session is private too: it holds the same conversation.
        store.private_like = source.store.path
    copied = SessionTree(header, copy_path(path))
    session = Session(store, copied, persisted=False, clock=now, random_hex=source._random_hex)
    on_path = {e["id"] for e in copied.entries}
    for target, label in tree.labels.items():
        if target in on_path:
            session.append_entry(LABEL, {"targetId": target, "label": label})
    if any(role_of(e) == "assistant" for e in copied.entries):
        session.flush()
    return session


def copy_path(path: list[Entry]) -> list[Entry]:
    """The path without its label entries, each entry re-parented onto the one copied before it.

    On a root-first path every entry's parent is the entry before it, so when that one was a
    label (dropped), the nearest copied ancestor is the last entry kept (D28). Entries whose
    parent is unchanged are shared, not copied.
    """
    kept: list[Entry] = []
    for entry in path:
        if entry.get("type") == LABEL:
            continue
        parent = kept[-1]["id"] if kept else None
        kept.append(entry if entry.get("parentId") == parent else {**entry, "parentId": parent})
    return kept


def parent_session(source: Session) -> str:
    """What a fork's ``parentSession`` names: the source file's absolute path, as pi writes it."""
    if isinstance(source.store, JsonlStore):
        return os.path.abspath(source.store.path)
    return source.store.location


def fork_target(source: Session, entry_id: str) -> tuple[str | None, str]:
    """Where a fork from a user message starts, and the message's text for the editor.

    Returns:
        ``(leaf id of the new session's path, editor text)``; the leaf is the message's parent
        (``None`` when the message is a root).

    Raises:
        SessionError: ``Entry <id> not found`` for an unknown id; ``Invalid entry ID for
            forking: ...`` saying what the entry is when it is not a user message.
    """
    entry = source.tree.by_id.get(entry_id)
    if entry is None:
        raise EntryNotFoundError(entry_id)
    if role_of(entry) != "user":
        raise SessionError(
            f"Invalid entry ID for forking: {entry_id} is {_kind_of(entry)}; "
            "a fork starts before a user message"
        )
    parent = source.tree.parent_of(entry)
    return (parent["id"] if parent is not None else None), text_of(entry["message"].get("content"))


def _kind_of(entry: Entry) -> str:
    if entry.get("type") == MESSAGE:
        role = role_of(entry) or "unknown"
        return f"{'an' if role[0] in 'aeiou' else 'a'} {role} message"
    kind = str(entry.get("type"))
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} entry"


def fork_path(location: str | os.PathLike[str]) -> Path:
    """A free file name beside ``location`` for a fork: ``<stem>.fork<N><suffix>``.

    Raises:
        SessionError: ten thousand forks already sit beside it.
    """
    source = Path(location)
    for n in range(1, 10_000):
        candidate = source.with_name(f"{source.stem}.fork{n}{source.suffix}")
        # A dangling symbolic link is taken too; so is a name another fork is writing: its
        # owner holds the lock file from before the file exists (two forks at once both chose
        # fork1, and the second was refused as "being changed by" its own process).
        if not os.path.lexists(candidate) and not os.path.lexists(f"{candidate}.lock"):
            return candidate
    raise SessionError(f"{source}: too many forks beside it")
