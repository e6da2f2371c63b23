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

Compaction serializes newest first, against the summarizer's budget (issue 9): the context keeps
the serialized length of every message as it grows (:func:`serialized_length`, computed from
the message without building its text where the shape allows), so the length of any run of
messages is a subtraction, and only the newest messages that fit are turned into text
(:class:`MeasuredMessages`), each once. The same measure tells each message's shape
(:func:`measure_shaped`): the usual ones (a user's text, a short tool result, an assistant's text
and one call) are then written without checking their roles and blocks again
(:func:`serialize_shaped`), which is most of what serializing thousands of messages cost.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from orchestrator._core.entries import Message
from orchestrator._core.js_json import encode_string, js_json
from orchestrator._core.tokens import IMAGE_CHARS, estimate_tokens, json_length
from orchestrator._core.utf16 import (
    escape_lone_surrogates,
    json_string_len,
    utf16_head,
    utf16_len,
)

TOOL_RESULT_MAX_CHARS = 2000
"""Tool results longer than this are cut in the serialized conversation."""

PARAGRAPH_SEPARATOR = "\n\n"
USER_LABEL = "[User]: "
ASSISTANT_LABEL = "[Assistant]: "
CALLS_LABEL = "[Assistant tool calls]: "
TOOL_RESULT_LABEL = "[Tool result]: "

_encode_string = encode_string


def truncate_for_summary(text: str, limit: int = TOOL_RESULT_MAX_CHARS) -> str:
    """Cut ``text`` to ``limit`` UTF-16 units plus pi's marker, or return it unchanged (D26).

    A cut through a surrogate pair moves one unit earlier, as pi 1.x's ``sliceHead`` does; the
    marker counts ``length - limit``, as pi's does (the unit moved is not counted).
    """
    length = utf16_len(text)
    if length <= limit:
        return text
    return f"{utf16_head(text, limit)}\n\n[... {length - limit} more characters truncated]"


def format_tool_call(name: str, arguments: object) -> str:
    """``name(k1=<json>, k2=<json>)`` in the arguments' own key order."""
    if not isinstance(arguments, dict):
        return f"{name}()"
    if len(arguments) == 1:  # the usual call, without a generator
        ((key, value),) = arguments.items()
        return f"{name}({key}={js_json(value)})"
    return f"{name}({', '.join(f'{key}={js_json(value)}' for key, value in arguments.items())})"


def _json_string(value: str) -> str:
    """``JSON.stringify`` of a string (see :func:`js_json`), without the type dispatch."""
    text = _encode_string(value)
    return text if text.isascii() else escape_lone_surrogates(text)


def _call_text(block: dict[str, Any]) -> str:
    """:func:`format_tool_call` of a tool call block."""
    name = block.get("name", "")
    if type(name) is not str:
        name = str(name)
    arguments = block.get("arguments")
    if type(arguments) is dict and len(arguments) == 1:  # the usual call: one string argument
        ((key, value),) = arguments.items()
        if type(key) is str and type(value) is str:
            return f"{name}({key}={_json_string(value)})"
    return format_tool_call(name, arguments)


def _block_text(block: dict[str, Any], field: str) -> str:
    # str(block.get(field) or ""), with the usual string taken as it is.
    text = block.get(field)
    return text if type(text) is str else str(text or "")


def _assistant_text(content: list[Any]) -> str:
    """An assistant message's paragraphs: text, then tool calls (pi's order).

    Thinking is left out, as pi 1.2 and later leave it out: providers return summaries of the
    real reasoning, often not part of the model's live context, and replaying them can make the
    summary request larger than the context it summarizes.
    """
    # One pass, items joined as they come; None until a part has an item (an empty text block
    # still makes its part, as in pi). This runs for every message a summary request holds.
    texts: str | None = None
    calls: str | None = None
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if type(text) is not str:
                text = str(text or "")
            texts = text if texts is None else f"{texts}\n{text}"
        elif kind == "toolCall":
            call = _call_text(block)
            calls = call if calls is None else f"{calls}; {call}"
    if texts is not None and calls is not None:  # the usual message
        return f"{ASSISTANT_LABEL}{texts}{PARAGRAPH_SEPARATOR}{CALLS_LABEL}{calls}"
    if texts is not None:
        return ASSISTANT_LABEL + texts
    return CALLS_LABEL + calls if calls is not None else ""


def _joined_text(content: object) -> str:
    """The text blocks of ``content`` joined without a separator (a string passes through)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    if len(content) == 1:  # the usual shape, taken directly
        block = content[0]
        if isinstance(block, dict) and block.get("type") == "text":
            return _block_text(block, "text")
        return ""
    return "".join(
        _block_text(block, "text")
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    )


def serialize_message(message: Message) -> str:
    """One context message's paragraphs, joined by blank lines ("" when it shows nothing).

    :func:`serialize_conversation` is these, the empty ones left out, joined by blank lines.
    """
    # A summary request serializes thousands of messages, and nearly all have one of three
    # shapes: a single text block from the user, a short ASCII tool result, or an assistant's
    # text and one tool call with one string argument. Those are written without the general
    # path's walk (issue 9); anything else, and any value of an unexpected type, takes it.
    content = message.get("content")
    if type(content) is list and 0 < len(content) <= 2:
        first = content[0]
        if type(first) is dict and first.get("type") == "text":
            text = first.get("text")
            if type(text) is str:
                role = message.get("role")
                if len(content) == 2:
                    if role == "assistant":
                        usual = _usual_call(text, content[1])
                        if usual is not None:
                            return usual
                elif role == "user":
                    return USER_LABEL + text if text else ""
                elif (
                    role == "toolResult"
                    and len(text) <= TOOL_RESULT_MAX_CHARS
                    and text.isascii()
                    and message.get("prunedAt") is None
                ):
                    return TOOL_RESULT_LABEL + text if text else ""
    return _any_text(message.get("role"), content, message)


def _usual_call(text: str, call: object) -> str | None:
    """An assistant's text and one tool call with one string argument, or ``None``."""
    if type(call) is not dict or call.get("type") != "toolCall":
        return None
    name = call.get("name")
    arguments = call.get("arguments")
    if type(name) is not str or type(arguments) is not dict or len(arguments) != 1:
        return None
    ((key, value),) = arguments.items()
    if type(key) is not str or type(value) is not str:
        return None
    quoted = _encode_string(value)
    if not quoted.isascii():
        quoted = escape_lone_surrogates(quoted)
    return f"{ASSISTANT_LABEL}{text}{PARAGRAPH_SEPARATOR}{CALLS_LABEL}{name}({key}={quoted})"


def _any_text(role: object, content: object, message: Message) -> str:
    """:func:`serialize_message` of any shape."""
    if role == "assistant":
        if isinstance(content, list):
            return _assistant_text(content)
        return ASSISTANT_LABEL + content if isinstance(content, str) else ""
    if role == "user":
        text = _joined_text(content)
        return USER_LABEL + text if text else ""
    if role == "toolResult" and message.get("prunedAt") is None:
        text = _joined_text(content)
        if not text:
            return ""
        if len(text) <= TOOL_RESULT_MAX_CHARS and text.isascii():  # short: never cut
            return TOOL_RESULT_LABEL + text
        return TOOL_RESULT_LABEL + truncate_for_summary(text)
    # Here, not at the top: the context measures messages as it grows, and a short command
    # should not import the prompts for the few roles that convert.
    from orchestrator._core.messages import to_llm_message

    as_user = to_llm_message(message)  # pi's convertToLlm: every other role is a user message
    if as_user is None:
        return ""
    text = _joined_text(as_user.get("content"))
    if not text:
        return ""
    if as_user.get("role") == "user":
        return USER_LABEL + text
    return TOOL_RESULT_LABEL + truncate_for_summary(text)


def serialize_conversation(messages: Iterable[Message]) -> str:
    """Flatten context messages into the text the summarizer reads (pi's serializeConversation).

    Args:
        messages: Context messages (any role); pi's ``convertToLlm`` is applied first, so shell
            runs, custom messages and summaries appear as ``[User]:`` paragraphs.

    Returns:
        Paragraphs joined by blank lines; empty messages produce nothing.
    """
    return PARAGRAPH_SEPARATOR.join(filter(None, map(serialize_message, messages)))


SHAPE_OTHER = 0
"""A message :func:`serialize_shaped` hands to :func:`serialize_message`."""
SHAPE_USER_TEXT = 1
"""A user message of one text block, a string, not empty."""
SHAPE_SHORT_RESULT = 2
"""A tool result, not pruned, of one ASCII text block of 1 to 2000 characters."""
SHAPE_TEXT_AND_CALL = 3
"""An assistant message of a text block (a string) and a tool call with one string argument."""


def shaped_parts(message: Message, shape: int) -> tuple[Any, Any]:
    """What :func:`serialize_shaped` writes a message of ``shape`` from: ``(text, call)``.

    The text of a user message or a short tool result (and ``None``); the text of an assistant
    message of text and call, and its call as written (``read(path="a.py")``); ``(None, None)``
    for any other shape. :func:`measure_shaped` returns the same from the walk that measures
    the message, and the context keeps them: a summary request then writes thousands of
    messages from them instead of walking each message's dictionaries again, cold (about half of
    the request's cost at 10k entries, issue 9). The texts are references; the call is the one
    string made per message, a few dozen bytes: writing it at measure time costs the context's
    build about 0.1 to 0.3 µs an entry and saves a 10k request four reads of cold dictionaries
    and strings per call (one compaction at 10k went from 5.1 to 6.4 ms to 4.2 to 4.7, total −
    L, alternating runs on 4 December 2026). A tuple per message, tried before, cost the build
    more than it saved. This is the same read, for messages no context measured.
    """
    if shape == SHAPE_USER_TEXT or shape == SHAPE_SHORT_RESULT:
        return message["content"][0]["text"], None
    if shape == SHAPE_TEXT_AND_CALL:
        content = message["content"]
        return content[0]["text"], _shaped_call_text(content[1])
    return None, None


CALLS_AFTER_TEXT = PARAGRAPH_SEPARATOR + CALLS_LABEL


def _shaped_call_text(call: dict[str, Any]) -> str:
    """The one call of a :data:`SHAPE_TEXT_AND_CALL` message as written: ``name(key=value)``."""
    ((key, value),) = call["arguments"].items()
    quoted = _encode_string(value)
    if not quoted.isascii():
        quoted = escape_lone_surrogates(quoted)
    return f"{call['name']}({key}={quoted})"


def serialize_shaped(
    messages: Iterable[Message], shapes: Iterable[int], parts: Iterable[Any] | None = None
) -> list[str]:
    """:func:`serialize_message` of each message, given the shapes :func:`measure_shaped` told.

    A summary request serializes thousands of messages (issue 9). Their shapes were found when
    the context measured them, so the usual ones are written here without checking them again
    (and without reading their roles and block types, which a cold cache makes dear). ``parts``
    are the text and call of each message (:func:`shaped_parts`), two items per message, as the
    context kept them; without them they are read here.
    """
    if parts is None:
        messages, shapes = tuple(messages), tuple(shapes)
        parts = itertools.chain.from_iterable(map(shaped_parts, messages, shapes))
    pairs = iter(parts)
    return [
        USER_LABEL + text
        if shape == SHAPE_USER_TEXT
        else TOOL_RESULT_LABEL + text
        if shape == SHAPE_SHORT_RESULT
        else ASSISTANT_LABEL + text + CALLS_AFTER_TEXT + call
        if shape == SHAPE_TEXT_AND_CALL
        else serialize_message(message)
        for message, shape, text, call in zip(messages, shapes, pairs, pairs, strict=True)
    ]


def _call_units(block: dict[str, Any]) -> int:
    """``utf16_len(format_tool_call(...))`` of a tool call block, its strings measured unwritten."""
    units = utf16_len(str(block.get("name", ""))) + 2  # the parentheses
    arguments = block.get("arguments")
    if not isinstance(arguments, dict) or not arguments:
        return units
    for key, value in arguments.items():
        size = json_string_len(value) if isinstance(value, str) else utf16_len(js_json(value))
        units += utf16_len(str(key)) + size + 3  # '=' and ', '
    return units - 2  # no ', ' after the last


def _text_units(content: object) -> tuple[int, bool] | None:
    """Units and ASCII-ness of ``"".join(_texts(content))``; ``None`` for a non-string text."""
    if isinstance(content, str):
        return utf16_len(content), content.isascii()
    if not isinstance(content, list):
        return 0, True
    units, ascii_only = 0, True
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text") or ""
            if not isinstance(text, str):
                return None
            units += utf16_len(text)
            ascii_only = ascii_only and text.isascii()
    return units, ascii_only


def _assistant_block_units(content: list[Any]) -> tuple[int, int, int, int] | None:
    """Counts and units of text and tool call blocks; ``None``: a non-string text."""
    texts = calls = text_units = call_units = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text") or ""
            if not isinstance(text, str):
                return None
            texts += 1
            text_units += utf16_len(text)
        elif kind == "toolCall":
            calls += 1
            call_units += _call_units(block)
    return texts, text_units, calls, call_units


def _assistant_units(content: object) -> int | None:
    if isinstance(content, str):
        return len(ASSISTANT_LABEL) + utf16_len(content)
    if not isinstance(content, list):
        return 0
    counted = _assistant_block_units(content)
    return None if counted is None else _assistant_total(counted)


def _assistant_total(counted: tuple[int, int, int, int]) -> int:
    """Units of an assistant message's paragraphs from its block counts and units."""
    texts, text_units, calls, call_units = counted
    # Each part: label, items joined by a newline (calls by "; "); parts joined by a blank line.
    units = parts = 0
    if texts:
        units += len(ASSISTANT_LABEL) + text_units + texts - 1
        parts += 1
    if calls:
        units += len(CALLS_LABEL) + call_units + 2 * (calls - 1)
        parts += 1
    return units + len(PARAGRAPH_SEPARATOR) * (parts - 1) if parts else 0


def _tool_result_units(text_units: int, ascii_only: bool) -> int | None:
    if not text_units:
        return 0
    if text_units <= TOOL_RESULT_MAX_CHARS:
        return len(TOOL_RESULT_LABEL) + text_units
    if not ascii_only:  # the cut may move off a surrogate pair: measure the text
        return None
    cut = f"\n\n[... {text_units - TOOL_RESULT_MAX_CHARS} more characters truncated]"
    return len(TOOL_RESULT_LABEL) + TOOL_RESULT_MAX_CHARS + len(cut)


# Roles that are (or pi's convertToLlm turns into) a user message of their own content.
_AS_USER = frozenset({"user", "custom", "hookMessage", "developer"})

LATE_ROLES = frozenset({"compactionSummary", "branchSummary"})
"""Roles measured late, on first use: their text is a prompt template around the summary, and
reading the templates is not something every command should pay for while loading."""


def serialized_length(message: Message) -> int:
    """``utf16_len(serialize_message(message))``, mostly without building the text.

    The usual shapes (user text, assistant text and tool calls, tool results) are
    measured from their parts; anything else is serialized and measured.
    """
    role = message.get("role")
    units: int | None = None
    if role == "assistant":
        units = _assistant_units(message.get("content"))
    elif role in _AS_USER or (role == "toolResult" and message.get("prunedAt") is None):
        measured = _text_units(message.get("content"))
        if measured is not None:
            size, ascii_only = measured
            if role == "toolResult":
                units = _tool_result_units(size, ascii_only)
            else:
                units = len(USER_LABEL) + size if size else 0
    if units is None:
        units = utf16_len(serialize_message(message))
    return units


def _measure_texts(content: object) -> tuple[int, int, bool, str] | None:
    """Text units, image count, ASCII-ness and last text of a user or tool result content."""
    if isinstance(content, str):
        return utf16_len(content), 0, content.isascii(), content
    units = images = 0
    ascii_only = True
    text = ""
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text") or ""
            if not isinstance(text, str):
                return None
            units += utf16_len(text)
            ascii_only = ascii_only and text.isascii()
        elif kind == "image":
            images += 1
    return units, images, ascii_only, text


def _measure_call(block: dict[str, Any]) -> tuple[int, int, bool] | None:
    """Estimate chars and serialized units of a tool call, and whether it is the usual one.

    The usual call has one argument, and it and the name are strings. ``None``: a name that is
    not a string.
    """
    name = block.get("name")
    arguments = block.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return _measure_unusual_call(block)
    name_units = utf16_len(name)
    if not arguments:
        return name_units + 2, name_units + 2, False  # {} and ()
    chars = 1  # JSON.stringify: the braces, less the comma after the last pair
    units = name_units  # name(k=v, ...): the parentheses, less the ", " after the last pair
    for key, value in arguments.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            return _measure_unusual_call(block)
        size = json_string_len(value)
        chars += json_string_len(key) + size + 2
        units += utf16_len(key) + size + 3
    return name_units + chars, units, len(arguments) == 1


def _measure_unusual_call(block: dict[str, Any]) -> tuple[int, int, bool] | None:
    """:func:`_measure_call` of a call whose name or arguments are not all strings."""
    name = block.get("name") or ""
    if not isinstance(name, str):
        return None
    return utf16_len(name) + json_length(block.get("arguments", {})), _call_units(block), False


def _measure_assistant(content: list[Any]) -> tuple[int, int, int, Any, Any] | None:
    chars = thinking = texts = calls = text_units = call_units = 0
    usual = None  # the last tool call's block when it is the usual call (one string argument)
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" or kind == "thinking":
            text = block.get(kind) or ""
            if not isinstance(text, str):
                return None
            size = utf16_len(text)
            chars += size
            if kind == "text":
                texts += 1
                text_units += size
            else:  # counted in the estimate, left out of the summary request (pi 1.2)
                thinking += 1
        elif kind == "toolCall":
            measured = _measure_call(block)
            if measured is None:
                return None
            chars += measured[0]
            calls += 1
            call_units += measured[1]
            usual = block if measured[2] else None
    units = _assistant_total((texts, text_units, calls, call_units))
    if usual is not None and calls == 1 and texts == 1 and not thinking and len(content) == 2:
        first = content[0]  # a dict: both blocks were counted
        text = first.get("text")
        if first.get("type") == "text" and type(text) is str:
            return -(-chars // 4), units, SHAPE_TEXT_AND_CALL, text, _shaped_call_text(usual)
    return -(-chars // 4), units, SHAPE_OTHER, None, None


def measure(message: Message) -> tuple[int, int]:
    """``(estimate_tokens(message), serialized_length(message))``, in one pass where it can.

    The context measures every message it takes in; for the usual shapes one walk over the
    blocks gives both numbers.
    """
    estimate, units, _, _, _ = measure_shaped(message)
    return estimate, units


def measure_shaped(message: Message) -> tuple[int, int, int, Any, Any]:
    """:func:`measure`, the shape for :func:`serialize_shaped` (``SHAPE_*``) and the parts.

    The shape comes from the same walk: the checks that tell it are the ones the measure makes.
    So do the parts, what :func:`shaped_parts` returns (a text, and a call as written): the
    text a reference the walk holds anyway, the call a short string made here, while reading
    them again later costs a summary request a walk over cold dictionaries.
    """
    role = message.get("role")
    content = message.get("content")
    if role == "assistant" and isinstance(content, list):
        measured = _measure_assistant(content)
        if measured is not None:
            return measured
    elif role == "user" or role == "toolResult":
        texts = _measure_texts(content)
        if texts is not None:
            units, images, ascii_only, text = texts
            # One block with text in it is one text block (a string, not empty).
            lone = units and type(content) is list and len(content) == 1
            estimate = -(-(units + IMAGE_CHARS * images) // 4)
            if role == "user":
                serialized = len(USER_LABEL) + units if units else 0
                if lone:
                    return estimate, serialized, SHAPE_USER_TEXT, text, None
                return estimate, serialized, SHAPE_OTHER, None, None
            if message.get("prunedAt") is None:
                result_units = _tool_result_units(units, ascii_only)
                if result_units is not None:
                    if lone and ascii_only and units <= TOOL_RESULT_MAX_CHARS:
                        return estimate, result_units, SHAPE_SHORT_RESULT, text, None
                    return estimate, result_units, SHAPE_OTHER, None, None
            return estimate, serialized_length(message), SHAPE_OTHER, None, None
    return estimate_tokens(message), serialized_length(message), SHAPE_OTHER, None, None


def serial_step(units: int) -> int:
    """What one message adds to running sums of serialized lengths: its units and a separator.

    An empty message adds nothing (it leaves no paragraph). The conversation of a run whose
    sums differ by ``s`` is ``max(0, s - 2)`` units long (no separator after the last).
    """
    return units + len(PARAGRAPH_SEPARATOR) if units else 0
