"""One process's compaction side of the turn table: run a compaction, cancel it, say how it ended.

The host-agnostic half (the counters, the ``auto_compaction_*`` payloads, whether a manual
result never ended) is :mod:`~orchestrator._runtime.turn.core`; this is what one process
performs for it (:class:`~orchestrator._runtime.turn.core.CompactionSide`): the operation
machine (``machines/operation.toml``) run through the operation runner, stopped when a row says
so, and its outcome handed to the manual caller. They perform through the driver's narrow
:class:`~orchestrator._runtime.turn.host.Host` interface, never the façade.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from orchestrator._lifecycle.names import OperationState, ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.turn.core import Ending, result_fields
from orchestrator._runtime.turn.host import Host
from orchestrator._runtime.types import OperationOutcome


class TurnCompactions:
    """One process's compaction side of the turn table.

    Args:
        host: The turn driver it performs for.
    """

    def __init__(self, host: Host) -> None:
        self.host: Host = weakref.proxy(host)  # the driver holds these effects (see TurnAgent)

    async def compaction(self, reason: str) -> Report | None:
        """Run one compaction operation in flight; its status."""
        host = self.host
        request = host.manual if reason == "manual" else None
        focus, dry_run = (request.focus, request.dry_run) if request else (None, False)
        host.core.counters.outcome = host.operations.settled = None
        # Started by the turn's first steps (a manual compaction), the compaction goes on with
        # their start slot; after the agent's call the turn holds none (turn.py hand_slot).
        slot = host.hand_slot()

        async def work() -> Report:
            outcome = await host.operations.compaction(
                reason=reason, focus=focus, dry_run=dry_run, slot=slot
            )
            host.core.counters.outcome = outcome
            return Report(outcome=ReportOutcome(outcome.status))

        try:
            return await host.in_flight(work)
        finally:
            if slot is not None:
                # The work may never have run (cancelled before its first step); once it ran,
                # the operation gave the slot back (releasing again is a no-op).
                slot.release()

    async def cancel_compaction(self) -> None:
        """Cancel the compaction and wait until it settled."""
        # The operation settles through its own table's cancel row when its task is cancelled:
        # by the interrupt itself where the compaction ran in the turn's task (driver.py), or
        # here.
        await self.host.machine.stop_in_flight()
        settled = self.host.operations.settled
        if settled is not None:
            self.host.core.counters.outcome = settled

    def ending(self) -> Ending | None:
        """How the last compaction ended, with the context's estimate after a commit."""
        outcome = self.host.core.counters.outcome
        if outcome is None:
            return None
        result = outcome.result
        return Ending(
            status=outcome.status,
            reason=outcome.reason,
            error=outcome.error,
            result=None if result is None else result_fields(result),
            estimate_after=sum(self.host.session().context().estimates)
            if outcome.status == OperationState.COMMITTED
            else None,
        )

    async def compact_failed(self, payload: Mapping[str, Any]) -> None:
        """Run the ``session_compact_failed`` hook, then tell the listeners."""
        ports = self.host.ports
        await ports.run_hook(
            "session_compact_failed", {"type": "session_compact_failed", **payload}
        )
        ports.events.emit("session_compact_failed", **payload)

    def hand_manual(self, *, never_ended: bool) -> None:
        """Hand the manual compaction's outcome (``cancelled`` if it never ended) to its caller."""
        host = self.host
        outcome = host.core.counters.outcome
        if never_ended:
            operation_id = outcome.operation_id if outcome else ""
            outcome = OperationOutcome(operation_id=operation_id, status=OperationState.CANCELLED)
            host.core.counters.outcome = outcome
        request, host.manual = host.manual, None
        if request is not None:
            request.outcome = outcome
            request.done.set()
