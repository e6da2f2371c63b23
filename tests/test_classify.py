import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.classify import (
    _OVERFLOW_PATTERNS,
    classify_exception,
    is_context_overflow_text,
    is_transient_text,
    retry_after_from_headers,
    retry_after_from_text,
    silent_overflow,
)
from orchestrator._core.errors import (
    ContextOverflowError,
    EmptyReplyError,
    FatalModelError,
    TransientModelError,
)
from orchestrator._core.model import Usage

# One positive example per pattern, in the table's order (pi's isContextOverflow).
OVERFLOW_EXAMPLES = (
    "prompt is too long: 210000 tokens > 200000 maximum",
    "input is too long for requested model",
    "Your input exceeds the context window of this model",
    "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575)",
    "The maximum prompt length is 131072 for this model",
    "Please reduce the length of the messages or completion.",
    "This model's maximum context length is 8192 tokens. However, you requested 9000",
    "This request exceeds the limit of 32768",
    "the request exceeds the available context size, try increasing it",
    "Requested input length 9000 is greater than the context length 8192",
    "context window exceeds limit",
    "Exceeded model token limit: 4096",
    "Prompt contains 40000 tokens, too large for model with 32768 maximum context length",
    "model_context_window_exceeded",
    "Error code: context_length_exceeded",
    "Too many tokens in the request",
    "Token limit exceeded for this call",
    "requested tokens (9000) exceed context window of 8192",
    "the context size has been exceeded",
    "input is too large for n_ctx 4096",
    "requested token count 5000 greater than n_ctx 4096",
    "request_too_large",
    "The request exceeds the maximum size",
    "HTTP 413 Payload Too Large",
    "413 Request Entity Too Large",
    "413: the request body is too large",
)


def test_every_pattern_has_its_own_positive_example() -> None:
    assert len(OVERFLOW_EXAMPLES) == len(_OVERFLOW_PATTERNS)
    for pattern, example in zip(_OVERFLOW_PATTERNS, OVERFLOW_EXAMPLES, strict=True):
        assert re.search(pattern, example, re.IGNORECASE), (pattern, example)
        assert is_context_overflow_text(example)
        assert is_context_overflow_text(example.upper())


@pytest.mark.parametrize(
    "text",
    ["400 status code (no body)", "413 (no body)", "400 (no body)", " 413 status code (no body)"],
)
def test_cerebras_bare_status_is_overflow(text: str) -> None:
    assert is_context_overflow_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "413 Forbidden",
        "401 status code (no body)",
        "Rate limit reached for requests",
        "Invalid API key",
        "The server had an error while processing your request",
        "",
    ],
)
def test_not_overflow(text: str) -> None:
    assert not is_context_overflow_text(text)


TRANSIENT_EXAMPLES = (
    "Overloaded",
    "rate limit reached",
    "rate_limit_error",
    "Too Many Requests",
    "Error 429",
    "500 Internal",
    "502 Bad Gateway",
    "503",
    "504 Gateway Timeout",
    "Service Unavailable",
    "server_error",
    "internal error",
    "Connection error.",
    "connect ECONNREFUSED: connection refused",
    "other side closed",
    "fetch failed",
    "upstream connect error",
    "reset before headers",
    "terminated",
    "retry delay exceeded",
    "Provider returned error",
    "network error",
    "socket hang up",
    "Request timed out",
    "time out",
    "stream stall detected",
    "stream envelope error: bad frame before message_start",
    "You have reached your usage limit",
)


@pytest.mark.parametrize("text", TRANSIENT_EXAMPLES)
def test_transient_text(text: str) -> None:
    assert is_transient_text(text)


@pytest.mark.parametrize(
    "text", ["Invalid API key", "model not found", "prompt is too long; 429 tokens of slack"]
)
def test_not_transient_text(text: str) -> None:
    # An overflow is never transient, even when the text also carries a retryable word.
    assert not is_transient_text(text)


@given(st.text())
def test_overflow_and_transient_are_exclusive(text: str) -> None:
    assert not (is_context_overflow_text(text) and is_transient_text(text))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("retry-after-ms: 1500", 1.5),
        ('{"retry-after": "7"}', 7.0),
        ("x-ratelimit-reset-ms=250", 0.25),
        ("X-RateLimit-Reset: 12", 12.0),
        ("Retry-After: 2.5 seconds", 2.5),
        ("please slow down", None),
    ],
)
def test_retry_after_from_text(text: str, seconds: float | None) -> None:
    assert retry_after_from_text(text) == seconds


def test_retry_after_from_headers_prefers_milliseconds() -> None:
    assert retry_after_from_headers({"Retry-After": "9", "retry-after-ms": "1200"}) == 1.2
    assert retry_after_from_headers({"retry-after": "9"}) == 9.0
    assert retry_after_from_headers({"x-ratelimit-reset-ms": "300"}) == 0.3
    assert retry_after_from_headers({"x-ratelimit-reset": "4"}) == 4.0
    assert retry_after_from_headers({"content-type": "text/plain"}) is None
    assert retry_after_from_headers(None) is None
    assert retry_after_from_headers({}) is None


def test_retry_after_from_headers_dates_and_timestamps() -> None:
    now = 1_700_000_000.0
    soon, past = "Tue, 14 Nov 2023 22:13:40 GMT", "Tue, 14 Nov 2023 22:00:00 GMT"
    assert retry_after_from_headers({"retry-after": soon}, now=now) == 20.0
    assert retry_after_from_headers({"x-ratelimit-reset": str(now + 30)}, now=now) == 30.0
    # Already past: wait nothing rather than a negative time.
    assert retry_after_from_headers({"retry-after": past}, now=now) == 0.0


def test_retry_after_from_headers_skips_garbage() -> None:
    assert retry_after_from_headers({"retry-after": "soon"}) is None
    assert retry_after_from_headers({"retry-after-ms": "soon", "retry-after": "3"}) == 3.0


@given(st.integers(min_value=0, max_value=86_400))
def test_retry_after_seconds_round_trip(seconds: int) -> None:
    assert retry_after_from_headers({"Retry-After": str(seconds)}) == seconds
    assert retry_after_from_text(f"retry-after: {seconds}") == seconds


def test_silent_overflow_follows_omp() -> None:
    usage = Usage(input=900, cache_read=50, cache_write=60)
    assert silent_overflow(usage, 1000)
    assert silent_overflow(usage, 1000, "length")  # any stop reason
    assert not silent_overflow(usage, 1010)
    assert not silent_overflow(usage, 0)  # unknown window: never


# Stand-ins carrying litellm's class names, so this test needs no litellm import.
class BadRequestError(Exception):
    status_code = 400


class ContextWindowExceededError(BadRequestError):
    pass


class RateLimitError(Exception):
    status_code = 429

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.litellm_response_headers = headers


class _Response:
    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        self.status_code = status_code
        self.headers = headers


class APIStatusError(Exception):
    def __init__(self, message: str, response: _Response) -> None:
        super().__init__(message)
        self.response = response


class Timeout(Exception):
    pass


def test_classify_typed_overflow() -> None:
    error = classify_exception(ContextWindowExceededError("anything"))
    assert isinstance(error, ContextOverflowError)
    assert (error.kind, error.status) == ("overflow", 400)


def test_classify_bad_request_by_text() -> None:
    assert classify_exception(BadRequestError("prompt is too long")).kind == "overflow"
    assert classify_exception(BadRequestError("invalid parameter")).kind == "fatal"


def test_classify_rate_limit_with_headers() -> None:
    error = classify_exception(RateLimitError("slow down", {"retry-after": "7"}))
    assert type(error) is TransientModelError
    assert (error.kind, error.retry_after, error.status) == ("transient", 7.0, 429)


def test_classify_rate_limit_hint_in_text() -> None:
    error = classify_exception(RateLimitError("slow down, retry-after-ms: 500"))
    assert (error.kind, error.retry_after) == ("transient", 0.5)


def test_classify_status_from_response() -> None:
    error = classify_exception(APIStatusError("bad gateway", _Response(502, {"retry-after": "3"})))
    assert (error.kind, error.status, error.retry_after) == ("transient", 502, 3.0)
    assert classify_exception(APIStatusError("nope", _Response(403, {}))).kind == "fatal"


def test_classify_timeout_and_plain_errors() -> None:
    assert classify_exception(Timeout()).kind == "transient"
    assert str(classify_exception(Timeout())) == "Timeout"
    assert classify_exception(OSError("connection refused")).kind == "transient"
    assert classify_exception(ValueError("bad")).kind == "fatal"
    assert type(classify_exception(ValueError("bad"))) is FatalModelError


def test_classify_keeps_model_errors() -> None:
    error = EmptyReplyError("x")
    assert classify_exception(error) is error


class InternalServerError(Exception):
    status_code = 500


class AuthenticationError(Exception):
    status_code = 401


class PermissionDeniedError(Exception):
    pass


@pytest.mark.parametrize(
    "error",
    [
        # litellm's report of a missing key: a 500 InternalServerError, retried three times.
        InternalServerError(
            "litellm.InternalServerError: OpenAIException - Missing credentials. Please pass an "
            "`api_key`, or set the `OPENAI_API_KEY` environment variable."
        ),
        InternalServerError("The api_key client option must be set"),
        OSError("No API key provided"),
        ValueError("ANTHROPIC api key is missing"),
        AuthenticationError("server error 500: overloaded"),  # the class decides, not the text
        PermissionDeniedError("rate limit"),
        APIStatusError("internal error", _Response(401, {})),
        APIStatusError("503 service unavailable", _Response(403, {})),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_missing_or_rejected_key_is_fatal(error: Exception) -> None:
    assert classify_exception(error).kind == "fatal"


def test_a_key_mentioned_in_passing_is_not_a_missing_key() -> None:
    assert classify_exception(InternalServerError("api key rotation in progress")).kind == (
        "transient"
    )
