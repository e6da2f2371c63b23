"""Session entries as pi writes them (pi's session format v3, decisions D1 and D2).

An entry is the JSON object of one line of a session file. I keep it as the plain ``dict`` that
``json.loads`` returned, and treat it as immutable: code that changes an entry (pruning) builds a
new dict. Keeping the raw object is what makes D2 free: fields and entry types we do not know
survive load and rewrite byte-for-byte in meaning, because we never re-encode from a narrower
model. The helpers below read the fields we do know.

Messages (``entry["message"]``) are pi ``AgentMessage`` objects, also plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from datetime import UTC, datetime
from typing import Any

Entry = dict[str, Any]
"""One session entry (or the header), the decoded JSON object of one line."""

Message = dict[str, Any]
"""One agent message (pi ``AgentMessage``): ``role`` plus role-specific fields."""

CURRENT_VERSION = 3

# Entry types the reference defines. Any other type is kept verbatim and ignored (D2).
MESSAGE = "message"
THINKING_LEVEL_CHANGE = "thinking_level_change"
MODEL_CHANGE = "model_change"
COMPACTION = "compaction"
BRANCH_SUMMARY = "branch_summary"
CUSTOM = "custom"
CUSTOM_MESSAGE = "custom_message"
LABEL = "label"
SESSION_INFO = "session_info"
CONTEXT_EDIT = "context_edit"
"""pi 1.x: hides (``replacement: null``) or replaces an earlier entry's content in the context."""
USAGE = "usage"
"""pi 1.x: provider usage not tied to an assistant message (cache warming...); no context."""

EDITABLE_ROLES = frozenset({"user", "assistant", "toolResult", "custom"})
"""Roles whose content a context edit replaces (pi's ``projectContextEntry``)."""

_CONTENT_ARRAY_ROLES = frozenset({"user", "assistant", "toolResult"})


def role_of(entry: Mapping[str, Any]) -> str | None:
    """Return the message role of a ``message`` entry, else ``None``."""
    if entry.get("type") != MESSAGE:
        return None
    message = entry.get("message")
    if not isinstance(message, dict):
        return None
    role = message.get("role")
    return role if isinstance(role, str) else None


def is_from_extension(entry: Mapping[str, Any]) -> bool:
    """True when an extension (hook) produced the entry; ``fromHook`` reads the same (D1)."""
    return bool(entry.get("fromExtension") or entry.get("fromHook"))


_LAST_SECOND: tuple[int, str] = (-(2**63), "")
"""The whole second last formatted by :func:`iso_now`, and its text up to the milliseconds."""


def iso_now(now_ms: int) -> str:
    """Format epoch milliseconds the way pi writes entry timestamps (ISO, ms, ``Z``).

    Every journal record and entry is stamped, thousands a second on a busy server: the date
    and time are formatted once per second, and only the milliseconds each time (issue 9).
    """
    global _LAST_SECOND  # noqa: PLW0603 - a cache: one tuple, replaced whole (thread-safe)
    second, milliseconds = divmod(int(now_ms), 1000)
    last = _LAST_SECOND
    if last[0] != second:
        last = (second, datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S."))
        _LAST_SECOND = last
    return f"{last[1]}{milliseconds:03d}Z"


def iso_to_ms(value: object) -> int:
    """Parse an entry's ISO timestamp into epoch milliseconds (0 when unreadable).

    pi compares message times (epoch ms) with ``Date.parse(entry.timestamp)``; both sides must
    agree, so this mirrors ``Date.parse`` for the ISO strings pi writes.
    """
    if isinstance(value, int | float):
        return int(value)
    if not isinstance(value, str) or not value:
        return 0
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return 0
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(round(parsed.timestamp() * 1000))


def new_entry_id(existing: Container[str], random_hex: Callable[[], str] | None = None) -> str:
    """Return a fresh 8-hex id not in ``existing`` (pi's rule).

    Tries 100 random 8-character prefixes, then falls back to a full UUID, as pi does.

    Args:
        existing: Ids already used in the session.
        random_hex: Source of random hex strings (32 chars); inject it for deterministic tests.

    Returns:
        The new id.
    """
    import uuid  # here, not at the top: reading a session never needs it

    random_hex = random_hex or (lambda: uuid.uuid4().hex)
    for _ in range(100):
        candidate = random_hex()[:8]
        if candidate not in existing:
            return candidate
    return str(uuid.uuid4())


def entry_message(entry: Mapping[str, Any]) -> Message | None:
    """The message an entry contributes to the model's context (as pi's buildSessionContext).

    ``message`` entries give their stored message verbatim; ``custom_message`` and non-empty
    ``branch_summary`` entries give derived ``custom`` / ``branchSummary`` messages. Everything
    else (including compactions, which :func:`compaction_message` handles) gives ``None``.
    """
    kind = entry.get("type")
    if kind == MESSAGE:
        stored = entry.get("message")
        if not isinstance(stored, dict):
            return None
        if stored.get("content") is None:  # pi reads a missing or null content as empty
            role = stored.get("role")
            if role == "system":
                return {**stored, "content": ""}
            if role in _CONTENT_ARRAY_ROLES:
                return {**stored, "content": []}
        return stored
    if kind == CUSTOM_MESSAGE:
        message: Message = {
            "role": "custom",
            "customType": entry.get("customType"),
            "content": entry.get("content"),
            "display": entry.get("display"),
        }
        # pi leaves ``details`` undefined when the entry has none, so the key is absent.
        if "details" in entry:
            message["details"] = entry["details"]
        message["timestamp"] = iso_to_ms(entry.get("timestamp"))
        return message
    if kind == BRANCH_SUMMARY and entry.get("summary"):
        return {
            "role": "branchSummary",
            "summary": entry.get("summary"),
            "fromId": entry.get("fromId"),
            "timestamp": iso_to_ms(entry.get("timestamp")),
        }
    return None


def compaction_message(entry: Mapping[str, Any]) -> Message:
    """The ``compactionSummary`` message a compaction entry becomes in the context."""
    return {
        "role": "compactionSummary",
        "summary": entry.get("summary", ""),
        "tokensBefore": entry.get("tokensBefore", 0),
        "timestamp": iso_to_ms(entry.get("timestamp")),
    }


def compaction_messages(entry: Mapping[str, Any]) -> list[Message]:
    """What the newest compaction of a path gives the context (pi 1.x).

    Its system checkpoint first, if it has one (``systemMessage``, the replayed prompt and tools
    at the boundary), then its summary.
    """
    checkpoint = entry.get("systemMessage")
    summary = compaction_message(entry)
    if isinstance(checkpoint, dict) and checkpoint:
        return [checkpoint, summary]
    return [summary]


def is_system_entry(entry: Mapping[str, Any]) -> bool:
    """True for a ``message`` entry holding a system message (pi 1.x prompt state)."""
    return role_of(entry) == "system"


def project(message: Message, edit: Mapping[str, Any]) -> Message | None:
    """``message`` as a context edit leaves it (pi's ``projectContextEntry``).

    ``replacement: null`` (or absent) omits it; otherwise the replacement's ``content`` takes
    the place of the message's content, for the roles that have content. A string replacement
    of an assistant or tool result becomes one text block: those roles hold arrays.
    """
    replacement = edit.get("replacement")
    if replacement is None:
        return None
    role = message.get("role")
    if role not in EDITABLE_ROLES:
        return message
    if not isinstance(replacement, dict) or "content" not in replacement:
        # JavaScript's `content: undefined`: the key is gone once written as JSON.
        return {key: value for key, value in message.items() if key != "content"}
    content = replacement["content"]
    if role in ("assistant", "toolResult") and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return {**message, "content": content}


def text_of(content: object, separator: str = "") -> str:
    """Join the text blocks of a message content (a string passes through).

    pi joins them without a separator where it serializes a conversation, and with a newline
    where it renders a prompt (pi-ai's ``contentText``).
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return separator.join(
        text
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(text := block.get("text", ""), str)  # anything else: a damaged file (D3)
    )
