"""The conversation as plain text for the summarizer (pi's serializeConversation).

The summarizer must read the history as a record, not as a conversation it takes part in, so the
messages are flattened into labelled paragraphs (``[User]: ...``). This is pi's
``serializeConversation`` to the character, because prompts and tests on both sides rely on it:
only tool results are shortened (to 2000 characters plus a marker); what the user and the
assistant said is never cut.

Lengths are counted in UTF-16 code units, as JavaScript counts them (D26), so the cut falls where
pi's does. One deliberate difference: where pi's cut would split a surrogate pair, mine moves one
unit earlier and the marker counts the one unit more that was left out, so no half character is
ever sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from orchestrator._core.entries import Message
from orchestrator._core.messages import to_llm_messages
from orchestrator._core.utf16 import escape_lone_surrogates, utf16_head, utf16_len

TOOL_RESULT_MAX_CHARS = 2000
"""Tool results longer than this are cut in the serialized conversation."""


def truncate_for_summary(text: str, limit: int = TOOL_RESULT_MAX_CHARS) -> str:
    """Cut ``text`` to ``limit`` UTF-16 units plus pi's marker, or return it unchanged (D26).

    A cut through a surrogate pair moves one unit earlier; the marker counts what was left out.
    """
    length = utf16_len(text)
    if length <= limit:
        return text
    head = utf16_head(text, limit)
    return f"{head}\n\n[... {length - utf16_len(head)} more characters truncated]"


def _js_number(value: float) -> str:
    # JSON.stringify prints non-finite doubles as null, and the shortest round-trip digits
    # positionally for 1e-6 <= |x| < 1e21, else with an unpadded exponent ("1e-7", "1e+21").
    # Python's repr switches to exponents earlier (below 1e-4, from 1e16), so I redo the layout.
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    if 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, exponent = repr(value).partition("e")
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa.removesuffix('.0')}e{sign}{exponent.lstrip('+-').lstrip('0')}"


def js_json(value: Any) -> str:
    """``JSON.stringify(value)``: compact separators, non-ASCII kept, JavaScript numbers.

    ``None`` prints as ``null``; values JSON cannot hold print as their ``str`` in quotes, as
    ``json.dumps(default=str)`` would, which is the least surprising choice for a summary.
    """
    if isinstance(value, str):
        return escape_lone_surrogates(json.dumps(value, ensure_ascii=False))
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return _js_number(value)
    if isinstance(value, dict):
        items = (f"{js_json(str(k))}:{js_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(js_json(item) for item in value) + "]"
    return js_json(str(value))


def format_tool_call(name: str, arguments: object) -> str:
    """``name(k1=<json>, k2=<json>)`` in the arguments' own key order."""
    pairs = arguments.items() if isinstance(arguments, dict) else ()
    return f"{name}({', '.join(f'{key}={js_json(value)}' for key, value in pairs)})"


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(block.get("text") or "")
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    ]


def _assistant_parts(message: Message) -> list[str]:
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "toolCall":
            calls.append(format_tool_call(str(block.get("name", "")), block.get("arguments")))
    parts = []
    if thinking:
        parts.append("[Assistant thinking]: " + "\n".join(thinking))
    if texts:
        parts.append("[Assistant]: " + "\n".join(texts))
    if calls:
        parts.append("[Assistant tool calls]: " + "; ".join(calls))
    return parts


def serialize_conversation(messages: Iterable[Message]) -> str:
    """Flatten context messages into the text the summarizer reads (pi's serializeConversation).

    Args:
        messages: Context messages (any role); pi's ``convertToLlm`` is applied first, so shell
            runs, custom messages and summaries appear as ``[User]:`` paragraphs.

    Returns:
        Paragraphs joined by blank lines; empty messages produce nothing.
    """
    parts: list[str] = []
    for message in to_llm_messages(messages):
        role = message.get("role")
        if role == "user":
            text = "".join(_texts(message.get("content")))
            if text:
                parts.append(f"[User]: {text}")
        elif role == "assistant":
            parts.extend(_assistant_parts(message))
        else:
            text = "".join(_texts(message.get("content")))
            if text:
                parts.append(f"[Tool result]: {truncate_for_summary(text)}")
    return "\n\n".join(parts)
