"""What a session shows: its tree, its active leaf and the context the model sees there.

:class:`~orchestrator._store.session.Session` builds on :class:`SessionView`. The views read the
tree and keep one :class:`~orchestrator._core.context.ContextBuilder` for the active leaf, which
an append extends instead of rebuilding (:meth:`SessionWrites.adopt
<orchestrator._store.session_writes.SessionWrites.adopt>`). Nothing here touches the store, so
the views are apart from the writes (:mod:`~orchestrator._store.session_writes`).
"""

from __future__ import annotations

from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.entries import Entry, Message
from orchestrator._core.system_prompt import current_system_message
from orchestrator._core.tree import SessionTree


class SessionView:
    """The tree and the kept context of a :class:`~orchestrator._store.session.Session`.

    ``Session.__init__`` sets these attributes; this class only reads and moves them.
    """

    tree: SessionTree
    # The context builder kept for the active leaf, and the leaf it was built for.
    _builder: ContextBuilder | None
    _builder_leaf: str | None
    _keep_measured: bool

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

    def _system_checkpoint(self) -> Message | None:
        """The replay of the leaf context's system messages (pi's ``getCurrentSystemMessage``)."""
        context = self.context()
        if context.index is None or not context.index.system:
            return None
        return current_system_message(context.messages[k] for k in context.index.system)

    def branch(self, entry_id: str) -> None:
        """Move the leaf to ``entry_id``. Raises ``SessionError`` when unknown."""
        self.tree.branch(entry_id)

    def reset_leaf(self) -> None:
        """Move the leaf before the first entry: the next append starts a new root."""
        self.tree.reset_leaf()
