"""The runtime's plain records: its settings, a turn's result, and per-turn counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator._core.entries import Message
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.operations import OperationOutcome
from orchestrator._runtime.retry import RetryPolicy


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
    """

    context_window: int = 128_000
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    prune: bool = True
    branch_reserve_tokens: int = 16384
    short_summary: bool = False


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
    last_reply: Message | None = None
    last_reply_id: str | None = None
    outcome: OperationOutcome | None = None
