"""Classify provider failures: overflow, transient or fatal (pi's isContextOverflow patterns).

Theory of operation: providers word "your prompt is too long" and "try again later" in dozens of
ways, and only some of them arrive as typed exceptions. I keep pi's and oh-my-pi's pattern tables
as data (one regex per line, all case-insensitive) and apply them to the error text, then look at
the exception's class names for the typed cases litellm gives us. Nothing here imports litellm:
classes are recognised by the names on their MRO, so importing the library stays cheap and the
classifier is testable without the 2.5 s litellm import.

Overflow is checked before transient: a "400 ... context_length_exceeded" must never be retried
with the same prompt (D21), it has to be compacted instead.

A missing or rejected key is checked before both, and is ``fatal``: no retry sends the same key
again. litellm reports a missing key as a 500 ``InternalServerError`` ("Missing credentials",
raised by the OpenAI client before any request), which the transient rules took for a server
error worth three retries (24 s of waiting for a key that will not appear). So a class named
``AuthenticationError`` or ``PermissionDeniedError``, an HTTP 401 or 403, or a missing-key
wording (:data:`MISSING_KEY_RE`) is fatal whatever else the text says.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any

from orchestrator._core.errors import (
    ContextOverflowError,
    FatalModelError,
    ModelError,
    TransientModelError,
)
from orchestrator._core.model import Usage

# pi (PM) patterns, then oh-my-pi's (OMP) llama.cpp and HTTP-413 additions. I keep the union:
# OMP dropped the Mistral line ("too large for model with N maximum context length"), but a
# false negative here costs a failed turn while a false positive costs nothing we can observe.
_OVERFLOW_PATTERNS: tuple[str, ...] = (
    r"prompt is too long",
    r"input is too long for requested model",
    r"exceeds the context window",
    r"input token count.*exceeds the maximum",
    r"maximum prompt length is \d+",
    r"reduce the length of the messages",
    r"maximum context length is \d+ tokens",
    r"exceeds the limit of \d+",
    r"exceeds the available context size",
    r"greater than the context length",
    r"context window exceeds limit",
    r"exceeded model token limit",
    r"too large for model with \d+ maximum context length",
    r"model_context_window_exceeded",
    r"context[_ ]length[_ ]exceeded",
    r"too many tokens",
    r"token limit exceeded",
    # OMP: llama.cpp and friends.
    r"requested tokens?.*exceed.*context (window|length|size)",
    r"context (window|length|size).*(exceeded|overflow|too small)",
    r"(prompt|input).*(too long|too large).*(context|n_ctx)",
    r"requested tokens?.*(exceeds?|greater than).*(n_ctx|context)",
    # OMP: HTTP 413 wordings. A bare "413 Forbidden" must not match (OMP's own test).
    r"request_too_large",
    r"request exceeds the maximum size",
    r"payload too large",
    r"entity too large",
    r"\b413\b.*\b(request|payload|entity)\b.*\btoo large\b",
)

OVERFLOW_RE = re.compile(
    "|".join(f"(?:{p})" for p in _OVERFLOW_PATTERNS), re.IGNORECASE | re.DOTALL
)
"""Any provider wording of "the context is too long"."""

# Cerebras answers an oversized request with a bare status line and no body.
_NO_BODY_RE = re.compile(r"^4(00|13)\s*(status code)?\s*\(no body\)", re.IGNORECASE)

# PM's retryable list, plus OMP's additions (provider/network errors, timeouts, stream stalls,
# Anthropic's envelope error before message_start, usage limits).
TRANSIENT_RE = re.compile(
    r"overloaded|rate.?limit|too many requests|429|500|502|503|504|service.?unavailable"
    r"|server.?error|internal.?error|connection.?error|connection.?refused|other side closed"
    r"|fetch failed|upstream.?connect|reset before headers|terminated|retry delay"
    r"|provider.?returned.?error|network.?error|socket hang up|timed? out|timeout|stream stall"
    r"|stream envelope error.*before.*message_start|usage.?limit",
    re.IGNORECASE | re.DOTALL,
)
"""Error text worth retrying with the same request."""

_HINT_RE = re.compile(
    r"(retry-after-ms|x-ratelimit-reset-ms|retry-after|x-ratelimit-reset)\b[\"']?\s*[:=]\s*[\"']?"
    r"(\d+(?:\.\d+)?)",
    re.IGNORECASE,
)
_MS_HINTS = frozenset({"retry-after-ms", "x-ratelimit-reset-ms"})
# Header names in the order I trust them: the millisecond ones are the most precise.
_HEADER_ORDER = ("retry-after-ms", "retry-after", "x-ratelimit-reset-ms", "x-ratelimit-reset")

MISSING_KEY_RE = re.compile(
    r"missing credentials|api_key client option must be set|no api key provided"
    r"|api[ _-]?key (?:is )?(?:missing|required|not (?:set|found|provided))"
    r"|(?:pass|provide|set) (?:an? )?`?api[ _-]?key",
    re.IGNORECASE,
)
"""Wordings of "no API key was given" (the OpenAI client's, litellm's, Anthropic's...)."""

_AUTH_CLASSES = frozenset({"AuthenticationError", "PermissionDeniedError"})
_AUTH_STATUSES = frozenset({401, 403})
_OVERFLOW_CLASSES = frozenset({"ContextWindowExceededError"})
_TRANSIENT_CLASSES = frozenset(
    {
        "RateLimitError",
        "ServiceUnavailableError",
        "InternalServerError",
        "APIConnectionError",
        "Timeout",
        "APITimeoutError",
        "BadGatewayError",
        # httpx, for the remote summary endpoint.
        "NetworkError",
        "TimeoutException",
        "RemoteProtocolError",
    }
)


def is_context_overflow_text(message: str) -> bool:
    """Whether an error message says the prompt did not fit the context window.

    Returns:
        True when any of pi's or oh-my-pi's overflow patterns matches (case-insensitive).
    """
    return bool(OVERFLOW_RE.search(message) or _NO_BODY_RE.search(message.strip()))


def is_transient_text(message: str) -> bool:
    """Whether an error message describes a failure worth retrying (and not an overflow).

    Returns:
        True when pi's retryable pattern matches and the text is not an overflow.
    """
    return not is_context_overflow_text(message) and bool(TRANSIENT_RE.search(message))


def retry_after_from_text(message: str) -> float | None:
    """Read a retry hint such as ``retry-after-ms: 1500`` out of an error message.

    Returns:
        The wait in seconds, or ``None`` when the text carries no hint.
    """
    for match in _HINT_RE.finditer(message):
        value = float(match.group(2))
        return value / 1000 if match.group(1).lower() in _MS_HINTS else value
    return None


def retry_after_from_headers(
    headers: Mapping[str, Any] | None, *, now: float | None = None
) -> float | None:
    """Read the wait a provider asked for from its response headers.

    ``retry-after`` may be seconds or an HTTP date; ``x-ratelimit-reset`` may be seconds or a
    Unix timestamp (a value bigger than a day is taken as a timestamp).

    Args:
        headers: Response headers (any case).
        now: Current Unix time, for dates and timestamps (defaults to ``time.time()``).

    Returns:
        Seconds to wait (never negative), or ``None`` when no usable header is present.
    """
    if not headers:
        return None
    lowered = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    for name in _HEADER_ORDER:
        raw = lowered.get(name)
        if raw is None:
            continue
        seconds = _parse_hint(name, raw, time.time() if now is None else now)
        if seconds is not None:
            return seconds
    return None


def _parse_hint(name: str, raw: str, now: float) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        if name != "retry-after":
            return None
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - now)
    if name in _MS_HINTS:
        return max(0.0, value / 1000)
    if name == "x-ratelimit-reset" and value > 86_400:
        return max(0.0, value - now)
    return max(0.0, value)


def silent_overflow(usage: Usage, context_window: int, stop_reason: str = "stop") -> bool:
    """Whether a successful reply reports more input than the window holds (OMP's rule).

    Some providers truncate the prompt silently instead of failing. OMP checks any stop reason;
    ``stop_reason`` is accepted for callers that want PM's stricter rule, and ignored here.

    Returns:
        True when ``input + cache_read + cache_write > context_window`` and the window is known.
    """
    del stop_reason  # OMP applies the rule to every stop reason.
    if not context_window:
        return False
    return usage.input + usage.cache_read + usage.cache_write > context_window


def classify_exception(exc: BaseException) -> ModelError:
    """Turn a provider exception (litellm, openai, httpx or plain) into a ``ModelError``.

    The caller raises the result ``from exc``. Typed classes are recognised by name so that
    litellm need not be imported; their text is then checked against the pattern tables,
    because providers often send an overflow as a plain 400.

    Returns:
        A :class:`ContextOverflowError`, :class:`TransientModelError` or
        :class:`FatalModelError` (a missing or rejected key is fatal, whatever its status
        says: see the module docstring).
    """
    if isinstance(exc, ModelError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    status = _status_of(exc)
    message = text or type(exc).__name__
    if names & _AUTH_CLASSES or status in _AUTH_STATUSES or MISSING_KEY_RE.search(text):
        return FatalModelError(message, status=status)
    if names & _OVERFLOW_CLASSES or is_context_overflow_text(text):
        return ContextOverflowError(message, status=status)
    transient = (
        bool(names & _TRANSIENT_CLASSES)
        or status in {408, 429}
        or (status is not None and status >= 500)
    )
    if transient or is_transient_text(text):
        retry_after = retry_after_from_headers(_headers_of(exc))
        if retry_after is None:
            retry_after = retry_after_from_text(text)
        return TransientModelError(message, retry_after=retry_after, status=status)
    return FatalModelError(message, status=status)


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _headers_of(exc: BaseException) -> Mapping[str, Any] | None:
    # litellm copies the provider's headers onto the exception (litellm_response_headers) and
    # also keeps the httpx response; either may be missing.
    for candidate in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if isinstance(candidate, Mapping) and candidate:
            return candidate
        items = getattr(candidate, "items", None)
        if callable(items):
            return dict(items())
    return None
