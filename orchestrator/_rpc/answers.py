"""The heavy answers over one open session: ``session.context`` and ``session.tree``.

Each is prepared on the event loop (what it takes from the session: a snapshot the loop will
not change, see :mod:`orchestrator._rpc.fair`) and returns the work a thread does: build the
report and encode it in steps. An answer made from the runtime's context of the active leaf is
kept (:class:`AnswerCache`) until the session's next entry, so 64 requests for it build it once.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.tree import SessionTree
from orchestrator._rpc.work import Encoded, Stop, encode_in_steps
from orchestrator._runtime.session import AgentSession
from orchestrator._store.reports import context_report_of, iter_tree_rows

Work = Callable[[Stop], Encoded]

CONTEXT = "session.context"
TREE = "session.tree"


class AnswerCache:
    """The encoded answers of one session, each with the version of the session it is of.

    The version is the runtime's context of the active leaf (immutable, the same object until
    the next entry) and the number of entries. Without a context kept by the runtime (after the
    leaf moved without an entry), nothing is cached. It holds one encoded answer per method:
    about 100 MB for the context of 200,000 entries, until the session closes.

    Args:
        runtime: The session's runtime.
    """

    def __init__(self, runtime: AgentSession) -> None:
        self.runtime = runtime
        self.answers: dict[str, tuple[SessionContext, int, Encoded]] = {}

    def version(self) -> tuple[SessionContext, int] | None:
        """What a cached answer must have been made from to be current; ``None``: not known."""
        session = self.runtime.session
        return (session.context(), len(session.tree)) if session.context_is_live else None

    def get(self, method: str) -> Encoded | None:
        """The answer of ``method`` made from the session as it is now, if there is one."""
        kept, version = self.answers.get(method), self.version()
        if kept is None or version is None or kept[0] is not version[0] or kept[1] != version[1]:
            return None
        return kept[2]


def prepare_context(cache: AnswerCache) -> Work:
    """On the loop: the work of ``session.context`` (``orchestrator context --json``)."""
    cached = cache.get(CONTEXT)
    if cached is not None:
        return lambda stop: cached
    session = cache.runtime.session
    leaf, by_id = session.leaf_id, session.tree.by_id
    version = cache.version()
    if version is None:
        # No context kept: the thread builds one from the path, which it walks without writing.
        tree = session.tree

        def build(stop: Stop) -> Encoded:
            context = ContextBuilder(tree.path(leaf) if leaf else []).context()
            report = context_report_of(context, context.tokens(), by_id, leaf)
            return encode_in_steps(report, stop)

        return build
    context = version[0]
    tokens = context.tokens()  # here: it reads the runtime's live index

    def encode_once(stop: Stop) -> Encoded:
        answer = encode_in_steps(context_report_of(context, tokens, by_id, leaf), stop)
        cache.answers[CONTEXT] = (*version, answer)
        return answer

    return encode_once


def prepare_tree(cache: AnswerCache) -> Work:
    """On the loop: the work of ``session.tree`` (``orchestrator tree --json``)."""
    cached = cache.get(TREE)
    if cached is not None:
        return lambda stop: cached
    session = cache.runtime.session
    session_id, header = session.session_id, session.header
    entries = list(session.tree.entries)  # a copy: a turn may append meanwhile
    leaf = session.leaf_id
    version = cache.version()
    live_path = session.path() if version is not None else None  # a copy too
    walk = session.tree

    def rows(stop: Stop) -> Encoded:
        tree = SessionTree(header, entries)  # its own index: nothing shared is written
        path = live_path if live_path is not None else walk.path(leaf) if leaf else []
        answer = {
            "sessionId": session_id,
            "name": tree.session_name(),
            "leafId": leaf,
            "nodes": iter_tree_rows(tree, path, leaf),
        }
        encoded = encode_in_steps(answer, stop)
        if version is not None:
            cache.answers[TREE] = (*version, encoded)
        return encoded

    return rows
