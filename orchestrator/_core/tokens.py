"""Token estimates, usage anchoring and the compaction trigger (pi's rules, D5, D6, D26).

Estimates are pi's chars/4 rule, rounded up, with characters counted in UTF-16 code units as
JavaScript's ``length`` counts them (D26): an emoji is two. Where the provider reported usage,
that number is the anchor and only what came after it is estimated: the provider's count is the
truth, the estimate only fills the gap since.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import Message
from orchestrator._core.js_json import js_json
from orchestrator._core.utf16 import json_string_len, utf16_len

IMAGE_CHARS = 4800
"""An image block counts as 4800 chars (1200 tokens), in user, tool-result, custom and system
content alike (pi 1.x; pi 0.73 counted none in user messages)."""


def _block_chars(content: object) -> int:
    if isinstance(content, str):
        return utf16_len(content)
    if not isinstance(content, list):
        return 0
    chars = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            chars += utf16_len(_text(block.get("text")))
        elif block.get("type") == "image":
            chars += IMAGE_CHARS
    return chars


# json.dumps(value, separators=(",", ":"), ensure_ascii=False), without a new encoder per call.


def _text(value: object) -> str:
    # A field pi writes as a string, holding something else in a damaged or hand-made file
    # (a number, null, an object): counted as empty, never a crash (D3).
    return value if isinstance(value, str) else ""


def json_length(value: object) -> int:
    """``JSON.stringify(value).length``: compact, non-ASCII kept, lone surrogates escaped (D26).

    The usual tool arguments, a non-empty object of strings, are measured without being written.
    """
    if isinstance(value, dict) and value:
        units = 1  # the braces, less the comma the last pair does not have
        for key, item in value.items():
            if not (isinstance(key, str) and isinstance(item, str)):
                break
            units += json_string_len(key) + json_string_len(item) + 2  # ':' and ','
        else:
            return units
    # Anything else as JavaScript writes it: its numbers differ from Python's (``1.0`` is
    # ``1``, ``1e20`` a 21-digit integer, a 30-digit integer the nearest double).
    return utf16_len(js_json(value))


def _assistant_chars(message: Mapping[str, Any]) -> int:
    chars = 0
    content = message.get("content")
    if isinstance(content, str):
        return utf16_len(content)
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            chars += utf16_len(_text(block.get("text")))
        elif kind == "thinking":
            chars += utf16_len(_text(block.get("thinking")))
        elif kind == "toolCall":
            chars += utf16_len(_text(block.get("name"))) + json_length(block.get("arguments", {}))
    return chars


def estimate_tokens(message: Mapping[str, Any]) -> int:
    """Estimate a message's tokens as ``ceil(chars / 4)`` (pi's estimateTokens, D6).

    ``chars`` counts UTF-16 code units (D26), so a character outside the BMP counts two.

    ``custom`` messages are counted (D6): they are sent to the model, so they take room.
    """
    role = message.get("role")
    if role in ("user", "toolResult", "custom", "hookMessage"):
        chars = _block_chars(message.get("content"))
    elif role == "assistant":
        chars = _assistant_chars(message)
    elif role == "system":
        chars = _system_chars(message)
    elif role == "bashExecution":
        chars = utf16_len(_text(message.get("command"))) + utf16_len(_text(message.get("output")))
    elif role in ("branchSummary", "compactionSummary"):
        chars = utf16_len(_text(message.get("summary")))
    else:
        chars = 0
    return math.ceil(chars / 4)


def quick_estimate(message: Mapping[str, Any], role: object) -> int:
    """:func:`estimate_tokens`, the usual user message or tool result taken without its calls.

    A context builds one estimate per message; most are one ASCII text block, whose estimate
    is its length (``tests/test_context_quick.py`` holds this to the general one).
    """
    if role == "user" or role == "toolResult":
        content = message.get("content")
        if type(content) is list and len(content) == 1:
            block = content[0]
            if type(block) is dict and block.get("type") == "text":
                text = block.get("text")
                if type(text) is str and text.isascii():
                    return -(-len(text) // 4)
    return estimate_tokens(message)


def _system_chars(message: Mapping[str, Any]) -> int:
    # pi 1.x: the content, every section's text (a removed one is null), and the declared
    # tools as JSON.stringify writes them.
    chars = _block_chars(message.get("content"))
    sections = message.get("sections")
    if isinstance(sections, dict):
        chars += sum(utf16_len(text) for text in sections.values() if isinstance(text, str))
    tools = message.get("toolsAdded")
    if tools is not None:
        chars += json_length(tools)
    return chars


LARGEST_COUNT = sys.float_info.max
"""The largest token count read as one: beyond a double's range, JavaScript reads Infinity."""


def is_token_count(value: object) -> bool:
    """True when ``value`` is a usable token count: a finite number of at least 0.

    Anything else a damaged or hand-made file holds there (a string, null, a boolean, a
    negative, infinite or NaN number, an integer beyond a double's range such as ``10**400``)
    counts as 0 (D3); ``check`` names it with its line.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 <= value <= LARGEST_COUNT  # NaN compares false: not a count either


def _count(usage: Mapping[str, Any], key: str) -> float:
    value = usage.get(key)
    return value if isinstance(value, int | float) and is_token_count(value) else 0


def _whole(total: float) -> int:
    # A sum of counts may still pass the range (1e308 + 1e308): 0 too, as one count past it is.
    return int(total) if total <= LARGEST_COUNT else 0


def calculate_context_tokens(usage: Mapping[str, Any]) -> int:
    """``totalTokens`` when non-zero, else input + output + cache read + cache write."""
    total = _count(usage, "totalTokens")
    if total:
        return int(total)
    return _whole(
        _count(usage, "input")
        + _count(usage, "output")
        + _count(usage, "cacheRead")
        + _count(usage, "cacheWrite")
    )


def calculate_prompt_tokens(usage: Mapping[str, Any]) -> int:
    """Input + cache read + cache write, or the context total when that is 0 (OMP)."""
    prompt = _whole(
        _count(usage, "input") + _count(usage, "cacheRead") + _count(usage, "cacheWrite")
    )
    return prompt if prompt > 0 else calculate_context_tokens(usage)


def valid_usage(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The usage of an assistant message that counts as an anchor, else ``None``.

    Aborted and errored replies do not count: their usage does not describe a full request.
    Nor does a usage that counts no token at all (pi 1.x): it measured nothing.
    """
    if message.get("role") != "assistant":
        return None
    if message.get("stopReason") in ("aborted", "error"):
        return None
    usage = message.get("usage")
    if not isinstance(usage, dict) or calculate_context_tokens(usage) <= 0:
        return None
    return usage


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextTokens:
    """The token count of a context, anchored on the last valid usage (as in pi).

    Attributes:
        tokens: pi's count: the last valid usage plus the estimates of what followed it.
        usage_tokens: That usage's context total (0 without one).
        trailing_tokens: The estimates after the usage (everything without one).
        last_usage_index: The message that carried the usage, or ``None``.
        stale_usage: A usage was set aside: measured before the latest compaction or context
            edit, on a context that no longer exists (D29; pi 1.x does the same).
        estimated_tokens: The chars/4 estimate of every message, ignoring any usage.
        stale_usage_tokens: With ``stale_usage``, the count anchored on that usage (what pi
            0.x reported); else 0.
    """

    tokens: int
    usage_tokens: int
    trailing_tokens: int
    last_usage_index: int | None
    stale_usage: bool = False
    estimated_tokens: int = 0
    stale_usage_tokens: int = 0

    @property
    def trusted_tokens(self) -> int:
        """The count to act on: pi's, or the estimate when the usage is stale (D29).

        Automatic triggers read this one, never ``tokens``, so a usage measured before a
        compaction cannot start another.
        """
        return self.estimated_tokens if self.stale_usage else self.tokens

    def as_json(self) -> dict[str, int | None]:
        """The inspection-JSON shape (docs/sessions.md, "Inspection JSON")."""
        return {
            "tokens": self.tokens,
            "usageTokens": self.usage_tokens,
            "trailingTokens": self.trailing_tokens,
            "lastUsageIndex": self.last_usage_index,
        }


def estimate_context_tokens(
    messages: Sequence[Message],
    estimates: Sequence[int] | None = None,
    *,
    fresh_from: int = 0,
    prefix: Sequence[int] | None = None,
) -> ContextTokens:
    """Count a context: last valid usage plus estimates of every message after it.

    Args:
        messages: The context's messages, in order.
        estimates: Precomputed :func:`estimate_tokens` per message, when the caller has them.
        fresh_from: Index of the first message written after the latest compaction (0 when the
            context has none). A usage on an earlier message is stale (D29).
        prefix: Running sums of ``estimates`` (``prefix[k] - prefix[0]`` = the first ``k``),
            when the caller keeps them: then only the messages after the usage are read.

    Returns:
        The anchored count. With no usage, everything is estimated and
        ``last_usage_index`` is ``None``.
    """
    if estimates is None:
        estimates = [estimate_tokens(m) for m in messages]
    count = len(messages)
    total = prefix[count] - prefix[0] if prefix is not None else sum(estimates)
    for index in range(count - 1, -1, -1):
        usage = valid_usage(messages[index])
        if usage is not None:
            usage_tokens = calculate_context_tokens(usage)
            trailing = (
                prefix[count] - prefix[index + 1]
                if prefix is not None
                else sum(estimates[index + 1 :])
            )
            return ContextTokens(
                tokens=usage_tokens + trailing,
                usage_tokens=usage_tokens,
                trailing_tokens=trailing,
                last_usage_index=index,
                stale_usage=usage_is_stale(index, fresh_from),
                estimated_tokens=total,
            )
    return ContextTokens(
        tokens=total,
        usage_tokens=0,
        trailing_tokens=total,
        last_usage_index=None,
        estimated_tokens=total,
    )


def usage_is_stale(usage_index: int | None, fresh_from: int) -> bool:
    """True when the usage at ``usage_index`` was measured before the latest compaction (D29).

    A compacted context is the summary, the kept messages, then what came after the
    compaction (``fresh_from`` onwards). A kept assistant reply carries the usage of the whole
    pre-compaction context, so it no longer describes what the model sees.
    """
    return usage_index is not None and usage_index < fresh_from


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionSettings:
    """Compaction settings (defaults are pi's).

    Attributes:
        enabled: ``False`` turns every automatic path off (D5).
        reserve_tokens: Room kept for the next reply; the threshold is ``window - reserve``.
        keep_recent_tokens: Recent tokens kept verbatim (before the D7 adaptation).
        threshold_percent: OMP's optional percent threshold (``None`` = unset).
        threshold_tokens: OMP's optional absolute threshold (``None`` = unset).
        adaptive_keep: Apply the measured-ratio adaptation of ``keep_recent_tokens`` (D7).
        auto_continue: After a threshold compaction, continue the agent (D20).
    """

    enabled: bool = True
    reserve_tokens: int = 16384
    keep_recent_tokens: int = 20000
    threshold_percent: float | None = None
    threshold_tokens: int | None = None
    adaptive_keep: bool = True
    auto_continue: bool = True


def compaction_threshold(context_window: int, settings: CompactionSettings) -> int:
    """The token count above which a context should compact (D5).

    ``threshold_tokens`` wins (clamped into the window), then ``threshold_percent`` (clamped to
    1..99 %), else the seed's ``window - reserve``.
    """
    if settings.threshold_tokens is not None and settings.threshold_tokens > 0:
        return max(1, min(settings.threshold_tokens, context_window - 1))
    if settings.threshold_percent is not None and settings.threshold_percent > 0:
        percent = min(max(settings.threshold_percent, 1.0), 99.0)
        return math.floor(context_window * percent / 100)
    return context_window - settings.reserve_tokens


def should_compact(context_tokens: int, context_window: int, settings: CompactionSettings) -> bool:
    """True when ``context_tokens`` is strictly above the threshold and compaction is on (D5)."""
    if not settings.enabled or context_window <= 0:
        return False
    return context_tokens > compaction_threshold(context_window, settings)
