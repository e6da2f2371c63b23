"""What an agent's reply means to the turn machine, and the words of its compaction events.

Pure functions: the turn driver's ``call_agent`` effect hands the last reply of a run to
:func:`classify`, which reports the outcome (``ok``, ``overflow``, ``truncated``, ``transient``,
``fatal``) and the measurements the guards read. Whether that means prune, compact, retry or stop
is the table's choice, not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator._core.classify import (
    is_context_overflow_text,
    is_transient_text,
    retry_after_from_text,
    silent_overflow,
)
from orchestrator._core.entries import Message
from orchestrator._core.errors import MODEL_ERRORS, ContextOverflowError, TransientModelError
from orchestrator._core.model import Usage
from orchestrator._core.tokens import calculate_context_tokens, should_compact
from orchestrator._runtime.types import OperationOutcome, RuntimeSettings

OVERFLOW_FAILED = (
    "Context overflow recovery failed after one compact-and-retry attempt. "
    "Try reducing context or switching to a larger-context model."
)


def still_over(estimate: int) -> str:
    """``auto_compaction_end``'s message when a compaction left the context over the line (D19)."""
    return (
        f"Context is still over the compaction threshold after compacting "
        f"(~{estimate} tokens); not compacting again in this turn."
    )


AUTO_CONTINUE_TYPE = "auto-continue"


def failed_attempt(messages: Iterable[tuple[str, Message]], reply_id: str) -> list[str]:
    """The entries overflow recovery omits for a failed reply: the reply, then its tool results.

    Pi 1.x's ``_omitRecoveryAttempt``: the failed assistant reply and, after it up to the next
    assistant message, the tool results answering its tool calls, in that order. An unpaired
    tool result would fail the next request, so the pair goes together.

    Args:
        messages: ``(entry id, message)`` in path order; those before the reply are skipped.
        reply_id: The failed reply's entry id.

    Returns:
        The ids to omit with ``context_edit`` entries (``replacement: null``), in append order;
        empty when the reply is not among ``messages``.
    """
    targets: list[str] = []
    calls: set[object] = set()
    for entry_id, message in messages:
        role = message.get("role")
        if not targets:
            if entry_id == reply_id:
                targets.append(entry_id)
                content = message.get("content")
                blocks = content if isinstance(content, list) else []
                calls = {
                    b.get("id")
                    for b in blocks
                    if isinstance(b, Mapping) and b.get("type") == "toolCall"
                }
            continue
        if role == "assistant":
            break
        if role == "toolResult" and message.get("toolCallId") in calls:
            targets.append(entry_id)
    return targets


def _named_outcome(kind: object) -> str | None:
    """The turn's outcome for a ModelError's kind as recorded on a failed reply (``errorKind``).

    Its class decides: a :class:`ModelTimeoutError` is a :class:`TransientModelError`, as in
    the operation table. Other kinds, and a word we do not know (the field is in a session file
    anyone may have written, so it is not refused), are judged by the text.
    """
    named = MODEL_ERRORS.get(kind) if isinstance(kind, str) else None
    if named is not None and issubclass(named, ContextOverflowError):
        return "overflow"
    if named is not None and issubclass(named, TransientModelError):
        return "transient"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """How a run of the agent ended.

    Attributes:
        outcome: ``ok``, ``overflow``, ``truncated``, ``transient`` or ``fatal``.
        error: The failure as one line (``""`` when there is none).
        over_threshold: The context is over the compaction threshold after the reply.
        context_full: A reply cut off by the length limit came back with the context full.
    """

    outcome: str
    error: str = ""
    over_threshold: bool = False
    context_full: bool = False

    def fields(self) -> dict[str, Any]:
        """The verdict as keyword arguments (a record that carries it across a wire)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def classify(reply: Message | None, settings: RuntimeSettings, *, stale: bool) -> Verdict:
    """Name what the last assistant reply of an agent run means.

    Args:
        reply: The last assistant message (``None``: the agent replied nothing).
        settings: The context window and compaction settings.
        stale: The reply is older than the latest compaction (its usage measured a context that
            no longer exists).

    Returns:
        The outcome and what the guards read.
    """
    if reply is None:
        return Verdict(outcome="ok")
    stop = reply.get("stopReason")
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    window = settings.context_window
    if stop == "error":
        error = str(reply.get("errorMessage") or "Unknown error")
        # The route's own verdict (ChatAgent keeps a ModelError's kind) wins over the text: a
        # provider class or status may say overflow or transient where the words do not. "fatal"
        # is also ModelError's default, so then the text still gets its say (pi's messages have
        # no kind at all).
        named = _named_outcome(reply.get("errorKind"))
        if named is not None:
            return Verdict(outcome=named, error=error)
        if is_context_overflow_text(error):
            return Verdict(outcome="overflow", error=error)
        if is_transient_text(error):
            return Verdict(outcome="transient", error=error)
        return Verdict(outcome="fatal", error=error)
    if usage and silent_overflow(_usage(usage), window, str(stop)):
        error = "context overflow (usage exceeds the context window)"
        return Verdict(outcome="overflow", error=error)
    tokens = calculate_context_tokens(usage) if usage else 0
    over = not stale and should_compact(tokens, window, settings.compaction)
    if stop == "length":
        error = "reply stopped by the length limit with the context full"
        return Verdict(
            outcome="truncated",
            error=error,
            over_threshold=over,
            context_full=over,
        )
    return Verdict(outcome="ok", over_threshold=over)


def retry_after_hint_ms(reply: Mapping[str, Any] | None) -> int | None:
    """The provider's retry-after hint a failed reply kept (``retryAfterMs``), if it is one."""
    hint = reply.get("retryAfterMs") if reply is not None else None
    return hint if type(hint) is int and hint > 0 else None


def retry_hint_s(error: str, hint_ms: int | None = None) -> float | None:
    """The longest retry-after hint of a failed reply, in seconds, if it has one.

    The hint is the one in the error's words (as pi reads it) or the provider's header the
    route kept on the failed reply (``hint_ms``, its ``retryAfterMs``), whichever is longer.
    The wait itself is :func:`~orchestrator._runtime.delays.retry_delay_ms`, one function for
    the agent's retries and the summarizer's (D21).
    """
    hints = [h for h in (retry_after_from_text(error), hint_ms and hint_ms / 1000) if h]
    return max(hints) if hints else None


def end_payload(outcome: OperationOutcome | None) -> dict[str, Any]:
    """The ``auto_compaction_end`` fields every ending shares."""
    result = None
    if outcome is not None and outcome.result is not None:
        result = {
            "summary": outcome.result.summary,
            "firstKeptEntryId": outcome.result.first_kept_entry_id,
            "tokensBefore": outcome.result.tokens_before,
            "details": outcome.result.details,
        }
    return {"result": result, "aborted": False, "willRetry": False}


def outcome_error(outcome: OperationOutcome | None) -> str:
    """The failed compaction's error as one line."""
    return outcome.error if outcome is not None and outcome.error else "compaction failed"


def _usage(usage: Mapping[str, Any]) -> Usage:
    return Usage(
        input=int(usage.get("input") or 0),
        output=int(usage.get("output") or 0),
        cache_read=int(usage.get("cacheRead") or 0),
        cache_write=int(usage.get("cacheWrite") or 0),
    )
