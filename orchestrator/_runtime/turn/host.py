"""What the turn table's effects share with the turn driver: a narrow interface, not the driver.

The effects live by concept in :mod:`~orchestrator._runtime.turn.agent_side` (the agent's side: the
user message, the agent run, retry waits, continuing) and
:mod:`~orchestrator._runtime.turn.compaction_side` (compactions and their events); each performs
through this :class:`Host`, which the turn driver implements. The per-turn counters are the
memory they share (:class:`~orchestrator._runtime.turn.core.TurnCore`), as an operation's
effects share their run's fields.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from orchestrator._runtime.admission import Slot
from orchestrator._runtime.driver import Interpreter, Report
from orchestrator._runtime.operation.runner import OperationRunner
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.turn.core import TurnCore
from orchestrator._runtime.types import OperationOutcome, RuntimeSettings
from orchestrator._store.session import Session


@dataclass(slots=True)
class ManualRequest:
    """A manual compaction asked for: its options, and where its outcome is handed over."""

    focus: str | None
    dry_run: bool
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: OperationOutcome | None = None


class Host(Protocol):
    """What the agent and compaction sides use of the turn driver."""

    ports: Ports
    operations: OperationRunner
    settings: RuntimeSettings
    core: TurnCore
    machine: Interpreter
    manual: ManualRequest | None

    def session(self) -> Session:
        """The session driven."""
        ...

    async def in_flight(self, work: Callable[[], Awaitable[Report]]) -> Report | None:
        """Run slow work so that a request can be stepped meanwhile."""
        ...

    def let_slot_go(self) -> None:
        """Give back the start slot the turn's first steps hold, if any (before any wait)."""
        ...

    def hand_slot(self) -> Slot | None:
        """The start slot the turn's first steps hold, if any, for an operation to go on with."""
        ...
