"""Public test doubles: scripted and function-backed models, a fake clock, a local provider.

These ship with the library (pydantic-ai's habit) so that your tests, like ours, can make a
model fail, stall, truncate or get cancelled at a chosen call without a network or a real
sleep:

* :class:`ScriptedModel` answers each call with the next item of its script: a
  :class:`~orchestrator.ModelResponse`, a string (a plain ``stop`` reply), an exception to
  raise, a :class:`Delay` (wait on the clock, then answer) or :class:`Hang` (wait until
  cancelled). It records every request.
* :class:`FunctionModel` wraps an async function of the request.
* :class:`FakeClock` is a monotonic clock whose ``sleep`` advances time instantly (after a
  cancellation checkpoint, so a cancelled scope still interrupts it).
* :class:`ScriptedAgent` plays scripted agent turns (with :func:`reply`, :func:`tool_result`,
  :func:`error_reply` and :class:`AgentHang`) for runtime tests and simulations.
* :func:`summary_text` writes a summary the summary gate passes (D32).
* :class:`LocalProvider` and :class:`Reply` run a real OpenAI-compatible HTTP server on
  127.0.0.1 for adapter tests (see :mod:`orchestrator.testing._provider`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

import anyio
import anyio.lowlevel

from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator.testing._agent import (
    AgentHang,
    ScriptedAgent,
    error_reply,
    reply,
    tool_result,
    usage,
)
from orchestrator.testing._provider import LocalProvider, RecordedRequest, Reply

__all__ = (
    "AgentHang",
    "Delay",
    "FakeClock",
    "FunctionModel",
    "Hang",
    "LocalProvider",
    "RecordedRequest",
    "Reply",
    "ScriptedAgent",
    "ScriptedModel",
    "error_reply",
    "reply",
    "summary_text",
    "tool_result",
    "usage",
)


class FakeClock:
    """A monotonic clock that only moves when told to, or when something sleeps on it.

    Call the clock for the current time. ``await clock.sleep(s)`` checks for cancellation,
    then advances the time by ``s`` and records it in :attr:`sleeps`; it never blocks.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        """The current fake time, in seconds."""
        return self._now

    @property
    def now(self) -> float:
        """The current fake time, in seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go back in time")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        """Pretend to sleep: a cancellation checkpoint, then time jumps ahead."""
        await anyio.lowlevel.checkpoint()
        self.sleeps.append(seconds)
        self.advance(max(seconds, 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Delay:
    """A script step: wait ``seconds`` on the model's clock, then answer with ``then``."""

    seconds: float
    then: ScriptItem


@dataclass(frozen=True, slots=True, kw_only=True)
class Hang:
    """A script step: never answer; only cancellation ends the call."""


ScriptItem: TypeAlias = "ModelResponse | str | BaseException | Delay | Hang"
"""One scripted answer."""


class ScriptedModel:
    """A model that answers from a script, one item per call, and records every request.

    Args:
        script: The answers, in call order.
        name: The model name reported in traces.
        context_window: The window to report.
        clock: Used by :class:`Delay` steps (a fresh :class:`FakeClock` by default).

    Raises:
        RuntimeError: from ``complete`` when the script is exhausted (a bug in the test).
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        name: str = "scripted/model",
        context_window: int = 128_000,
        clock: FakeClock | None = None,
    ) -> None:
        self._script: deque[ScriptItem] = deque(script)
        self._name = name
        self._context_window = context_window
        self.clock = clock if clock is not None else FakeClock()
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        """The configured name."""
        return self._name

    @property
    def context_window(self) -> int:
        """The configured window."""
        return self._context_window

    @property
    def remaining(self) -> int:
        """How many scripted answers are left."""
        return len(self._script)

    def push(self, *items: ScriptItem) -> None:
        """Append answers to the script."""
        self._script.extend(items)

    def clear(self) -> None:
        """Drop the answers not used yet."""
        self._script.clear()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Record the request and play the next script item."""
        self.requests.append(request)
        if not self._script:
            raise RuntimeError(f"{self._name}: no scripted answer for call {len(self.requests)}")
        return await self._play(self._script.popleft())

    async def _play(self, item: ScriptItem) -> ModelResponse:
        if isinstance(item, Delay):
            await self.clock.sleep(item.seconds)
            return await self._play(item.then)
        if isinstance(item, Hang):
            await anyio.Event().wait()  # nobody sets it: only cancellation gets out
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str):
            return ModelResponse(text=item, model=self._name, provider="scripted")
        assert isinstance(item, ModelResponse)
        return item


class FunctionModel:
    """A model backed by an async function of the request.

    Args:
        function: Returns a :class:`~orchestrator.ModelResponse` or a string (a ``stop`` reply);
            raises to fail.
        name: The model name reported in traces.
        context_window: The window to report.
    """

    def __init__(
        self,
        function: Callable[[ModelRequest], Awaitable[ModelResponse | str]],
        *,
        name: str = "function/model",
        context_window: int = 128_000,
    ) -> None:
        self._function = function
        self._name = name
        self._context_window = context_window
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        """The configured name."""
        return self._name

    @property
    def context_window(self) -> int:
        """The configured window."""
        return self._context_window

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Record the request and return what the function gives."""
        self.requests.append(request)
        result = await self._function(request)
        if isinstance(result, str):
            return ModelResponse(text=result, model=self._name, provider="function")
        return result


def summary_text(note: str = "Work summarized.", *, purpose: str = "history") -> str:
    """A summary in the layout the prompts ask for, which the summary gate passes (D32).

    Script it where a test needs a model's summary to be committed, since the gate refuses
    a bare placeholder ("summary") as having none of the required sections.

    Args:
        note: A line put in the first section, for the test to find.
        purpose: ``history`` or ``branch`` (the checkpoint layout), ``turn_prefix`` (its
            own three sections) or ``short`` (the sentence alone).

    Returns:
        The text.
    """
    if purpose == "short":
        return note
    if purpose == "turn_prefix":
        return (
            f"## Original Request\n{note}\n\n## Early Progress\n- (none)\n\n"
            "## Context for Suffix\n- (none)"
        )
    return (
        f"## Goal\n{note}\n\n## Constraints & Preferences\n- (none)\n\n## Progress\n"
        "### Done\n- [x] (none)\n### In Progress\n- [ ] (none)\n### Blocked\n- (none)\n\n"
        "## Key Decisions\n- (none)\n\n## Next Steps\n1. Continue.\n\n## Critical Context\n- (none)"
    )
