"""The one narrow model interface, and its request and response records.

Every model route (litellm, the remote summary endpoint, the offline summarizer, scripted test
models) implements :class:`Model`: one async method taking a :class:`ModelRequest` and returning a
:class:`ModelResponse`. Failures are raised, never returned, as a :class:`~orchestrator.ModelError`
of the failure's class (:class:`~orchestrator.TransientModelError`,
:class:`~orchestrator.ContextOverflowError`, :class:`~orchestrator.FatalModelError` ...), each
naming its ``kind``. Retries and candidate switching live above this interface (decision D21):
an adapter makes exactly one attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Purpose = Literal["history", "turn_prefix", "short", "branch", "chat"]
"""Why a request is made: summaries of each kind, or an agent chat turn."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token usage a provider reported (pi's field names, in snake case)."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total: int = 0

    def as_pi(self) -> dict[str, Any]:
        """The pi ``usage`` object stored on assistant messages."""
        total = self.total or (self.input + self.output + self.cache_read + self.cache_write)
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "totalTokens": total,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """One model call.

    Attributes:
        purpose: What the call is for (chooses budgets and trace names).
        system: The system prompt.
        messages: Chat messages in the OpenAI/litellm format (``role``, ``content``, ...).
        max_tokens: Output budget.
        reasoning: Reasoning effort (``"high"`` ...) when the route supports it, else ``None``.
        tools: Tool schemas (OpenAI format) for chat turns; empty for summaries.
        idle_timeout_s: For a route that streams (``streams = True``): fail the call as a
            ``timeout`` when nothing arrives for this many seconds (``None``: the route's own).
    """

    purpose: Purpose
    system: str
    messages: tuple[dict[str, Any], ...]
    max_tokens: int
    reasoning: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    idle_timeout_s: float | None = None

    @property
    def prompt(self) -> str:
        """The text of the last user message (summaries send exactly one)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):
                    return "".join(b.get("text", "") for b in content if isinstance(b, dict))
        return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call in a model reply."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResponse:
    """A model reply.

    Attributes:
        text: The reply's text (text blocks joined by newlines).
        stop_reason: pi's vocabulary: ``stop``, ``length``, ``toolUse``, ``error``, ``aborted``.
        usage: Reported usage.
        model: The model id that answered.
        provider: The provider name, when known.
        thinking: Reasoning text, when the provider returns it.
        tool_calls: Tool calls, for chat turns.
    """

    text: str
    stop_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    provider: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@runtime_checkable
class Model(Protocol):
    """A model route: one attempt per call, failures raised as ``ModelError``.

    A route may also say ``streams = True`` (an optional attribute, not part of the protocol):
    it receives its answer a piece at a time and fails the call itself when nothing arrives for
    the request's ``idle_timeout_s``, so the runtime gives it no total time limit of a call
    (the operation's deadline still bounds it). Other routes answer in one piece, and the
    runtime ends a call of theirs after ``RuntimeSettings.model_timeout_s`` in all.
    """

    @property
    def name(self) -> str:
        """A stable name for traces and events (``provider/model``)."""
        ...

    @property
    def context_window(self) -> int:
        """The route's context window in tokens (0 when unknown)."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Make one call.

        Raises:
            ModelError: the provider failed; ``kind`` classifies it.
        """
        ...
