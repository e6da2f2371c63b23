"""The runtime's plain records: settings, an operation's outcome, a turn's result, counters.

A leaf module: it imports records from below and nothing from the drivers, so every driver and
surface can name these types without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.entries import Entry, Message
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.names import OperationState
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.summarize import CompactionResult
from orchestrator._store.session import Session


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSettings:
    """Settings of an agent session.

    Attributes:
        context_window: The chat model's window in tokens.
        compaction: Compaction settings (threshold, keep, auto-continue).
        retry: Agent retry policy for transient errors (pi ``retry.*``).
        prune: Prune old tool outputs before a threshold compaction (D23).
        branch_reserve_tokens: Reserve for branch summaries (budget = window - reserve).
        short_summary: Also write a one-or-two sentence ``shortSummary`` on every compaction
            and branch summary (shown by ``tree``, ``context``, the TUI and the results).
        model_idle_timeout_s: A summary call to a route that streams (litellm's) fails as a
            ``timeout`` when nothing arrives for this many seconds: a provider that says
            nothing is noticed in a minute, while one that keeps streaming for minutes is not
            cut (``None``: the route's own, ``LiteLLMModel(timeout=...)``, 120 s).
        model_timeout_s: A summary call to a route that answers in one piece (the remote
            endpoint, a model of your own) that has not answered after this many seconds fails
            as a ``timeout``; silence and work look alike there (``None``: no limit).
        operation_deadline_s: A compaction or branch summary that has not finished after this
            many seconds, waits and retries included, ends as failed (``None``: no limit).
            It also bounds a ``session_before_tree`` hook's answer.
    """

    context_window: int = 128_000
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    prune: bool = True
    branch_reserve_tokens: int = 16384
    short_summary: bool = False
    model_idle_timeout_s: float | None = 60.0
    model_timeout_s: float | None = 120.0
    operation_deadline_s: float | None = 900.0


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationOutcome:
    """How an operation ended.

    Attributes:
        operation_id: The journal's id for it.
        status: ``committed``, ``skipped``, ``cancelled``, ``failed`` or ``conflict``.
        reason: Why it was skipped (D12) or cancelled by a hook.
        error: The failure as one line.
        error_kind: The ``kind`` of the last model failure's class (``transient``, ``overflow``,
            ``fatal``, ``empty``, ``truncated``, ``timeout``, ``refused``), when a model failure
            ended it; :func:`~orchestrator._core.errors.model_error` rebuilds the class.
        retry_after: The provider's retry-after hint of that failure, in seconds.
        cause: What made the commit fail (an ``OSError`` of the disk: full, a descriptor
            shortage), when that ended it; a surface tells the server's limit from a failure.
        entry: The committed entry (compaction or branch summary); on a dry run, the entry
            that would have been appended.
        result: The compaction result, when there is one.
        plan: The compaction plan, when there is one.
        tokens_saved: Tokens a prune saved in the live context.
        from_extension: A hook supplied the summary.
        dry_run: Nothing was written; ``entry`` shows what would have been.
    """

    operation_id: str
    status: OperationState
    reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    retry_after: float | None = None
    cause: BaseException | None = field(default=None, compare=False, repr=False)
    entry: Entry | None = None
    result: CompactionResult | None = None
    plan: CompactionPlan | None = None
    tokens_saved: int = 0
    from_extension: bool = False
    dry_run: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnResult:
    """What :meth:`AgentSession.prompt` returns.

    Attributes:
        queued: The prompt was queued behind a running turn.
        reply: The last assistant message of the turn, if any.
        state: The turn machine's state afterwards.
    """

    queued: bool = False
    reply: Message | None = None
    state: str = "idle"


@dataclass(slots=True)
class TurnCounters:
    """Per-user-turn counters and measurements (reset by ``start_turn``)."""

    overflow_attempted: bool = False
    auto_compactions: int = 0
    retry_attempt: int = 0
    will_retry: bool = False
    over_threshold: bool = False
    context_full: bool = False
    last_error: str = ""
    last_retry_after_ms: int | None = None  # the failed reply's retryAfterMs, if it had one
    last_reply: Message | None = None
    last_reply_id: str | None = None
    outcome: OperationOutcome | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigationResult:
    """What :meth:`AgentSession.navigate` did (pi's ``navigateTree`` result).

    Attributes:
        cancelled: A hook cancelled, or the summary was aborted.
        aborted: The branch summary was aborted (``abort_branch_summary``).
        editor_text: Text for the editor (the selected user message), else ``None``.
        new_leaf_id: The leaf afterwards.
        old_leaf_id: The leaf before.
        summary_entry: The attached branch summary, if any.
    """

    cancelled: bool = False
    aborted: bool = False
    editor_text: str | None = None
    new_leaf_id: str | None = None
    old_leaf_id: str | None = None
    summary_entry: Entry | None = None

    def as_json(self) -> dict[str, Any]:
        """The RPC form."""
        return {
            "cancelled": self.cancelled,
            "aborted": self.aborted,
            "editorText": self.editor_text,
            "newLeafId": self.new_leaf_id,
            "oldLeafId": self.old_leaf_id,
            "summaryEntryId": self.summary_entry["id"] if self.summary_entry else None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkResult:
    """What :meth:`AgentSession.fork` did.

    Attributes:
        cancelled: A ``session_before_fork`` hook cancelled it.
        session: The new session (``None`` when cancelled).
        editor_text: The forked user message's text, for the editor.
    """

    cancelled: bool = False
    session: Session | None = None
    editor_text: str = ""
