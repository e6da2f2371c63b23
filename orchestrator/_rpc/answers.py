"""The heavy answers over one open session: ``session.context`` and ``session.tree``.

Each is prepared on the event loop (what it takes from the session: a snapshot the loop will
not change, see :mod:`orchestrator._rpc.fair`) and returns the generator of its pieces, which
builds the report and encodes it a step at a time as the connection writes it: the answer is
never whole in the server's memory. An answer of at most :data:`KEPT_BYTES`, made from the
runtime's context of the active leaf, is kept (:class:`AnswerCache`) until the session's next
entry, so 64 requests for it encode it once; a larger one is encoded again for each request.
"""

from __future__ import annotations

import weakref

from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.entries import Entry
from orchestrator._core.tree import SessionTree
from orchestrator._rpc.work import Encoded, Pieces, pieces_of
from orchestrator._runtime.session import AgentSession
from orchestrator._store.reports import context_report_of, iter_tree_rows

Prepared = Encoded | Pieces
"""An answer kept for the session, or the pieces of one to encode as it is written."""

CONTEXT = "session.context"
TREE = "session.tree"
KEPT_BYTES = 8 * 1024 * 1024
"""Largest encoded answer kept with its session (per method). A larger one is never kept:
kept whole, the context of 200,000 entries held 100 MB for as long as the session was open."""

Version = tuple[SessionContext, int]


class AnswerCache:
    """The small encoded answers of one session, each with the version of the session it is of.

    The version is the runtime's context of the active leaf (immutable, the same object until
    the next entry) and the number of entries. Without a context kept by the runtime (after the
    leaf moved without an entry), nothing is cached. It holds one encoded answer per method, of
    at most :data:`KEPT_BYTES`; while one is being made, one stream at a time per method also
    holds what it has encoded so far (at most that much too).

    Args:
        runtime: The session's runtime.

    Attributes:
        answers: Method to the version it was made from and the answer.
        too_large: Method to the version whose answer was over the bound (not kept again).
    """

    def __init__(self, runtime: AgentSession) -> None:
        self.runtime = runtime
        self.answers: dict[str, tuple[SessionContext, int, Encoded]] = {}
        self.too_large: dict[str, Version] = {}
        self._filling: dict[str, object] = {}
        self._snapshot: tuple[Version, weakref.ref[TreeSnapshot]] | None = None

    def version(self) -> Version | None:
        """What a cached answer must have been made from to be current; ``None``: not known."""
        session = self.runtime.session
        return (session.context(), len(session.tree)) if session.context_is_live else None

    def get(self, method: str) -> Encoded | None:
        """The answer of ``method`` made from the session as it is now, if there is one."""
        kept, version = self.answers.get(method), self.version()
        if kept is None or version is None or kept[0] is not version[0] or kept[1] != version[1]:
            return None
        return kept[2]

    def tree_snapshot(self, version: Version | None) -> TreeSnapshot:
        """On the loop: the copies a tree answer of the session as it is now reads."""
        kept = self._snapshot
        if kept is not None and version is not None and _same(kept[0], version):
            snapshot = kept[1]()
            if snapshot is not None:
                return snapshot
        session = self.runtime.session
        live_path = session.path() if version is not None else None
        snapshot = TreeSnapshot(list(session.tree.entries), live_path)
        self._snapshot = (version, weakref.ref(snapshot)) if version is not None else None
        return snapshot

    def keeping(self, method: str, version: Version | None, pieces: Pieces) -> Prepared:
        """``pieces`` as they are made, kept as the answer of ``version`` when they are small.

        Not kept when there is no version, when that version's answer was already found too
        large, or while another stream of ``method`` is keeping what it makes.
        """
        if version is None or _same(self.too_large.get(method), version):
            return pieces
        return self._keep(method, version, pieces)

    def _keep(self, method: str, version: Version, pieces: Pieces) -> Pieces:
        mine = object()
        # setdefault is atomic: two threads starting at once cannot both take the place.
        held: list[bytes] | None = [] if self._filling.setdefault(method, mine) is mine else None
        size = 0
        try:
            for piece in pieces:
                size += len(piece)
                if held is not None and size <= KEPT_BYTES:
                    held.append(piece)
                elif held is not None:
                    held = None
                    self.too_large[method] = version
                yield piece
            if held is not None:
                self.answers[method] = (*version, Encoded(tuple(held)))
        finally:
            if self._filling.get(method) is mine:
                del self._filling[method]


class TreeSnapshot:
    """What a tree answer copies of the session on the loop: its entries, its active path.

    Shared by the answers of one version waiting in a batch (64 of them held 64 copies, 3 MB
    each at 200,000 entries), and freed with the last of them (the cache keeps a weak
    reference).

    Attributes:
        entries: A copy of the session's entries (a turn may append meanwhile).
        path: A copy of the active path; ``None`` when the runtime keeps no context (the
            thread walks the tree then).
    """

    __slots__ = ("__weakref__", "entries", "path")

    def __init__(self, entries: list[Entry], path: list[Entry] | None) -> None:
        self.entries = entries
        self.path = path


def _same(one: Version | None, other: Version) -> bool:
    return one is not None and one[0] is other[0] and one[1] == other[1]


def prepare_context(cache: AnswerCache) -> Prepared:
    """On the loop: the answer of ``session.context`` (``orchestrator context --json``)."""
    cached = cache.get(CONTEXT)
    if cached is not None:
        return cached
    session = cache.runtime.session
    leaf, by_id = session.leaf_id, session.tree.by_id
    version = cache.version()
    if version is None:
        # No context kept: the thread builds one from the path, which it walks without writing.
        tree = session.tree

        def build() -> Pieces:
            context = ContextBuilder(tree.path(leaf) if leaf else []).context()
            yield from pieces_of(context_report_of(context, context.tokens(), by_id, leaf))

        return build()
    context = version[0]
    tokens = context.tokens()  # here: it reads the runtime's live index

    def encode() -> Pieces:
        yield from pieces_of(context_report_of(context, tokens, by_id, leaf))

    return cache.keeping(CONTEXT, version, encode())


def prepare_tree(cache: AnswerCache) -> Prepared:
    """On the loop: the answer of ``session.tree`` (``orchestrator tree --json``)."""
    cached = cache.get(TREE)
    if cached is not None:
        return cached
    session = cache.runtime.session
    session_id, header = session.session_id, session.header
    leaf = session.leaf_id
    version = cache.version()
    snapshot = cache.tree_snapshot(version)
    walk = session.tree

    def rows() -> Pieces:
        tree = SessionTree(header, snapshot.entries)  # its own index: nothing shared is written
        live_path = snapshot.path
        path = live_path if live_path is not None else walk.path(leaf) if leaf else []
        answer = {
            "sessionId": session_id,
            "name": tree.session_name(),
            "leafId": leaf,
            "nodes": iter_tree_rows(tree, path, leaf),
        }
        yield from pieces_of(answer)

    return cache.keeping(TREE, version, rows())
