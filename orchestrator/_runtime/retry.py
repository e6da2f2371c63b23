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

from dataclasses import dataclass
from typing import Literal

from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelResponse

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
    """

    candidate: str
    candidate_index: int
    attempt: int
    outcome: Outcome
    delay_ms: int = 0
    error: ModelError | None = None


def check_summary_response(response: ModelResponse) -> ModelResponse:
    """Refuse a summary that must not be applied (decision D15).

    Returns:
        ``response`` unchanged when it is usable.

    Raises:
        ModelError: ``kind="fatal"`` for an error or aborted stop, ``"truncated"`` for a
            ``length`` stop, ``"empty"`` for empty or whitespace-only text.
    """
    if response.stop_reason in ("error", "aborted"):
        raise ModelError(f"Summarization failed: stop reason {response.stop_reason}")
    if response.stop_reason == "length":
        raise ModelError("Summarization failed: output truncated", kind="truncated")
    if not response.text.strip():
        raise ModelError("Summarization failed: empty summary", kind="empty")
    return response
