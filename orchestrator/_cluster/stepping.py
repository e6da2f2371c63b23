"""What the workflow-side hosts of the tables share: the journal in transit, work in flight.

Each host (:class:`~orchestrator._cluster.operation.flow.OperationFlow`,
:class:`~orchestrator._cluster.navigation.flow.NavigationFlow`,
:class:`~orchestrator._cluster.turn.flow.TurnFlow`) steps its table with the pure step and
hands each step to the next activity as a :class:`~orchestrator._cluster.calls.JournalLine`.
:class:`JournalLines` keeps the lines not yet handed over; when the activity carrying them is
lost, I cannot know whether it wrote them, so they go back in front and the next activity
resends them (the writer skips those it finds).

:class:`TableFlow` is what the operation and navigation hosts share: it runs the one loop every
host runs (:func:`~orchestrator._runtime.driver.run_table`: step, perform each effect, translate
the report into the next event) and only says how a step is journaled (a line for the next
activity) and how an effect waits (the slow ones in flight, as an asyncio task the workflow
waits on, so an interrupt can be stepped meanwhile). Everything here is deterministic workflow
code: no clock, no id, no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from orchestrator._cluster.calls import JournalLine
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._lifecycle.machine import step as take_step
from orchestrator._runtime.driver import NO_DATA, Report, check_effects, run_table
from orchestrator._telemetry.tracing import facts_delta

__all__ = ["NO_DATA", "JournalLines", "TableFlow", "stop_in_flight"]


class JournalLines:
    """The steps not yet handed to an activity, numbered from 0.

    Args:
        machine: The machine the lines are of (as :class:`JournalLine` names it).
    """

    def __init__(self, machine: str = "operation") -> None:
        self.machine = machine
        self.lines: list[JournalLine] = []
        self.resend = False
        self.seq = 0

    def add(
        self,
        source: str,
        event: str,
        dest: str,
        effects: tuple[str, ...],
        facts: Facts,
        data: Mapping[str, Any] = NO_DATA,
    ) -> None:
        """Keep one step (its facts only where they differ from the defaults)."""
        self.lines.append(
            JournalLine(
                seq=self.seq,
                source=source,
                event=event,
                dest=dest,
                effects=list(effects),
                facts=facts_delta(facts),
                data=dict(data),
                machine=self.machine,
            )
        )
        self.seq += 1

    def take(self) -> tuple[list[JournalLine], bool]:
        """The lines for the next activity, and whether it must resend them."""
        lines, resend = self.lines, self.resend
        self.lines, self.resend = [], False
        return lines, resend

    def lost(self, lines: list[JournalLine]) -> None:
        """The activity carrying ``lines`` failed: I cannot know whether it wrote them."""
        self.lines = list(lines) + self.lines
        self.resend = True


async def stop_in_flight(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` if it still runs and wait until it settled (D22)."""
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ActivityError):
            await task


class TableFlow(ABC):
    """Steps one table to a final state inside the workflow, its effects performed here.

    Args:
        defn: The table.
        effects: What performs each of its effects.
        awaiting: The effects that await something slow: they run in flight, so an interrupt
            arriving meanwhile is stepped (and the row's stop effect cancels them).
        machine: The machine the journal lines are of.

    Raises:
        DefinitionError: The effect table does not match the table.
    """

    def __init__(
        self,
        defn: MachineDef,
        effects: Mapping[str, Callable[[], Awaitable[Report | None]]],
        *,
        awaiting: frozenset[str],
        machine: str = "operation",
    ) -> None:
        check_effects(defn, effects)
        self.defn = defn
        self.effects = effects
        self.awaiting = awaiting
        self.state = defn.initial
        self.journal = JournalLines(machine)
        self._interrupts: list[str] = []
        self._in_flight: asyncio.Task[Report | None] | None = None

    @property
    def done(self) -> bool:
        """Whether the machine rests in a final state."""
        return self.state in self.defn.final

    def interrupt(self, event: str) -> None:
        """Record ``cancel`` or ``deadline_passed``; the table decides what it means now."""
        if not self.done and self.defn.rows_for(self.state, event):
            self._interrupts.append(event)

    @abstractmethod
    def _translate(self, effect: str, report: Report) -> tuple[str, Facts, Mapping[str, Any]]:
        """The event ``effect``'s report fires, the facts its guards read, and its data."""

    def _journal_data(self, source: str, dest: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """What the journal line of a step from ``source`` to ``dest`` keeps of its data."""
        return NO_DATA

    async def _steps(self, event: str | None, facts: Facts, data: Mapping[str, Any]) -> None:
        """Step ``event`` and what its effects report until the table rests."""
        await run_table(self, event, facts, data)

    # -- the loop's words (driver.TableHost) ------------------------------------------------------

    async def step(self, event: str, facts: Facts, data: Mapping[str, Any]) -> tuple[str, ...]:
        """Take one step and keep its journal line; the row's effects."""
        taken = take_step(self.defn, self.state, event, facts)
        self.state = taken.dest
        kept = self._journal_data(taken.source, taken.dest, data)
        self.journal.add(taken.source, event, taken.dest, taken.effects, facts, kept)
        return taken.effects

    async def perform(self, name: str) -> Report | None:
        """Perform one effect; a slow one as a task, until it reports or an interrupt came."""
        if name not in self.awaiting:
            return await self.effects[name]()
        task = asyncio.ensure_future(self.effects[name]())
        self._in_flight = task
        await workflow.wait_condition(lambda: task.done() or bool(self._interrupts))
        if task.done():
            self._in_flight = None
            return task.result()
        return None

    def interrupted(self) -> tuple[str, Facts] | None:
        """The oldest pending interrupt (removed), if the table lists it now."""
        if self._interrupts:
            pending = self._interrupts.pop(0)
            if self.defn.rows_for(self.state, pending):
                return pending, self.defn.guards.facts()
        return None

    def translate(self, effect: str, report: Report) -> tuple[str, Facts, Mapping[str, Any]]:
        """The event ``effect``'s report fires (the host's :meth:`_translate`)."""
        return self._translate(effect, report)

    async def _stop_in_flight(self) -> None:
        task, self._in_flight = self._in_flight, None
        await stop_in_flight(task)
