"""From context messages to what a model reads (pi's convertToLlm).

Theory of operation. The context holds pi ``AgentMessage`` dicts of seven roles. Models know only
three (user, assistant, tool result), so I convert in two steps:

1. :func:`to_llm_messages` is pi's ``convertToLlm``: shell runs, custom messages (and OMP's
   legacy ``hookMessage`` and ``developer`` messages) and the two kinds of summaries become user
   messages; pruned tool results (``prunedAt`` set) show only their text, which the pruner made
   the notice (OMP, D23). Roles we do not know are left out (D2).
   Its output is still pi-shaped, which is what the summarizer's serializer reads.
2. :func:`convert_to_llm` turns that into OpenAI/litellm chat messages for a chat model, and also
   repairs what providers reject: replies that ended in an error or were aborted are left out
   (their half-made tool calls would have no results), tool results whose call is not in the
   request are dropped, and calls that never got a result get a placeholder result. pi's
   provider layer does the same before it sends anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator._core.entries import Message, text_of

PRUNED_FALLBACK = "[Output truncated]"
"""Shown for a pruned tool result that kept no text at all (OMP)."""

NO_RESULT = "No result provided"
"""The placeholder result for a tool call whose result is not in the context."""

SUMMARY_ROLES = frozenset({"compactionSummary", "branchSummary"})
"""Roles whose model text is a prompt template around the summary."""

TOOL_IMAGES_LEAD = "Attached image(s) from tool result:"
"""Text of the user message that carries tool-result images (tool messages take text only)."""


def bash_execution_text(message: Message) -> str:
    """The user text a ``bashExecution`` message becomes (pi ``bashExecutionToText``)."""
    text = f"Ran `{message.get('command', '')}`\n"
    output = message.get("output")
    text += f"```\n{output}\n```" if output else "(no output)"
    exit_code = message.get("exitCode")
    if message.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif exit_code is not None and exit_code != 0:
        text += f"\n\nCommand exited with code {exit_code}"
    if message.get("truncated") and message.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {message['fullOutputPath']}]"
    return text


def _user(text_or_blocks: object, timestamp: object) -> Message:
    content = text_or_blocks
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    elif not isinstance(content, list):
        content = []
    return {"role": "user", "content": content, "timestamp": timestamp}


def to_llm_message(message: Message) -> Message | None:
    """One message as pi's ``convertToLlm`` converts it: what a model reads, or ``None`` (D2)."""
    role = message.get("role")
    stamp = message.get("timestamp")
    if role in ("user", "assistant"):
        return message
    if role == "toolResult":
        if message.get("prunedAt") is None:
            return message
        text = text_of(message.get("content")) or PRUNED_FALLBACK
        return {**message, "content": [{"type": "text", "text": text}]}
    if role == "bashExecution":
        if message.get("excludeFromContext"):
            return None
        return _user(bash_execution_text(message), stamp)
    if role in ("custom", "hookMessage", "developer"):
        return _user(message.get("content"), stamp)
    if role in SUMMARY_ROLES:
        # Here, not at the top: the templates are read on first use, which only summaries need.
        from orchestrator._core.prompts import render

        template = "compaction_context" if role == "compactionSummary" else "branch_context"
        return _user(render(template, summary=str(message.get("summary", ""))), stamp)
    # Roles we do not know take no part in the context (D2).
    return None


def to_llm_messages(messages: Iterable[Message]) -> list[Message]:
    """Apply pi's ``convertToLlm``: each message becomes a pi user, assistant or toolResult one.

    Args:
        messages: Context messages, oldest first.

    Returns:
        New messages; inputs are never changed.
    """
    converted = (to_llm_message(message) for message in messages)
    return [message for message in converted if message is not None]


def _blocks(content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict)]


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    url = f"data:{block.get('mimeType', 'image/png')};base64,{block.get('data', '')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in _blocks(content):
        if block.get("type") == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image":
            parts.append(_image_part(block))
    return parts


def _assistant(message: Message) -> tuple[dict[str, Any] | None, dict[str, str]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(message.get("content")):
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "toolCall":
            arguments = json.dumps(
                block.get("arguments") or {}, separators=(",", ":"), ensure_ascii=False
            )
            function = {"name": block.get("name", ""), "arguments": arguments}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
    text = "".join(texts)
    if not text and not calls:
        return None, {}
    chat: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        chat["tool_calls"] = calls
    return chat, {call["id"]: call["function"]["name"] for call in calls}


class _Converter:
    """Accumulates chat messages, tracking tool calls that still wait for a result."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.pending: dict[str, str] = {}
        self.images: list[dict[str, Any]] = []

    def flush(self) -> None:
        # Placeholders first: every call must be answered before the next non-tool message.
        for call_id in self.pending:
            self.out.append({"role": "tool", "tool_call_id": call_id, "content": NO_RESULT})
        self.pending = {}
        if self.images:
            lead = {"type": "text", "text": TOOL_IMAGES_LEAD}
            self.out.append({"role": "user", "content": [lead, *self.images]})
            self.images = []

    def tool_result(self, message: Message) -> None:
        call_id = message.get("toolCallId")
        if not isinstance(call_id, str) or self.pending.pop(call_id, None) is None:
            return  # Orphan result: providers refuse a result without its call.
        blocks = _blocks(message.get("content"))
        text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        images = [_image_part(b) for b in blocks if b.get("type") == "image"]
        if not text and images:
            text = "(see attached image)"
        self.out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        self.images.extend(images)

    def add(self, message: Message) -> None:
        role = message["role"]
        if role == "toolResult":
            self.tool_result(message)
            return
        self.flush()
        if role == "user":
            self.out.append({"role": "user", "content": _user_content(message.get("content"))})
        elif message.get("stopReason") not in ("error", "aborted"):
            chat, calls = _assistant(message)
            if chat is not None:
                self.out.append(chat)
                self.pending = calls


def convert_to_llm(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Convert context messages to OpenAI/litellm chat messages.

    Args:
        messages: Context messages (pi shapes), oldest first.

    Returns:
        Chat messages with roles ``user``, ``assistant`` (text plus ``tool_calls`` whose
        ``arguments`` are JSON strings) and ``tool`` (with ``tool_call_id``).
    """
    converter = _Converter()
    for message in to_llm_messages(messages):
        converter.add(message)
    converter.flush()
    return converter.out
