"""A session: the tree of entries, the store it lives in, and the active context.

This is the layer that turns tree operations into store writes. The tree and the context
builder stay sans-I/O; the ``Session`` is the one place where an append reaches the store.

Persistence follows pi: nothing is written until the session holds an
assistant message; at that moment the header and every entry are written in one go, and each
later entry is appended as one whole line (D4). A session opened from an existing file is already
persisted.

Across processes (D27): a session opened with an ``owner`` holds its store's writer lock from
before the read until :meth:`Session.close`; one opened without is a reader and takes no lock
(it takes the lock at its first write, as any store does). The session remembers where the
store ended when it was read (:meth:`Session.tail`) and moves that mark with each of its own
writes, so a commit made with ``expect=session.tail()`` is refused, with nothing written, when
another program appended in between.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator._core.context import ContextBuilder, SessionContext
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
    role_of,
)
from orchestrator._core.errors import NotASessionError, SessionError
from orchestrator._core.load_result import LoadResult, Problem, Tail
from orchestrator._core.loading import gc_paused
from orchestrator._core.system_prompt import current_system_message
from orchestrator._core.tree import LEAF, SessionTree
from orchestrator._store.protocol import SessionStore
from orchestrator._store.tail import check_tail


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


class Session:
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

    # -- reading -------------------------------------------------------------------------------

    @property
    def header(self) -> Entry:
        """The session header."""
        return self.tree.header

    @property
    def session_id(self) -> str:
        """The header's id."""
        return str(self.header.get("id", ""))

    @property
    def leaf_id(self) -> str | None:
        """The active leaf."""
        return self.tree.leaf_id

    def path(self, leaf_id: str | None = None) -> list[Entry]:
        """Entries root-first down to ``leaf_id`` (default: the active leaf).

        For the active leaf, a copy of the path the kept context builder holds (no tree walk).
        """
        if (leaf_id is None or leaf_id == self.tree.leaf_id) and self._builder_current():
            assert self._builder is not None
            return self._builder.path()
        return self.tree.path(leaf_id)

    def _builder_current(self) -> bool:
        return self._builder is not None and self._builder_leaf == self.tree.leaf_id

    @property
    def context_is_live(self) -> bool:
        """Whether :meth:`context` of the active leaf is built and current (answered in O(1))."""
        return self._builder_current()

    def context(self, leaf_id: str | None = None) -> SessionContext:
        """The context the model sees at ``leaf_id`` (default: the active leaf).

        For the active leaf the builder is kept between calls and extended on append, so the
        context after one more entry costs O(1) (compactions: O(kept entries)).
        """
        if leaf_id is not None and leaf_id != self.tree.leaf_id:
            return ContextBuilder(self.tree.path(leaf_id)).context()
        if self._builder is None or self._builder_leaf != self.tree.leaf_id:
            self._builder = ContextBuilder(self.tree.path(), measured=self._keep_measured)
            self._builder_leaf = self.tree.leaf_id
        return self._builder.context()

    def build_context(self) -> tuple[ContextBuilder, str | None]:
        """Build the active leaf's context without keeping it: work for another thread.

        It only reads the tree (a walk of the path, then each entry), so the event loop may go
        on meanwhile; :meth:`take_context` then keeps it, on the loop. Reading while the loop
        appends is safe entry by entry, and the taker checks that the leaf did not move.
        """
        leaf = self.tree.leaf_id
        path = self.tree.path(leaf) if leaf is not None else []
        return ContextBuilder(path, measured=self._keep_measured), leaf

    def take_context(self, built: tuple[ContextBuilder, str | None]) -> None:
        """Keep a context :meth:`build_context` built, if the leaf is still the one it was for."""
        builder, leaf = built
        if leaf == self.tree.leaf_id and not self._builder_current():
            self._builder, self._builder_leaf = builder, leaf

    def keep_measured(self) -> None:
        """Keep the active context measured for summary requests, now and after every rebuild.

        A context measures what a summary request needs of each message on first need
        (:mod:`~orchestrator._core.measures`), so a command that only prints it never pays for
        that. A runtime, which will compact, asks for it here once (nothing is built here:
        a context built later is measured as it is built), and every compaction then finds
        the lengths known.
        """
        self._keep_measured = True
        if self._builder is not None:
            self._builder.measure()

    # -- appending -----------------------------------------------------------------------------

    def new_entry(self, kind: str, fields: dict[str, Any], *, parent_id: object = LEAF) -> Entry:
        """Build an entry (id, parent, timestamp) without adding it.

        The runtime journals a commit's entry id before appending it (D24), so building and
        adding are separate steps. The entry's parent is the leaf at build time.

        A compaction at the leaf carries the system checkpoint pi 1.x writes: every system
        message of the context replayed into one (``systemMessage``, stamped with the entry's
        time). Without it, pi would resume the compacted session with no system prompt.
        """
        now_ms = self._clock()
        if kind == COMPACTION and parent_id is LEAF and "systemMessage" not in fields:
            checkpoint = self._system_checkpoint()
            if checkpoint is not None:
                fields = {**fields, "systemMessage": {**checkpoint, "timestamp": now_ms}}
        return self.tree.new_entry(
            kind, fields, now_ms=now_ms, random_hex=self._random_hex, parent_id=parent_id
        )

    def _system_checkpoint(self) -> Message | None:
        """The replay of the leaf context's system messages (pi's ``getCurrentSystemMessage``)."""
        context = self.context()
        if context.index is None or not context.index.system:
            return None
        return current_system_message(context.messages[k] for k in context.index.system)

    def tail(self) -> Tail:
        """Where the store ended when this session last read or wrote it (D27).

        Pass it as ``expect`` to a commit planned from the current state: the commit is then
        refused with :class:`~orchestrator._core.errors.ConflictError`, writing nothing, when
        another program changed the store in between.
        """
        return self._tail

    def add_entry(self, entry: Entry, *, expect: Tail | None = None) -> Entry:
        """Append an entry built by :meth:`new_entry`; it becomes the leaf.

        Args:
            entry: The entry.
            expect: Write only if the store still ends here (D27), usually the
                :meth:`tail` taken when the operation planned.

        Raises:
            ConflictError: the store no longer ends at ``expect``; nothing was written and the
                session in memory is unchanged.
            SessionError: the id is already used.
        """
        self._add(entry, expect)
        return entry

    def append_entry(
        self,
        kind: str,
        fields: dict[str, Any],
        *,
        parent_id: object = LEAF,
        expect: Tail | None = None,
    ) -> Entry:
        """Append an entry of any type as a child of the leaf (or of ``parent_id``).

        Args:
            kind: The entry ``type``.
            fields: The type's own fields.
            parent_id: The parent (default: the leaf; ``None``: a new root).
            expect: Write only if the store still ends here (D27); see :meth:`add_entry`.

        Returns:
            The entry as written.
        """
        return self.add_entry(self.new_entry(kind, fields, parent_id=parent_id), expect=expect)

    def _add(self, entry: Entry, expect: Tail | None) -> None:
        self.check_new(entry)
        # Write first: a refused conditional write must leave the tree as it was.
        self._persist(entry, expect)
        self.adopt(entry)

    def known_refusal(self) -> str | None:
        """Why a write to the store would be refused, when reading it already told (or ``None``).

        Asked before a compaction or a branch summary calls its model: a write that cannot
        happen must not be paid for first.
        """
        probe = getattr(self.store, "known_refusal", None)
        return probe() if probe is not None else None

    @property
    def persisted(self) -> bool:
        """Whether the store holds this session's header (else nothing was written yet)."""
        return self._persisted

    @property
    def ready_to_write(self) -> bool:
        """Whether a write needs no opening first, or must not be prepared for.

        True when the store is open for writing (or has no such notion), and for a reader: a
        session opened without an owner takes the writer lock at its first write, not before
        (a dry run never writes, and must work while another process owns the file, D27).
        """
        if not getattr(self.store, "owned", False):
            return True
        if not self._persisted:
            # Nothing stored yet: the first write stores the header and every entry at once
            # (a rewrite, pi's deferred write), so there is nothing to open before it. Opening
            # the file for appending here would create it empty: a session opened and closed
            # without a write (a server started on a mistyped name) left a 0-byte file behind.
            return True
        return bool(getattr(self.store, "writer_open", True))

    def open_writer(self) -> None:
        """Open the store for writing now, when it opens at its first write (a file does).

        Raises:
            SessionLockedError: another process writes the store.
            SessionError: the store cannot be opened for writing.
        """
        opener = getattr(self.store, "open_writer", None)
        if opener is not None:
            opener()

    # The three halves of add_entry, for a caller that writes in a worker thread: check and
    # adopt touch the tree and the context (the event loop's), write_entry only the store.

    def check_new(self, entry: Entry) -> None:
        """Refuse an entry whose id the session already holds (nothing is written).

        Raises:
            SessionError: the id is already used.
        """
        if entry.get("id") in self.tree.by_id:
            raise SessionError(f"Entry id {entry.get('id')} is already in the session")

    def write_entry(self, entry: Entry, *, expect: Tail | None = None) -> None:
        """Write an entry checked by :meth:`check_new` to the store and make it durable.

        Only the store and the tail change: run it in a worker thread while nothing else writes
        this session, then :meth:`adopt` the entry on the thread that owns the session.

        Raises:
            ConflictError: the store no longer ends at ``expect``; nothing was written.
            SessionError: the store refused the write.
            OSError: the disk failed.
        """
        self._persist(entry, expect)
        self.flush()

    def adopt(self, entry: Entry) -> None:
        """Make an entry the store holds the leaf, in the tree and the live context."""
        follows_builder = (
            self._builder is not None
            and self._builder_leaf == self.tree.leaf_id
            and entry.get("parentId") == self.tree.leaf_id
        )
        self.tree.append(entry)
        if follows_builder and self._builder is not None:
            self._builder.push(entry)
            self._builder_leaf = entry["id"]

    def _persist(self, entry: Entry, expect: Tail | None) -> None:
        if self._migration_pending:
            self._tail = self.store.rewrite(self.header, [*self.tree.entries, entry], expect=expect)
            self._migration_pending = False
        elif self._persisted:
            self._tail = self.store.append([entry], expect=expect)
        elif role_of(entry) == "assistant":
            self._tail = self.store.rewrite(self.header, [*self.tree.entries, entry], expect=expect)
            self._persisted = True
        elif expect is not None:  # nothing written yet (pi's deferred write): still the rule
            check_tail(self.store.location, expect, self.store.tail())

    def flush(self) -> None:
        """Write everything now, even without an assistant message, and make it durable."""
        if not self._persisted:
            self._tail = self.store.rewrite(self.header, self.tree.entries)
            self._persisted = True
        self.store.sync()

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

    def branch(self, entry_id: str) -> None:
        """Move the leaf to ``entry_id``. Raises ``SessionError`` when unknown."""
        self.tree.branch(entry_id)

    def reset_leaf(self) -> None:
        """Move the leaf before the first entry: the next append starts a new root."""
        self.tree.reset_leaf()

    # -- rewriting -----------------------------------------------------------------------------

    def replace_entries(self, replacements: Sequence[Entry], *, expect: Tail | None = None) -> None:
        """Swap entries for new versions (same ids and parents) and rewrite the store atomically.

        Pruning uses this (D23); the rewrite goes through a temporary file (D4).

        Args:
            replacements: The new versions.
            expect: Rewrite only if the store still ends here (D27); see :meth:`add_entry`.

        Raises:
            ConflictError: the store no longer ends at ``expect``; nothing was written and the
                session in memory is unchanged.
        """
        if self._persisted:
            by_id = {entry["id"]: entry for entry in replacements}
            for entry in replacements:
                old = self.tree.get(entry["id"])
                if old.get("parentId") != entry.get("parentId"):
                    raise SessionError(f"Entry {entry['id']}: a replacement must keep its parentId")
            entries = [by_id.get(e["id"], e) for e in self.tree.entries]
            self._tail = self.store.rewrite(self.header, entries, expect=expect)
            self._migration_pending = False
        for entry in replacements:
            self.tree.replace(entry)
        self._builder = None

    def close(self) -> None:
        """Release the store (its lock, if any)."""
        self.store.close()


def not_a_session(location: str, problems: Sequence[Problem]) -> NotASessionError:
    """The error for a store with no session header, naming what loading found."""
    details = "; ".join(str(p) for p in problems) or "no session header"
    found = list(problems) or [
        Problem(line=0, code="not_session", message="no session header (nothing but blank lines)")
    ]
    return NotASessionError(f"{location}: not a session file ({details})", found)
