"""The pluggable agent: what runs one turn, and the litellm chat agent we ship.

An agent turns the live context into new messages. :meth:`Agent.run` is an async iterator: it
yields pi-shaped messages as they complete (assistant replies, tool results) and ends after an
assistant reply that does not ask for tools. The runtime appends every yielded message to the
session, so the file is the record of the turn even when the turn later fails.

A provider failure is not raised: like pi, the agent yields an assistant message with
``stopReason: "error"`` and ``errorMessage``, which is what the turn machine classifies
(overflow, transient, fatal). Only our model errors are failures of that kind: the route already
named them (:class:`~orchestrator._core.errors.ModelError`, with its ``kind``), and the message
keeps that kind as ``errorKind`` (a field pi ignores), so the turn table's overflow and transient
rows follow what the route found rather than a guess from the text. Anything else (a bug such as
a ``TypeError``, a ``Cancelled``, a cancellation) propagates and ends the turn with its own error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator._core.context import ModelRef
from orchestrator._core.entries import Message
from orchestrator._core.errors import ModelError, ModelTimeoutError, error_name
from orchestrator._core.messages import convert_to_llm
from orchestrator._core.model import Model, ModelRequest, ModelResponse
from orchestrator._core.system_prompt import current_system_message, system_text


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentInput:
    """What an agent sees when a turn (or a continuation) starts.

    Attributes:
        messages: The live context (pi message shapes), oldest first.
        model: The model the path selects, if any.
        thinking_level: The path's thinking level.
        now_ms: Clock for message timestamps (epoch ms).
    """

    messages: Sequence[Message]
    model: ModelRef | None
    thinking_level: str
    now_ms: Callable[[], int]


class Agent(Protocol):
    """Runs one turn: yields messages until a reply that asks for no tools."""

    def run(self, turn: AgentInput) -> AsyncIterator[Message]:
        """Yield the turn's messages in order."""
        ...


def assistant_message(
    response: ModelResponse, now_ms: int, *, provider: str = "", model: str = ""
) -> Message:
    """A pi assistant message from a model response."""
    content: list[dict[str, Any]] = []
    if response.thinking:
        content.append({"type": "thinking", "thinking": response.thinking})
    if response.text:
        content.append({"type": "text", "text": response.text})
    for call in response.tool_calls:
        content.append(
            {"type": "toolCall", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {
        "role": "assistant",
        "content": content,
        "provider": response.provider or provider,
        "model": response.model or model,
        "usage": response.usage.as_pi(),
        "stopReason": response.stop_reason,
        "timestamp": now_ms,
    }


def error_message(
    error: BaseException, now_ms: int, *, provider: str = "", model: str = ""
) -> Message:
    """A pi assistant message recording a failed call (``stopReason: "error"``).

    A :class:`ModelError`'s ``kind`` is kept as ``errorKind`` for the turn's classification,
    and its retry-after hint as ``retryAfterMs`` (pi ignores both fields, D2).
    """
    message: Message = {
        "role": "assistant",
        "content": [],
        "provider": provider,
        "model": model,
        "usage": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0},
        "stopReason": "error",
        "errorMessage": str(error) or error_name(error),
        "timestamp": now_ms,
    }
    if isinstance(error, ModelError):
        message["errorKind"] = error.kind
        if error.retry_after is not None and error.retry_after > 0:
            # The provider's Retry-After (a header pi would not see in the text): the turn's
            # retry waits at least this long, as a summary's retry does.
            message["retryAfterMs"] = round(error.retry_after * 1000)
    return message


Tool = Callable[[Mapping[str, Any]], Awaitable[str]]
"""A tool: an async function of the call's arguments returning the result text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool the chat agent may call: its JSON schema and implementation."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    run: Tool

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(slots=True, kw_only=True)
class ChatAgent:
    """An agent over any :class:`~orchestrator.Model` route (the litellm route in practice).

    Args:
        model: The chat route.
        system: The system prompt.
        tools: Tools it may call.
        max_tokens: Output budget per reply.
        max_steps: Safety bound on model calls per turn.
        timeout_s: A model call that has not answered after this many seconds fails as a
            ``timeout`` (an error reply the turn table retries as transient); ``None``: no
            limit (a provider that never answers holds the turn until it is aborted).
    """

    model: Model
    system: str = "You are a helpful coding assistant."
    tools: Sequence[ToolSpec] = ()
    max_tokens: int = 4096
    max_steps: int = 50
    timeout_s: float | None = None
    _by_name: dict[str, ToolSpec] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._by_name = {tool.name: tool for tool in self.tools}

    async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
        """Call the model, run requested tools, repeat until a reply asks for none.

        Every reply with tool calls gets its tools run, whatever its stop reason says, unless
        the reply failed or was aborted (like pi's agent loop).
        """
        messages = list(turn.messages)
        provider, _, model_id = self.model.name.partition("/")
        # pi 1.x keeps the prompt in the session: its system messages, replayed, are the prompt
        # the model gets (the agent's own is for sessions that hold none).
        current = current_system_message(m for m in messages if m.get("role") == "system")
        system = system_text(current) if current is not None else self.system
        for _ in range(self.max_steps):
            request = ModelRequest(
                purpose="chat",
                system=system,
                messages=tuple(convert_to_llm(messages)),
                max_tokens=self.max_tokens,
                tools=tuple(tool.schema() for tool in self.tools),
            )
            try:
                response = await self._complete(request)
            except ModelError as error:
                yield error_message(error, turn.now_ms(), provider=provider, model=model_id)
                return
            reply = assistant_message(response, turn.now_ms(), provider=provider, model=model_id)
            if response.tool_calls and response.stop_reason == "stop":
                # Some providers (and a ModelResponse built with the default) say "stop" beside
                # tool calls. The calls are what matters: an unanswered call would end the turn
                # with a dangling request, so I record the reply as "toolUse" and run them.
                reply["stopReason"] = "toolUse"
            messages.append(reply)
            yield reply
            if not response.tool_calls or response.stop_reason in ("error", "aborted"):
                return
            for call in response.tool_calls:
                result = await self._run_tool(call.name, call.arguments)
                tool_message: Message = {
                    "role": "toolResult",
                    "toolCallId": call.id,
                    "toolName": call.name,
                    "content": [{"type": "text", "text": result[0]}],
                    "isError": result[1],
                    "timestamp": turn.now_ms(),
                }
                messages.append(tool_message)
                yield tool_message

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        from orchestrator._runtime.outcomes import answer_of, within  # the summaries' own

        if self.timeout_s is None:
            return await answer_of(self.model, request)
        sibling = bool(getattr(self.model, "needs_sibling_timer", False))
        response = await within(
            self.timeout_s, answer_of(self.model, request), sibling_timer=sibling
        )
        if response is None:
            raise ModelTimeoutError(f"{self.model.name}: no answer after {self.timeout_s:g} s")
        return response

    async def _run_tool(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        tool = self._by_name.get(name)
        if tool is None:
            return f"Tool {name} not found", True
        try:
            return tool_text(await tool.run(arguments)), False
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to read
            return f"{type(exc).__name__}: {exc}", True


def tool_text(result: object) -> str:
    """A tool's result as the text the file and the model both get.

    A tool should return text; one that returns something else wrote ``"text": null`` (or a
    number) into the session while the model was sent ``"None"``: now both get the same text.
    ``None`` is no output, a dict or list its JSON, anything else its ``str``.
    """
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    if isinstance(result, dict | list):
        import json  # here, not at the top: only an odd tool needs it

        return json.dumps(result, ensure_ascii=False, default=str)
    return str(result)
