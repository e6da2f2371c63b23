"""A scripted agent for tests and simulations (public through ``orchestrator.testing``).

Each :meth:`ScriptedAgent.run` plays the next turn of the script: it yields the turn's messages
in order (filling in timestamps), so a test decides exactly what the "model" answered: a plain
reply with a given usage, a tool call and its result, a provider error, a reply stopped by the
length limit, or a hang that only cancellation ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio

from orchestrator._core.entries import Message
from orchestrator._runtime.agent import AgentInput

PROVIDER = "scripted"
MODEL = "agent"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentHang:
    """A script step: the agent never answers; only an abort ends it."""


AgentStep: TypeAlias = "Message | AgentHang"
"""One step of a scripted turn: a message to yield, or a hang."""


def usage(total: int = 0) -> dict[str, Any]:
    """A pi usage object whose input is ``total`` tokens."""
    return {
        "input": total,
        "output": 0,
        "cacheRead": 0,
        "cacheWrite": 0,
        "totalTokens": total,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
    }


def reply(
    text: str = "Done.",
    *,
    tokens: int = 0,
    stop: str = "stop",
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
) -> Message:
    """An assistant reply; ``calls`` are ``(call id, tool name, arguments)`` tool calls."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "toolCall", "id": i, "name": n, "arguments": a} for i, n, a in calls]
    return {
        "role": "assistant",
        "content": content,
        "provider": PROVIDER,
        "model": MODEL,
        "usage": usage(tokens),
        "stopReason": "toolUse" if calls else stop,
    }


def tool_result(call_id: str, text: str, *, tool: str = "read", error: bool = False) -> Message:
    """A tool result answering ``call_id``."""
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": tool,
        "content": [{"type": "text", "text": text}],
        "isError": error,
    }


def error_reply(message: str) -> Message:
    """An assistant message recording a provider failure (``stopReason: "error"``)."""
    return {
        "role": "assistant",
        "content": [],
        "provider": PROVIDER,
        "model": MODEL,
        "usage": usage(0),
        "stopReason": "error",
        "errorMessage": message,
    }


class ScriptedAgent:
    """An agent that plays scripted turns and records what it was given.

    Args:
        turns: One sequence of steps per run, in order. When the script runs out, each further
            run yields a plain ``Done.`` reply.
    """

    def __init__(self, turns: Iterable[Sequence[AgentStep]] = ()) -> None:
        self._turns: deque[Sequence[AgentStep]] = deque(turns)
        self.inputs: list[AgentInput] = []

    def push(self, *turns: Sequence[AgentStep]) -> None:
        """Append turns to the script."""
        self._turns.extend(turns)

    def clear(self) -> None:
        """Drop the turns not played yet."""
        self._turns.clear()

    @property
    def remaining(self) -> int:
        """Turns left in the script."""
        return len(self._turns)

    async def run(self, turn: AgentInput) -> AsyncIterator[Message]:
        """Yield the next scripted turn's messages."""
        self.inputs.append(turn)
        steps: Sequence[AgentStep] = self._turns.popleft() if self._turns else (reply(),)
        for step in steps:
            if isinstance(step, AgentHang):
                await anyio.Event().wait()  # nobody sets it: only cancellation gets out
                continue
            message = dict(step)
            message.setdefault("timestamp", turn.now_ms())
            yield message
