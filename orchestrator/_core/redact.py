"""Keeping secrets out of what we write: one redaction for provider error text.

Theory of operation
-------------------

Some providers and proxies echo the request's credentials in their error text (a 401 saying
"Incorrect API key provided: sk-...", a 500 quoting the request's headers). That text becomes a
:class:`~orchestrator._core.errors.ModelError` message, and from there it reaches the journal,
the spans of ``--trace`` (with the stack trace of the provider's own exception), the events and
stderr, all files other users may read. :func:`redact` is the one function that scrubs it. It is
applied where a ``ModelError`` is made (its constructor) and again where error text is written
(the journal's ``error`` field, the tracer's exception and status, the command line's stderr),
because a stack trace carries the provider's exception, not ours. Redacting twice changes
nothing: the placeholder matches none of the rules.

The rules, in order; each match is replaced by ``[redacted]``:

1. **The keys in use**, by exact value: every key a route was given, or read from the
   provider's usual variable (:func:`remember_secret`). Values shorter than 8 characters are
   not remembered: replacing every ``test`` in a message hides more than it protects.
2. **Credentials in headers and parameters**: the value after ``Authorization`` or
   ``Proxy-Authorization`` (with its scheme word, ``Bearer``, ``Basic``...), after a bare
   ``Bearer``, and after ``api-key``, ``x-api-key``, ``api_key``, ``apikey``, ``x-goog-api-key``,
   ``access_token`` or a URL's ``key=``, whatever the quoting (``Authorization: Bearer X``,
   ``"x-api-key": "X"``, ``?key=X``); and the password of a URL's ``user:password@``.
3. **Anything shaped like a key**: ``sk-`` followed by 16 or more letters, digits, ``-`` or
   ``_`` (OpenAI's, Anthropic's ``sk-ant-...``, most proxies'); a JSON web token (``eyJ...``,
   three dot-separated parts); and a long high-entropy token: a run of letters, digits, ``-``
   and ``_`` in which one piece between ``-`` and ``_`` is 20 characters or more and mixes
   letters and digits (Mistral's 32, Groq's ``gsk_...``, Hugging Face's ``hf_...``, Azure's 32
   hexadecimal digits).

What is deliberately kept: our 8-hex entry ids and UUIDs (a session's id: its pieces are 12
characters at most), model names (``claude-3-5-sonnet-20241022``: short pieces), words (no
digits), paths (``/`` and ``.`` end a run), HTTP statuses and numbers (no letters). The price
of rule 3 is that a 40-digit hexadecimal commit id or a 32-digit trace id inside an error text
is redacted too; such text is rare in a provider's error, and a false positive costs a hint,
where a false negative leaks a key.
"""

from __future__ import annotations

import re
import threading

REDACTED = "[redacted]"
"""What a secret is replaced with."""

_MIN_SECRET = 8

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_NOTHING = re.compile(r"(?!)")  # matches nowhere: no key remembered yet
_KNOWN: list[re.Pattern[str]] = [_NOTHING]  # the exact-value pattern, rebuilt on change

_VALUE = r"(?!\[redacted\])[^\s\"'`,;&)}\]]+"  # a value, unless redacted already
_HEADER = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"'`]?\s*[:=]\s*[\"'`]?)"
    r"(?>((?:bearer|basic|token|digest|apikey)\s+)?)" + _VALUE  # a scheme word is not the value
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)" + _VALUE)
_KEY_PARAMETER = re.compile(
    r"(?i)(\b(?:x-goog-api-key|x-api-key|api[-_]?key|access[-_]token)[\"'`]?\s*[:=]\s*[\"'`]?"
    r"|[?&]key=)" + _VALUE
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")
_SK = re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{16,}")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_RUN = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{20,}(?![A-Za-z0-9_-])")
_PIECE = re.compile(r"[A-Za-z0-9]{20,}")


def remember_secret(value: str | None) -> None:
    """Redact ``value`` wherever :func:`redact` meets it, from now on (rule 1).

    Args:
        value: A key a route uses; ``None``, and values under 8 characters, are ignored.
    """
    if value is None:
        return
    value = value.strip()
    if len(value) < _MIN_SECRET:
        return
    with _SECRETS_LOCK:
        if value in _SECRETS:
            return
        _SECRETS.add(value)
        ordered = sorted(_SECRETS, key=len, reverse=True)  # a key inside a longer one: longest
        _KNOWN[0] = re.compile("|".join(re.escape(secret) for secret in ordered))


def redact(text: str) -> str:
    """``text`` with every secret the rules find replaced by ``[redacted]`` (module docstring).

    Returns:
        The text, unchanged where no rule matched.
    """
    text = _KNOWN[0].sub(REDACTED, text)
    text = _HEADER.sub(_keep_prefix, text)
    text = _BEARER.sub(_keep_prefix, text)
    text = _KEY_PARAMETER.sub(_keep_prefix, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _SK.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    return _RUN.sub(_high_entropy, text)


def _keep_prefix(match: re.Match[str]) -> str:
    """The header's name (and scheme word) kept, its value replaced."""
    kept = "".join(group for group in match.groups() if group)
    return kept + REDACTED


def _high_entropy(match: re.Match[str]) -> str:
    token = match.group(0)
    for piece in _PIECE.findall(token):
        if not (piece.isdigit() or piece.isalpha()):
            return REDACTED
    return token
