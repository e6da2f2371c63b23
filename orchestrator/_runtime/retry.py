"""Candidate models and retries for summary calls (decision D21).

Theory of operation: every adapter makes exactly one HTTP attempt; this module owns the rest.
The caller passes an ordered list of candidate models (the current model first) and a function
that builds the request for each (budgets may differ per model). For each candidate:

* a ``transient`` failure is retried up to ``max_retries`` times, waiting
  ``base_delay_ms * 2**n`` (2 s, 4 s, 8 s by default) or the provider's retry-after hint when
  that is longer;
* when the next wait would exceed ``switch_after_ms`` (30 s) and another candidate remains, I
  stop waiting and move on (oh-my-pi's rule); on the last candidate the wait is allowed up to
  ``max_delay_ms`` (pi's 60 s ``retry.maxDelayMs``) and beyond that the call fails;
* an ``overflow`` is raised at once: the same prompt will not fit on a retry, and the caller has
  to shrink it (D21 keeps overflow out of this path);
* any other failure (``fatal``, and D15's ``empty`` / ``truncated`` summaries) is not retried on
  the same candidate but moves on to the next one. That is oh-my-pi's outer loop: a
  non-retryable error on one route says nothing about the others.

When every candidate fails, the last error is raised. Every attempt, successful or not, is
reported once through ``on_attempt`` so traces show the whole story. The waits go through an
injected ``sleep`` (``FakeClock.sleep`` in tests); cancelling the enclosing anyio scope
interrupts a wait, and nothing here catches cancellation.

The mechanics are tenacity's ``AsyncRetrying`` (``retry_if_exception``, ``stop_after_attempt``,
a wait that honours retry-after), so the policy reads as configuration, not as a loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
)
from tenacity.stop import stop_base

from orchestrator._core.errors import ModelError
from orchestrator._core.model import Model, ModelRequest, ModelResponse

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


async def call_with_candidates(
    candidates: Sequence[Model],
    request_for: Callable[[Model], ModelRequest],
    *,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    on_attempt: Callable[[AttemptRecord], None] | None = None,
    validate: Callable[[ModelResponse], ModelResponse] | None = check_summary_response,
) -> tuple[ModelResponse, Model]:
    """Call the candidates in order, retrying transient failures, until one answers.

    Args:
        candidates: Models to try, best first.
        request_for: Builds the request for a candidate.
        policy: Retry settings (defaults to :class:`RetryPolicy`'s).
        sleep: Awaited for each wait, in seconds (inject ``FakeClock.sleep`` in tests).
        on_attempt: Called once per attempt with its record.
        validate: Checks each reply and raises ``ModelError`` to refuse it (``None``: accept all).

    Returns:
        The accepted reply and the model that gave it.

    Raises:
        ModelError: an overflow (at once), the last candidate's error when all failed, or
            ``Compaction failed: no available model`` when ``candidates`` is empty.
    """
    policy = policy or RetryPolicy()
    report = on_attempt or _ignore
    last_error: ModelError | None = None
    for index, model in enumerate(candidates):
        is_last = index == len(candidates) - 1
        call = _Candidate(model, index, request_for(model), validate, report)
        try:
            response: ModelResponse = await _retrying(policy, is_last, sleep, call)(call.attempt)
        except ModelError as error:
            final = is_last or error.kind == "overflow"
            report(call.record("failed" if final else "next_candidate", error=error))
            if error.kind == "overflow":
                raise
            last_error = error
            continue
        report(call.record("ok"))
        return response, model
    if last_error is None:
        raise ModelError(NO_MODEL)
    raise last_error


class _Candidate:
    """One candidate's attempts: calls the model and numbers the records."""

    def __init__(
        self,
        model: Model,
        index: int,
        request: ModelRequest,
        validate: Callable[[ModelResponse], ModelResponse] | None,
        report: Callable[[AttemptRecord], None],
    ) -> None:
        self.model = model
        self.index = index
        self.request = request
        self.validate = validate
        self.report = report
        self.attempts = 0

    async def attempt(self) -> ModelResponse:
        self.attempts += 1
        response = await self.model.complete(self.request)
        return self.validate(response) if self.validate else response

    def record(
        self, outcome: Outcome, *, delay_ms: int = 0, error: ModelError | None = None
    ) -> AttemptRecord:
        return AttemptRecord(
            candidate=self.model.name,
            candidate_index=self.index,
            attempt=self.attempts,
            outcome=outcome,
            delay_ms=delay_ms,
            error=error,
        )

    def before_sleep(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay_ms = round((state.upcoming_sleep or 0) * 1000)
        assert isinstance(error, ModelError)  # only ModelErrors are retried
        self.report(self.record("retry", delay_ms=delay_ms, error=error))


def _retrying(
    policy: RetryPolicy,
    is_last: bool,
    sleep: Callable[[float], Awaitable[None]],
    call: _Candidate,
) -> AsyncRetrying:
    limit_s = (policy.max_delay_ms if is_last else policy.switch_after_ms) / 1000
    retries = policy.max_retries if policy.enabled else 0

    def wait(state: RetryCallState) -> float:
        # attempt_number is 1 after the first failure: 2 s, 4 s, 8 s at the default base.
        delay = policy.base_delay_ms / 1000 * float(2 ** (state.attempt_number - 1))
        error = state.outcome.exception() if state.outcome else None
        hint = error.retry_after if isinstance(error, ModelError) else None
        return max(delay, hint or 0.0)

    return AsyncRetrying(
        retry=retry_if_exception(_is_transient),
        stop=stop_any(stop_after_attempt(retries + 1), _WaitOver(limit_s)),
        wait=wait,
        sleep=sleep,
        before_sleep=call.before_sleep,
        reraise=True,
    )


class _WaitOver(stop_base):
    """Stop when the wait tenacity just computed is longer than the limit."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        return (retry_state.upcoming_sleep or 0.0) > self.limit_s


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, ModelError) and error.kind == "transient"


def _ignore(record: AttemptRecord) -> None:
    del record
