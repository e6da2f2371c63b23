"""The turn table's compaction effects: start one, cancel it, and say how it ended.

Split from the turn driver (:mod:`orchestrator._runtime.turn`) by concept: these effects run the
operation machine (``machines/operation.toml``) through the operation runner, stop it when a
row says so, and turn its outcome into the ``auto_compaction_*`` events (automatic) or into the
manual caller's result. Each reports its operation's status; which row follows is the table's
choice. They perform through the driver's narrow
:class:`~orchestrator._runtime.turn_host.Host` interface, never the façade.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from orchestrator._core.tokens import should_compact
from orchestrator._runtime.compact_hooks import overflow_failed_payload
from orchestrator._runtime.driver import Effect, Report
from orchestrator._runtime.replies import OVERFLOW_FAILED, end_payload, outcome_error, still_over
from orchestrator._runtime.turn_host import Host
from orchestrator._runtime.types import OperationOutcome

_ENDED = frozenset({"committed", "skipped", "cancelled", "failed", "conflict"})


class TurnCompactions:
    """The compaction effects of the turn table.

    Args:
        host: The turn driver they perform for.
    """

    def __init__(self, host: Host) -> None:
        self.host: Host = weakref.proxy(host)  # the driver holds these effects (see TurnAgent)

    def effects(self) -> Mapping[str, Effect]:
        """The effect table's entries these perform (a new mapping: this object keeps none)."""
        return {
            "start_threshold_compaction": lambda: self._automatic("threshold"),
            "start_overflow_compaction": lambda: self._automatic("overflow"),
            "start_manual_compaction": self._manual,
            "cancel_compaction": self._cancel,
            "emit_compaction_end": self._emit_end,
            "emit_compaction_aborted": self._emit_aborted,
            "emit_compaction_failed": lambda: self._emit_failure("Auto-compaction failed"),
            "emit_recovery_failed": lambda: self._emit_failure("Context overflow recovery failed"),
            "emit_overflow_failed": self._emit_overflow_failed,
            "report_manual_result": self._report_manual_result,
        }

    async def _automatic(self, reason: str) -> Report | None:
        t = self.host.counters
        t.will_retry = reason == "overflow"
        t.overflow_attempted = t.overflow_attempted or reason == "overflow"
        t.auto_compactions += 1  # D19 counts every automatic compaction, whatever its reason
        self.host.ports.events.emit("auto_compaction_start", reason=reason)
        return await self._run(reason, None, dry_run=False)

    async def _manual(self) -> Report | None:
        request = self.host.manual
        focus, dry_run = (request.focus, request.dry_run) if request else (None, False)
        return await self._run("manual", focus, dry_run=dry_run)

    async def _run(self, reason: str, focus: str | None, *, dry_run: bool) -> Report | None:
        host = self.host
        host.counters.outcome = host.operations.settled = None
        # Started by the turn's first steps (a manual compaction), the compaction goes on with
        # their start slot; after the agent's call the turn holds none (turn.py hand_slot).
        slot = host.hand_slot()

        async def work() -> Report:
            outcome = await host.operations.compaction(
                reason=reason, focus=focus, dry_run=dry_run, slot=slot
            )
            host.counters.outcome = outcome
            return Report(outcome=outcome.status)

        try:
            return await host.in_flight(work)
        finally:
            if slot is not None:
                # The work may never have run (cancelled before its first step); once it ran,
                # the operation gave the slot back (releasing again is a no-op).
                slot.release()

    async def _cancel(self) -> None:
        # The operation settles through its own table's cancel row when its task is cancelled:
        # by the interrupt itself where the compaction ran in the turn's task (driver.py), or
        # here.
        await self.host.machine.stop_in_flight()
        settled = self.host.operations.settled
        if settled is not None:
            self.host.counters.outcome = settled

    async def _emit_end(self) -> None:
        outcome, settings = self.host.counters.outcome, self.host.settings
        payload = end_payload(outcome)
        if outcome is not None and outcome.status == "committed":
            payload["willRetry"] = self.host.counters.will_retry
            # D19: no second compaction in this turn; say so when it did not get under the line.
            estimate = sum(self.host.session().context().estimates)
            if should_compact(estimate, settings.context_window, settings.compaction):
                payload["stillOverThreshold"] = True
                payload["errorMessage"] = still_over(estimate)
        elif outcome is not None and outcome.status == "skipped":
            payload["skipped"] = True
            payload["reason"] = outcome.reason
        self.host.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_aborted(self) -> None:
        payload = {**end_payload(self.host.counters.outcome), "aborted": True}
        self.host.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_failure(self, what: str) -> None:
        outcome = self.host.counters.outcome
        payload = {**end_payload(outcome), "errorMessage": f"{what}: {outcome_error(outcome)}"}
        self.host.ports.events.emit("auto_compaction_end", **payload)

    async def _emit_overflow_failed(self) -> None:
        ports = self.host.ports
        ports.events.emit(
            "auto_compaction_end",
            result=None,
            aborted=False,
            willRetry=False,
            errorMessage=OVERFLOW_FAILED,
        )
        # No compaction ran, but pi tells its extensions the recovery failed all the same.
        failed = overflow_failed_payload()
        await ports.run_hook("session_compact_failed", {"type": "session_compact_failed", **failed})
        ports.events.emit("session_compact_failed", **failed)

    async def _report_manual_result(self) -> None:
        host = self.host
        outcome = host.counters.outcome
        if host.machine.state == "idle" and (outcome is None or outcome.status not in _ENDED):
            operation_id = outcome.operation_id if outcome else ""
            outcome = OperationOutcome(operation_id=operation_id, status="cancelled")
            host.counters.outcome = outcome
        request, host.manual = host.manual, None
        if request is not None:
            request.outcome = outcome
            request.done.set()
