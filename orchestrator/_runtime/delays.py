"""Retry delays as pure functions, from tenacity's wait strategies (D21).

The machines decide *whether* to wait, move to the next candidate or give up; this module only
says *how long* a wait would be, so the number reaches the guards as a fact (``delay_ms``). I use
tenacity's ``wait_exponential`` as a plain function of the attempt number rather than its
``AsyncRetrying`` loop: the loop would decide the retries itself, and the table must decide.
A provider's retry-after hint raises the delay, never lowers it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from tenacity import wait_exponential

if TYPE_CHECKING:
    from tenacity import RetryCallState


@dataclass(frozen=True, slots=True)
class _Attempt:
    # The one field tenacity's exponential wait reads from its retry state.
    attempt_number: int


def retry_delay_ms(base_delay_ms: int, retries_done: int, retry_after_s: float | None) -> int:
    """The wait before the next attempt: ``base * 2^retries_done``, raised to a retry-after hint.

    Args:
        base_delay_ms: The first wait (``retry.baseDelayMs``).
        retries_done: Retries already made in this streak (0 before the first retry).
        retry_after_s: The provider's retry-after hint in seconds, if any.

    Returns:
        The delay in milliseconds (2000, 4000, 8000 at the default base).
    """
    wait = wait_exponential(multiplier=base_delay_ms / 1000, exp_base=2, max=math.inf)
    seconds = wait(cast("RetryCallState", _Attempt(attempt_number=retries_done + 1)))
    hint = retry_after_s if retry_after_s is not None and retry_after_s > 0 else 0.0
    return round(max(seconds, hint) * 1000)
