"""Retry settings, attempt records and the summary check (D15, D21).

Every adapter makes exactly one HTTP attempt; the operation machine (``machines/operation.toml``)
owns the rest: for each candidate model a ``transient`` failure is retried up to ``max_retries``
times, waiting ``base_delay_ms * 2**n`` (2 s, 4 s, 8 s by default, from
:mod:`orchestrator._runtime.delays`) or the provider's retry-after hint when that is longer; a wait
over ``switch_after_ms`` (30 s) moves on to the next candidate; on the last candidate a wait up to
``max_delay_ms`` (60 s) is still made; an ``overflow`` halves the request instead (D14); any other
failure (``fatal``, and D15's ``empty`` / ``truncated`` summaries) moves on to the next
candidate. This module holds the settings, the record each attempt is reported as, and the check
that turns an unusable reply into a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from orchestrator._core.errors import (
    EmptyReplyError,
    FatalModelError,
    ModelError,
    TruncatedReplyError,
)
from orchestrator._core.model import ModelResponse
from orchestrator._core.utf16 import utf16_len

Outcome = Literal["ok", "retry", "next_candidate", "failed"]
"""What followed an attempt: success, a wait then a retry, a switch of candidate, or the end."""

NO_MODEL = "Compaction failed: no available model"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retry settings (pi's ``retry.*`` plus oh-my-pi's candidate-switch limit).

    Attributes:
        enabled: When false, each candidate gets exactly one attempt.
        max_retries: Retries per candidate after the first attempt.
        base_delay_ms: First wait; doubled for each further retry.
        switch_after_ms: A wait longer than this moves on to the next candidate, if any.
        max_delay_ms: On the last candidate, a wait longer than this fails instead.
    """

    enabled: bool = True
    max_retries: int = 3
    base_delay_ms: int = 2000
    switch_after_ms: int = 30_000
    max_delay_ms: int = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt, as reported to ``on_attempt``.

    Attributes:
        candidate: The model's name.
        candidate_index: Its position in the candidate list.
        attempt: 1 for the first attempt on this candidate, 2 for the first retry, ...
        outcome: What followed (see :data:`Outcome`).
        delay_ms: The wait before the next attempt (``retry`` only, else 0).
        error: The failure, or ``None`` on success.
        check: The gate check the answer failed (D32), when the gate refused it.
    """

    candidate: str
    candidate_index: int
    attempt: int
    outcome: Outcome
    delay_ms: int = 0
    error: ModelError | None = None
    check: str | None = None


OVER_BUDGET = 2
"""How many times its output budget (``maxTokens``) a summary may be, estimated, before it is
refused. A model cannot write past its budget, but the estimate (characters / 4) can run above
the model's own count for some text; a remote endpoint has no budget at all."""


def check_summary_response(response: ModelResponse, max_tokens: int = 0) -> ModelResponse:
    """Refuse a summary that must not be applied (decision D15).

    Besides D15's failures, a summary far larger than its output budget: a remote summary
    endpoint is told no budget, and one that answered 3 MB was committed, so the context the
    compaction was meant to shrink came out hundreds of thousands of tokens larger (and the next
    turn overflowed, compacted, overflowed again).

    Args:
        response: The model's answer.
        max_tokens: The request's output budget (0: none checked).

    Returns:
        ``response`` unchanged when it is usable.

    Raises:
        FatalModelError: An error or aborted stop, or a summary more than :data:`OVER_BUDGET`
            times its budget.
        TruncatedReplyError: A ``length`` stop.
        EmptyReplyError: Empty or whitespace-only text.
    """
    if response.stop_reason in ("error", "aborted"):
        raise FatalModelError(f"Summarization failed: stop reason {response.stop_reason}")
    if response.stop_reason == "length":
        raise TruncatedReplyError("Summarization failed: output truncated")
    if not response.text.strip():
        raise EmptyReplyError("Summarization failed: empty summary")
    if max_tokens > 0:
        estimated = math.ceil(utf16_len(response.text) / 4)
        if estimated > OVER_BUDGET * max_tokens:
            raise FatalModelError(
                f"Summarization failed: the summary is about {estimated} tokens, more than "
                f"{OVER_BUDGET} times its budget of {max_tokens}"
            )
    return response
