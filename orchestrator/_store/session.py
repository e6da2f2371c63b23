"""A session: the tree of entries, the store it lives in, and the active context.

This is the layer that turns tree operations into store writes. The tree and the context
builder stay sans-I/O; the ``Session`` is the one place where an append reaches the store.

The ``Session`` is built in three parts: the tree and context views
(:mod:`~orchestrator._store.session_view`), the writes with their theory of persistence and
conditional writes (:mod:`~orchestrator._store.session_writes`), and here opening a session and
the typed appends (``append_message``, ``append_compaction``...) with the fields they build.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator._core.context import ContextBuilder
from orchestrator._core.entries import (
    BRANCH_SUMMARY,
    COMPACTION,
    CURRENT_VERSION,
    CUSTOM,
    CUSTOM_MESSAGE,
    LABEL,
    MESSAGE,
    MODEL_CHANGE,
    SESSION_INFO,
    THINKING_LEVEL_CHANGE,
    Entry,
    Message,
    iso_now,
)
from orchestrator._core.errors import NotASessionError, SessionError
from orchestrator._core.load_result import LoadResult, Problem, Tail
from orchestrator._core.loading import gc_paused
from orchestrator._core.tree import SessionTree
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session_writes import SessionWrites


def wall_clock_ms() -> int:
    """The real clock, in epoch milliseconds (the default; tests inject their own)."""
    return int(time.time() * 1000)


def _random_hex() -> str:
    # Ids need to be unique in their session (new_entry_id retries on a clash), not secret:
    # the random module's generator (seeded from the system's randomness at import, reseeded
    # in a forked child) costs no system call, where uuid4 reads /dev/urandom each time and
    # gives the GIL away meanwhile (issue 9).
    return f"{random.getrandbits(128):032x}"


def _new_session_id() -> str:
    import uuid

    return str(uuid.uuid4())


def new_header(
    cwd: str, now_ms: int, *, parent_session: str | None = None, session_id: str | None = None
) -> Entry:
    """A version-3 session header, as pi writes it (a fresh UUID unless ``session_id`` is given)."""
    header: Entry = {
        "type": "session",
        "version": CURRENT_VERSION,
        "id": session_id if session_id is not None else _new_session_id(),
        "timestamp": iso_now(now_ms),
        "cwd": cwd,
    }
    if parent_session is not None:
        header["parentSession"] = parent_session
    return header


def compaction_fields(
    *,
    summary: str,
    first_kept_entry_id: str,
    tokens_before: int,
    details: dict[str, Any] | None = None,
    from_extension: bool = False,
    short_summary: str | None = None,
    preserve_data: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a compaction entry, as pi writes them (OMP extras only when set).

    ``usage`` is what the summary calls cost (pi 1.x writes it; it counts in session totals).
    """
    fields: dict[str, Any] = {
        "summary": summary,
        "firstKeptEntryId": first_kept_entry_id,
        "tokensBefore": tokens_before,
    }
    if details is not None:
        fields["details"] = details
    if usage is not None:
        fields["usage"] = usage
    if from_extension:
        fields["fromExtension"] = True
    if short_summary:
        fields["shortSummary"] = short_summary
    if preserve_data:
        fields["preserveData"] = preserve_data
    return fields


def branch_summary_fields(
    *,
    summary: str,
    from_id: str | None,
    details: dict[str, Any] | None = None,
    from_extension: bool = False,
    short_summary: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a branch summary; ``fromId`` is the abandoned leaf (D17), else ``root``.

    ``shortSummary`` is ours (pi's branch summaries have none; pi keeps the unknown field).
    """
    fields: dict[str, Any] = {
        "fromId": from_id if from_id is not None else "root",
        "summary": summary,
    }
    if short_summary:
        fields["shortSummary"] = short_summary
    if details is not None:
        fields["details"] = details
    if usage is not None:
        fields["usage"] = usage
    if from_extension:
        fields["fromExtension"] = True
    return fields


class Session(SessionWrites):
    """One session: a :class:`SessionTree` kept in a :class:`SessionStore`.

    Build one with :meth:`open` (a JSONL file), :meth:`in_memory`, or :meth:`from_store`.

    Args:
        store: Where lines are written.
        tree: The loaded tree.
        persisted: Whether the store already holds the header.
        problems: What loading reported (D3); kept so callers can show it.
        migrated: The stored data is an older version, migrated in memory only.
        tail: Where the store ended when ``tree`` was read (default: where it ends now).
        clock: Epoch-ms clock for entry timestamps.
        random_hex: Id randomness.
    """

    def __init__(
        self,
        store: SessionStore,
        tree: SessionTree,
        *,
        persisted: bool,
        problems: Sequence[Problem] = (),
        migrated: bool = False,
        tail: Tail | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        random_hex: Callable[[], str] = _random_hex,
    ) -> None:
        self.store = store
        self._tail = tail if tail is not None else store.tail()
        # A migrated file (version 1 or 2) holds its new ids only in memory; pi rewrites it at
        # load. I rewrite it at the first write instead, so that inspecting never writes.
        self._migration_pending = migrated
        self.tree = tree
        self.problems = list(problems)
        self._persisted = persisted
        self._clock = clock
        self._random_hex = random_hex
        self._builder: ContextBuilder | None = None
        self._builder_leaf: str | None = None
        self._keep_measured = False

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def from_store(
        cls,
        store: SessionStore,
        *,
        owner: str | None = None,
        cwd: str | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        random_hex: Callable[[], str] = _random_hex,
        session_id: str | None = None,
    ) -> Session:
        """Load a session from a store, or start a new one when the store is empty.

        Damaged content is loaded as far as it goes; the problems are in :attr:`problems` and
        the stored bytes are never rewritten because of them (D3).

        Args:
            store: Where the session is kept.
            owner: Own the store before reading it (D27), e.g. ``"orchestrator compact"``;
                ``None`` opens a reader.
            cwd: The working directory written in a new session's header.
            clock: Epoch-ms clock for entry timestamps.
            random_hex: Id randomness.
            session_id: The id a new session's header gets (default: a fresh UUID), e.g. the
                id a database store was opened with.

        Raises:
            SessionLockedError: ``owner`` is given and another process owns the session.
            SessionError: the store holds something that is not a session at all.
        """
        if owner is not None:
            store.own(owner)
            try:
                return cls.from_store(
                    store, cwd=cwd, clock=clock, random_hex=random_hex, session_id=session_id
                )
            except BaseException:
                store.close()  # a session that failed to open must not keep the lock
                raise
        if not store.exists():
            header = new_header(cwd or os.getcwd(), clock(), session_id=session_id)
            return cls(
                store, SessionTree(header), persisted=False, clock=clock, random_hex=random_hex
            )
        # Parsing and indexing allocate millions of acyclic objects on a big file; with the
        # cyclic collector on, its repeated passes over them made loading superlinear.
        with gc_paused():
            result: LoadResult = store.load()
            if result.header is None:
                raise not_a_session(store.location, result.problems)
            tree = SessionTree(result.header, result.entries, result.index)
            # Handed to the tree, which adds to it: a store's cached parse must not see that.
            result.index = None
        return cls(
            store,
            tree,
            persisted=True,
            problems=result.problems,
            migrated=result.migrated,
            tail=result.tail,
            clock=clock,
            random_hex=random_hex,
        )

    def reload(self) -> None:
        """Read the store again as it is now, after another program wrote to it (D27).

        The tree, the problems and the tail become the store's; the leaf is its last entry, as
        for a session just opened; the live context is rebuilt when next asked for. The lock is
        kept. A conflict (:class:`~orchestrator._core.errors.ConflictError`) leaves the session
        as it was read; the runtime reloads it then, so that asking again works from what is
        there now.

        Raises:
            SessionError: the store no longer holds a session, or cannot be read; nothing
                changed then.
        """
        if not self.store.exists():
            raise SessionError(f"{self.store.location}: the session is gone (removed or emptied)")
        with gc_paused():
            result = self.store.load()
            if result.header is None:
                raise not_a_session(self.store.location, result.problems)
            tree = SessionTree(result.header, result.entries, result.index)
            # Handed to the tree, which adds to it: a store's cached parse must not see that.
            result.index = None
        self.tree = tree
        self.problems = list(result.problems)
        self._tail = result.tail
        self._migration_pending = result.migrated
        self._persisted = True
        self._builder = None
        self._builder_leaf = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], **kwargs: Any) -> Session:
        """Open (or create) a pi JSONL session file. Keyword arguments go to :meth:`from_store`.

        ``Session.open(path)`` is a reader: it never locks. A process that will change the
        session opens it as its owner, ``Session.open(path, owner="orchestrator compact")``,
        which takes the file's lock before reading and keeps it until :meth:`close` (D27).

        Raises:
            SessionLockedError: ``session is being changed by pid N (orchestrator compact)``.
            SessionError: the file cannot be read or is not a session.
        """
        from orchestrator._store.jsonl import JsonlStore

        fsync = kwargs.pop("fsync", "per_turn")
        return cls.from_store(JsonlStore(Path(path), fsync=fsync), **kwargs)

    @classmethod
    def in_memory(cls, cwd: str = "/", **kwargs: Any) -> Session:
        """A new session kept in memory only."""
        from orchestrator._store.memory import MemoryStore

        return cls.from_store(MemoryStore(), cwd=cwd, **kwargs)

    # -- typed appends (the store side, add_entry and append_entry, is SessionWrites') --------

    def append_message(self, message: Message, *, expect: Tail | None = None) -> Entry:
        """Append a ``message`` entry (any role); ``expect`` as for :meth:`add_entry`."""
        return self.append_entry(MESSAGE, {"message": message}, expect=expect)

    def append_thinking_level_change(self, level: str) -> Entry:
        """Record a thinking-level change."""
        return self.append_entry(THINKING_LEVEL_CHANGE, {"thinkingLevel": level})

    def append_model_change(self, provider: str, model_id: str) -> Entry:
        """Record a model change (pi's shape, D1)."""
        return self.append_entry(MODEL_CHANGE, {"provider": provider, "modelId": model_id})

    def append_custom(self, custom_type: str, data: Any = None) -> Entry:
        """Extension state that never reaches the context."""
        fields: dict[str, Any] = {"customType": custom_type}
        if data is not None:
            fields["data"] = data
        return self.append_entry(CUSTOM, fields)

    def append_custom_message(
        self,
        custom_type: str,
        content: Any,
        *,
        display: bool = True,
        details: Any = None,
        expect: Tail | None = None,
    ) -> Entry:
        """A message an extension injects into the context (the model sees it as a user message).

        ``expect`` as for :meth:`add_entry`.
        """
        fields: dict[str, Any] = {"customType": custom_type, "content": content, "display": display}
        if details is not None:
            fields["details"] = details
        return self.append_entry(CUSTOM_MESSAGE, fields, expect=expect)

    def append_compaction(
        self,
        *,
        summary: str,
        first_kept_entry_id: str,
        tokens_before: int,
        details: dict[str, Any] | None = None,
        from_extension: bool = False,
        short_summary: str | None = None,
        preserve_data: dict[str, Any] | None = None,
    ) -> Entry:
        """Commit a compaction: one appended entry (D24's commit point)."""
        return self.append_entry(
            COMPACTION,
            compaction_fields(
                summary=summary,
                first_kept_entry_id=first_kept_entry_id,
                tokens_before=tokens_before,
                details=details,
                from_extension=from_extension,
                short_summary=short_summary,
                preserve_data=preserve_data,
            ),
        )

    def branch_with_summary(
        self,
        target_id: str | None,
        summary: str,
        *,
        from_id: str | None,
        details: dict[str, Any] | None = None,
        from_extension: bool = False,
    ) -> Entry:
        """Move the leaf to ``target_id`` and attach a branch summary there (D17).

        ``from_id`` is the abandoned leaf (D17), not the attachment point as pi writes it.

        Raises:
            SessionError: ``Entry <id> not found``.
        """
        entry = self.new_entry(
            BRANCH_SUMMARY,
            branch_summary_fields(
                summary=summary, from_id=from_id, details=details, from_extension=from_extension
            ),
            parent_id=target_id,
        )
        return self.attach_branch_summary(entry)

    def attach_branch_summary(self, entry: Entry, *, expect: Tail | None = None) -> Entry:
        """Move the leaf to the summary's parent and append it there (the navigation commit).

        Args:
            entry: The branch summary entry.
            expect: Write only if the store still ends here (D27); see :meth:`add_entry`.

        Raises:
            ConflictError: the store no longer ends at ``expect``; nothing was written and
                the leaf did not move.
            SessionError: ``Entry <id> not found`` for an unknown parent.
        """
        parent = entry.get("parentId")
        before = self.tree.leaf_id
        if isinstance(parent, str):
            self.tree.branch(parent)
        else:
            self.tree.reset_leaf()
        try:
            return self.add_entry(entry, expect=expect)
        except BaseException:
            self.tree.leaf_id = before
            raise

    def append_label(
        self, target_id: str, label: str | None, *, expect: Tail | None = None
    ) -> Entry:
        """Set (or clear, with ``None`` or ``""``) the label of an entry.

        Args:
            target_id: The entry labelled.
            label: The label (``None`` or ``""`` clears it).
            expect: Write only if the store still ends here (D27); see :meth:`add_entry`.

        Raises:
            SessionError: ``Entry <id> not found``.
            ConflictError: the store no longer ends at ``expect``; nothing was written.
        """
        self.tree.get(target_id)
        fields: dict[str, Any] = {"targetId": target_id}
        if label:
            fields["label"] = label
        return self.append_entry(LABEL, fields, expect=expect)

    def set_name(self, name: str) -> Entry:
        """Name the session (a ``session_info`` entry, as pi does)."""
        return self.append_entry(SESSION_INFO, {"name": name.strip()})


def not_a_session(location: str, problems: Sequence[Problem]) -> NotASessionError:
    """The error for a store with no session header, naming what loading found."""
    details = "; ".join(str(p) for p in problems) or "no session header"
    found = list(problems) or [
        Problem(line=0, code="not_session", message="no session header (nothing but blank lines)")
    ]
    return NotASessionError(f"{location}: not a session file ({details})", found)
