"""What the turn flow's two sides share with it: the journal, work in flight, the events.

:class:`~orchestrator._cluster.turn.flow.TurnFlow` performs the turn table's effects through two
sides written apart, :class:`~orchestrator._cluster.turn.agent.FlowAgent` (the agent's run and the
entries it appends) and :class:`~orchestrator._cluster.turn.compactions.FlowCompactions` (the
operations a turn starts), as the one-process driver's effects are split by concept
(:mod:`~orchestrator._runtime.turn.host`). Unlike those, the sides are mixins of the flow, not
objects it holds: the workflow's state stays in one object, as it was before the split. This
class names what both sides use of the flow; each side names what only it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator._cluster.calls import JournalLine, TurnCall
from orchestrator._cluster.stepping import JournalLines

T = TypeVar("T")


class FlowHost:
    """What the agent and compaction sides use of the turn flow (``TurnFlow`` has all of it)."""

    # The flow's fields both sides use (set by TurnFlow.__init__).
    session_id: str
    journal: JournalLines
    _task: asyncio.Task[Any] | None

    if TYPE_CHECKING:
        # Declared for the type checker only: TurnFlow defines them, and a stub that existed at
        # run time could only ever shadow the real one.

        def emit(self, type_: str, **payload: Any) -> None: ...

        async def _in_flight(self, work: Callable[[], Awaitable[T]]) -> T | None: ...

        def _call(self, **kwargs: Any) -> tuple[TurnCall, list[JournalLine]]: ...
