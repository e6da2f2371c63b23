"""What the JSON-RPC hub needs of a place that runs sessions: the :class:`SessionHost` protocol.

Two hosts implement it: :class:`~orchestrator._rpc.local_host.LocalHost` (the sessions of this
process, one :class:`~orchestrator._runtime.session.AgentSession` each) and
:class:`~orchestrator._rpc.cluster_hub.ClusterHost` (session workflows reached through the
cluster client, read from the shared store). The hub (:mod:`~orchestrator._rpc.hub`) writes the
eleven ``session.*`` methods once over either: it checks the parameters, asks the host, follows the
sessions a connection opened and shapes the answers. A host refuses by raising from the one error
hierarchy (a :class:`~orchestrator._core.errors.BusyError` when the session machine refuses, a
:class:`~orchestrator._core.errors.NoAgentError` without an agent), and the dispatcher maps the
type to a code, never the words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator._rpc.errors import INVALID_PARAMS, RpcError
from orchestrator._rpc.fair import Fairness
from orchestrator._rpc.protocol import Method, Params, Peer


@dataclass(frozen=True, slots=True, kw_only=True)
class Described:
    """What ``session.open``, ``session.list`` and ``session.fork`` say of a session."""

    session_id: str
    path: str
    entries: int
    leaf_id: str | None
    state: str
    busy: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "path": self.path,
            "entries": self.entries,
            "leafId": self.leaf_id,
            "state": self.state,
            "busy": self.busy,
        }


@dataclass(frozen=True, slots=True)
class Opened:
    """An open session: its description, what loading found, what reopening settled."""

    described: Described
    problems: list[dict[str, Any]] = field(default_factory=list)
    settled: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Forked:
    """A fork's outcome: the new session (``None`` when a hook cancelled it) and the editor text."""

    described: Described | None
    editor_text: str | None


@dataclass(frozen=True, slots=True)
class Prompted:
    """A turn's end (or its place in the queue)."""

    state: str
    reply: Mapping[str, Any] | None
    queued: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted:
    """A committed compaction, as ``session.compress`` answers it."""

    entry_id: str | None
    summary: str | None
    tokens_before: int | None
    first_kept_entry_id: str | None
    short_summary: str | None

    @classmethod
    def of(cls, committed: Any) -> Compacted:
        """The fields of the same names read from ``committed`` (a workflow's result)."""
        return cls(**{name: getattr(committed, name) for name in cls.__dataclass_fields__})


def compress_answer(done: Compacted | str) -> dict[str, Any]:
    """``session.compress``'s answer: the committed entry, or why nothing was committed."""
    if not isinstance(done, Compacted):
        return {"compacted": False, "reason": done}
    return {
        "compacted": True,
        "entryId": done.entry_id,
        "summary": done.summary,
        "tokensBefore": done.tokens_before,
        "firstKeptEntryId": done.first_kept_entry_id,
        "shortSummary": done.short_summary,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Navigation:
    """``session.tree.navigate``'s parameters, checked."""

    target_id: str
    summarize: bool
    instructions: str | None
    replace_instructions: bool
    label: str | None


def navigation_options(p: Params) -> Navigation:
    """``session.tree.navigate``'s parameters.

    Raises:
        RpcError: Instructions without a summary, or a replacement without instructions
            (``-32602``): they would be dropped without a word, as the command line refuses
            ``--focus`` without ``--summarize``.
    """
    summarize, focus = p.flag("summarize"), p.optional_text("focus")
    replace = p.flag("replace_instructions")
    if (focus is not None or replace) and not summarize:
        raise RpcError(
            INVALID_PARAMS,
            "session.tree.navigate: 'focus' and 'replace_instructions' shape the branch "
            'summary; add "summarize": true',
        )
    if replace and focus is None:
        raise RpcError(
            INVALID_PARAMS,
            "session.tree.navigate: 'replace_instructions' needs 'focus' (the prompt to use "
            "instead)",
        )
    return Navigation(
        target_id=p.text("target_id"),
        summarize=summarize,
        instructions=focus,
        replace_instructions=replace,
        label=p.optional_text("label"),
    )


class Outlet(Protocol):
    """What a host tells the hub: events to forward, sessions that ended, the shared bounds."""

    fair: Fairness

    def listened(self, session_id: str) -> bool:
        """Whether any listener receives this session's events."""

    def tell(self, session_id: str, event: Mapping[str, Any]) -> None:
        """Forward one event of the session as ``session.event``."""

    def ended(self, session_id: str) -> None:
        """Tell its listeners the session closed; send no more."""


class Attached:
    """A host's link to its hub, made once by :meth:`attach` before any request."""

    _outlet: Outlet | None = None

    def attach(self, outlet: Outlet) -> None:
        """Send events and endings to ``outlet`` (the hub)."""
        self._outlet = outlet

    @property
    def outlet(self) -> Outlet:
        """The hub this host tells (``RuntimeError`` before :meth:`attach`)."""
        if self._outlet is None:
            raise RuntimeError(f"{type(self).__name__}: attach() it to a hub first")
        return self._outlet


class SessionHost(Protocol):
    """Where the sessions run: this process, or the cluster."""

    def attach(self, outlet: Outlet) -> None:
        """Send events and endings to ``outlet`` (the hub, once, before any request)."""

    def session_ids(self) -> set[str]:
        """The sessions open here."""

    async def open(self, path: str, *, create: bool, peer: Peer | None) -> Opened:
        """Open (or create) the session ``path`` names."""

    async def sessions(self) -> list[Described]:
        """The open sessions."""

    async def close(self, session_id: str) -> None:
        """Close a session (``BusyError`` while anything runs there)."""

    async def compress(
        self, session_id: str, focus: str | None, *, operation_id: str | None = None
    ) -> Compacted | str:
        """Compact now: the entry committed, or why nothing was (``operation_id``: its id)."""

    async def tree(self, session_id: str, peer: Peer | None) -> Any:
        """``session.tree``'s answer."""

    async def context(self, session_id: str, peer: Peer | None) -> Any:
        """``session.context``'s answer."""

    async def navigate(
        self, session_id: str, request: Navigation, *, operation_id: str | None = None
    ) -> dict[str, Any]:
        """Move the leaf; ``session.tree.navigate``'s answer (``operation_id``: its id)."""

    async def recall(
        self, session_id: str, operation_id: str, method: str | None
    ) -> dict[str, Any] | None:
        """``session.operation``'s answer for an operation the hub's book does not settle.

        ``method`` is the one that asked for it, when the book knows. ``None``: nothing here
        knows more than the book (one process: the book is all there is).
        """

    async def fork(self, session_id: str, entry_id: str, path: str | None) -> Forked:
        """Fork before a user message into a new session, open here once made."""

    async def prompt(self, session_id: str, text: str) -> Prompted:
        """Run a turn (``NoAgentError`` without an agent)."""

    async def abort(self, session_id: str) -> bool:
        """Stop what runs in the session; whether anything did."""

    def more_methods(self) -> dict[str, Method]:
        """Methods beyond the eleven (pi's ``summary.*``, or their refusals)."""

    def shutdown_error(self) -> RpcError:
        """The answer to each request still running when the server stops."""

    def abort_all(self) -> None:
        """Stop the work running in every session (shutdown)."""

    def close_all(self) -> None:
        """Close (or forget) every session."""
