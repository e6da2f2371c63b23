"""The system prompt a context carries (pi 1.x system messages and checkpoints).

pi 1.x keeps the prompt and the tool loadout in the session itself: the first request persists a
``system`` message with every prompt section and tool declaration, and each later change a
``system`` message that patches ``sections`` by name (``null`` removes one) and lists
``toolsAdded`` / ``toolsRemoved``. Replaying them in order gives the current prompt. A compaction
stores that replay as its ``systemMessage`` (the checkpoint), which leads the compacted context.

:func:`current_system_message` is that replay (pi-ai's ``getCurrentSystemMessage``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator._core.entries import Message, text_of


def _content_text(content: object) -> str:
    # pi-ai's contentText: a string as it is, else the text blocks joined by a newline.
    return text_of(content, "\n")


def _named(tools: object) -> Iterable[dict[str, Any]]:
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            yield tool


def _patch(sections: dict[str, Any], patch: object) -> None:
    # Sections are patched by name; a null removes one.
    for name, value in patch.items() if isinstance(patch, dict) else ():
        if value is None:
            sections.pop(name, None)
        else:
            sections[name] = value


def current_system_message(messages: Iterable[Message]) -> Message | None:
    """Replay every system message of ``messages`` into one (pi's ``getCurrentSystemMessage``).

    Later ``content`` is appended to the base prompt (blank line between), ``sections`` are
    patched by name, and tools are resolved in order (removed, then added, by name).

    Returns:
        The replayed system message, or ``None`` when there is none and no tool is declared.
    """
    content: list[str] = []
    sections: dict[str, Any] = {}
    tools: dict[str, dict[str, Any]] = {}
    timestamp: object = None
    for message in messages:
        if message.get("role") != "system":
            continue
        if timestamp is None:  # the first one that has a time
            timestamp = message.get("timestamp")
        text = _content_text(message.get("content"))
        if text:
            content.append(text)
        _patch(sections, message.get("sections"))
        for tool in _named(message.get("toolsRemoved")):
            tools.pop(tool["name"], None)
        for tool in _named(message.get("toolsAdded")):
            tools[tool["name"]] = tool  # redeclared: replaced in place, as in a Map
    if timestamp is None and not tools:  # pi's test, even when a message had sections
        return None
    replayed: Message = {"role": "system", "content": "\n\n".join(content)}
    if sections:
        replayed["sections"] = sections
    if tools:
        replayed["toolsAdded"] = list(tools.values())
    replayed["timestamp"] = timestamp if timestamp is not None else 0
    return replayed


def system_text(message: Message) -> str:
    """A system message as one prompt text (pi-ai's ``getSystemMessageText``).

    Its content, then its sections, blank lines between, empty parts left out.
    """
    parts = [_content_text(message.get("content"))]
    sections = message.get("sections")
    if isinstance(sections, dict):
        parts += [text for text in sections.values() if isinstance(text, str)]
    return "\n\n".join(part for part in parts if part)
