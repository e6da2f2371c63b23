"""How a session's entries reach its store: appends, conditional writes and rewrites.

:class:`~orchestrator._store.session.Session` builds on :class:`SessionWrites`; the typed
appends (``append_message``, ``append_compaction``...) and opening stay in its own module, the
tree and context views in :mod:`~orchestrator._store.session_view`.

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

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator._core.entries import COMPACTION, Entry, role_of
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import Problem, Tail
from orchestrator._core.tree import LEAF
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session_view import SessionView
from orchestrator._store.tail import check_tail


class SessionWrites(SessionView):
    """The store side of a :class:`~orchestrator._store.session.Session` (module docstring).

    ``Session.__init__`` sets these attributes.
    """

    store: SessionStore
    problems: list[Problem]
    _tail: Tail
    _migration_pending: bool
    _persisted: bool
    _clock: Callable[[], int]
    _random_hex: Callable[[], str]

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
