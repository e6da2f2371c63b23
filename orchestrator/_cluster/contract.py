"""What the session workflow and its clients exchange (issue 10).

Theory of operation. Everything that crosses a Temporal boundary is one of these plain records:
the workflow's input, an update's argument and answer, an activity's argument and report. They
hold only JSON values (Temporal's default converter serialises dataclasses as objects), are
recorded in the workflow's history, and must stay small: a session's entries never travel
through the workflow.

This module holds the client's side: the workflow's input, each update's argument and answer,
and the error types a request fails with. What the workflow and its activities exchange is
:mod:`~orchestrator._cluster.calls`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.errors import OrchestratorError
from orchestrator._lifecycle.names import OperationState

TASK_QUEUE = "orchestrator-sessions"
"""The task queue every worker polls and every client starts session workflows on."""
WORKFLOW_NAME = "session"
"""The workflow type; its id is the session id, so the fleet has one owner per session."""
BUSY_TYPE = "Busy"
"""The error type of a request the session machine refused (``BusyError``, ``-32001``)."""
HISTORY_BOUND = 5000
"""History events after which a session workflow continues as new (when idle between requests)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStart:
    """The session workflow's input.

    Attributes:
        session_id: The session (also the workflow id).
        idle_s: The workflow completes after this long without work; the next request starts
            a new run with the same id (nothing is lost: the session lives in the store).
        history_bound: Past this many history events (or when Temporal suggests it), the
            workflow continues as new once no request is in progress, so a busy session's
            history stays bounded.
    """

    session_id: str
    idle_s: float = 300.0
    history_bound: int = HISTORY_BOUND


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressRequest:
    """``session.compress``'s argument.

    Attributes:
        focus: The user's instructions ("Additional focus").
        reason: ``manual`` (the command) or ``threshold`` / ``overflow``.
    """

    focus: str | None = None
    reason: str = "manual"


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressResult:
    """How a compaction ended, for the client.

    Attributes:
        operation_id: The journal's id for it.
        status: ``committed``, ``skipped``, ``cancelled``, ``failed`` or ``conflict``.
        reason: Why it was skipped or cancelled.
        error: The failure as one line.
        error_kind: The model failure's kind, when one ended it.
        entry_id: The committed entry.
        summary: The committed summary.
        tokens_before: Context tokens before compacting.
        first_kept_entry_id: Where the kept region starts.
        short_summary: The short summary, when one was asked for.
        tokens_saved: Context tokens a prune saved.
        details: The committed entry's file lists (``readFiles``, ``modifiedFiles``).
        from_extension: A hook supplied the committed summary.
        estimate_after: The context's estimated tokens right after the commit (D19's check).
        compact_failed: The ``session_compact_failed`` event's payload, when it ended so.
        events: The ``session.event`` events of the request, numbered (``{"seq", "event"}``).
        events_run: The workflow run that numbered them.
    """

    operation_id: str
    status: OperationState
    reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    entry_id: str | None = None
    summary: str | None = None
    tokens_before: int | None = None
    first_kept_entry_id: str | None = None
    short_summary: str | None = None
    tokens_saved: int = 0
    details: dict[str, Any] | None = None
    from_extension: bool = False
    estimate_after: int | None = None
    compact_failed: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    events_run: str = ""


NO_AGENT = "session.prompt: no agent configured (start the server with --model)"
"""The refusal of a prompt to a worker without an agent (the one-process server's words)."""
NO_AGENT_TYPE = "NoAgent"
"""The error type of a prompt to a worker without an agent (``-32601`` on the wire)."""
UNAVAILABLE = "Unavailable"
"""The error type of a request the cluster could not carry out: an activity failed for good for
a reason no parameter explains (its worker lost, the store unreachable, after the retries);
``-32008`` on the wire. The work stopped where it was and the session is idle again."""
UNAVAILABLE_KIND = "unavailable"
"""A :class:`CompressResult`'s ``error_kind`` when the cluster could not carry it out."""
AGENT_RAISED = "AgentRaised"
"""The error type of a prompt whose agent raised (a bug; ``-32603`` on the wire, as one process
answers). Its details are the exception's type name."""


class AgentRaisedError(OrchestratorError):
    """A worker's agent raised during a turn (a bug in the agent, not a provider's failure).

    Args:
        kind: The exception's type name.
        message: Its message.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptRequest:
    """``session.prompt``'s argument.

    Attributes:
        text: The user's message.
    """

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptResult:
    """How a prompt ended, for the client (the one-process server's answer).

    Attributes:
        state: The turn machine's state afterwards.
        reply: The turn's last assistant message, if any.
        queued: The prompt was queued behind the work in progress.
        events: The ``session.event`` events of the turn, numbered (``{"seq", "event"}``).
        events_run: The workflow run that numbered them.
    """

    state: str
    reply: dict[str, Any] | None = None
    queued: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    events_run: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigateRequest:
    """``session.tree.navigate``'s argument.

    Attributes:
        target_id: The entry to navigate to.
        summarize: Summarize the branch being left (D17).
        instructions: Custom instructions for the summary (``focus``).
        replace_instructions: ``instructions`` replace the default prompt.
        label: A label for the summary entry (or the target).
    """

    target_id: str
    summarize: bool = False
    instructions: str | None = None
    replace_instructions: bool = False
    label: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigateResult:
    """How a navigation ended, for the client (``NavigationResult``'s fields, and why not).

    Attributes:
        navigation_id: The journal's id for it.
        status: The navigation machine's final state: ``done``, ``cancelled``, ``failed`` or
            ``refused``.
        aborted: The branch summary was aborted.
        editor_text: Text for the editor.
        new_leaf_id: The leaf afterwards.
        old_leaf_id: The leaf before.
        summary_entry_id: The attached branch summary, if any.
        short_summary: Its short summary.
        error: The summary's failure, as one line.
        error_kind: The model failure's kind; ``conflict`` when another writer came first.
    """

    navigation_id: str
    status: str
    aborted: bool = False
    editor_text: str | None = None
    new_leaf_id: str | None = None
    old_leaf_id: str | None = None
    summary_entry_id: str | None = None
    short_summary: str | None = None
    error: str | None = None
    error_kind: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkRequest:
    """``session.fork``'s argument.

    Attributes:
        entry_id: The user message to fork before.
        new_session_id: The new session's id (``None``: the workflow picks a fresh one).
    """

    entry_id: str
    new_session_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkDone:
    """How a fork ended.

    Attributes:
        cancelled: A ``session_before_fork`` hook cancelled it.
        session_id: The new session (``None`` when cancelled).
        editor_text: The forked user message's text.
    """

    cancelled: bool
    session_id: str | None
    editor_text: str
