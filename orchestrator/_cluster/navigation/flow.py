"""The navigation table hosted in the session workflow: the same pure step, effects as activities.

Theory of operation. :class:`NavigationFlow` is the workflow-side twin of the one-process
:class:`~orchestrator._runtime.navigation.driver.Navigator`. It steps ``machines/navigation.toml``
only through the pure :func:`~orchestrator._lifecycle.machine.step`, translating each effect's
report into the next event exactly as the navigator does, so whether to summarize, attach a hook's
summary, only move the leaf, or stop is the table's choice on both hosts.

The first step's facts come from the store (``nav_start``: the leaf, and whether the target is
it) unless the session is working (a compaction, a turn), when the ``turn_running`` row refuses
the navigation before anything is read. The effects:

* ``collect_entries``, ``run_hooks``, ``switch_leaf``, ``switch_leaf_with_summary`` and
  ``emit_session_tree`` are activities (:mod:`orchestrator._cluster.navigation.activities`), one
  attempt each; the writes (the leaf move, the label) are idempotent by entry ids derived here
  from the navigation id, so they may be delivered again after a lost worker.
* ``start_summary`` runs the branch summary as an operation, the shared
  :class:`~orchestrator._cluster.operation.flow.OperationFlow` over the operation table's
  branch-summary rows (``Op.kind == "branch_summary"``); its commit attaches the summary at the new
  position.
* ``stop_hooks`` cancels a ``session_before_tree`` activity still in flight (its heartbeat
  delivers the cancel) and waits for it to settle.
* ``cancel_summary`` interrupts that operation (its own ``cancel`` row stops the model call,
  D22) and waits for it to settle; ``rebuild_context`` has nothing to do (each read is fresh).

Journal lines ride with the next activity, as the operation's do; ``abort`` (a signal) only
records ``cancel``, which the loop steps through the table when the table lists it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

from orchestrator._cluster.calls import Nav, NavCall, NavReported, Op, derived_id
from orchestrator._cluster.contract import CompressResult, NavigateResult
from orchestrator._cluster.operation.flow import DELIVER, HEARTBEAT, ONCE, SHORT, OperationFlow
from orchestrator._cluster.stepping import NO_DATA, TableFlow
from orchestrator._lifecycle.guards import NavigationFacts
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._lifecycle.names import NavigationEvent, NavigationState, ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.navigation.core import AWAITING, navigation_effects, start_facts
from orchestrator._runtime.outcomes import navigation_event


class _Stopped(Exception):
    """An effect could not report an outcome the table lists (the leaf move conflicted)."""


class NavigationFlow(TableFlow):
    """One tree navigation, run by the navigation table inside the session workflow.

    Args:
        defn: The navigation table.
        operation: The operation table (for the branch summary).
        nav: The navigation (its id chosen by the workflow, deterministically).
    """

    def __init__(self, defn: MachineDef, operation: MachineDef, nav: Nav) -> None:
        self.operation = operation
        self.nav = nav
        super().__init__(defn, navigation_effects(self), awaiting=AWAITING, machine="navigation")
        self.summary: OperationFlow | None = None
        self._summary_result: CompressResult | None = None
        self._summary_entry_id: str | None = None
        self._from_extension = False
        self._moved = False
        self._leaf_id: str | None = None
        self._short_summary: str | None = None
        self._stopped: str | None = None
        self._after_move: asyncio.Task[NavReported] | None = None

    @property
    def summary_state(self) -> str | None:
        """The branch summary operation's state, while one runs."""
        return self.summary.state if self.summary is not None else None

    def interrupt(self, event: str) -> None:
        """Record ``cancel``; the table decides what it means now.

        Once the leaf moved (the machine is done), only the ``session_tree`` handlers may
        still run: a cancel then stops them, as in one process, so a handler that never
        returns cannot hold the navigation; what was written stays written.
        """
        emitting = self._after_move
        if self.done and emitting is not None and not emitting.done():
            emitting.cancel()  # the activity settles: the label whole, the handler stopped
            return
        super().interrupt(event)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, *, working: bool) -> NavigateResult:
        """Step the table from ``navigate`` to a final state.

        Args:
            working: A compaction or a turn runs in the session (the ``turn_running`` fact).

        Raises:
            ActivityError: The target is unknown, or the session is not in the store.
            TransitionError: The table refused a step (a bug, not a model failure).
        """
        old_leaf_id: str | None = None  # not read while working: the table refuses first
        if not working:
            # Where the session is decides `same_position`; a refused navigation reads nothing.
            started: NavReported = await workflow.execute_activity(
                "nav_start",
                NavCall(nav=self.nav),
                result_type=NavReported,
                start_to_close_timeout=SHORT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=DELIVER,
            )
            assert started.nav is not None
            self.nav = started.nav
            old_leaf_id = self.nav.old_leaf_id
        target_id = self.nav.request.target_id
        facts = start_facts(working=working, target_id=target_id, old_leaf_id=old_leaf_id)
        try:
            await self._loop(NavigationEvent.NAVIGATE, facts)
        except _Stopped:
            await self._flush()
        except asyncio.CancelledError:
            # The workflow was cancelled: settle through the table's cancel row (D22).
            if not self.done and self.defn.rows_for(self.state, NavigationEvent.CANCEL):
                await self._loop(NavigationEvent.CANCEL, NavigationFacts())
            raise
        return self._result()

    async def _loop(self, event: str | None, facts: NavigationFacts) -> None:
        await self._steps(event, facts, NO_DATA)
        self._interrupts.clear()
        await self._flush()

    def _translate(
        self, effect: str, report: Report
    ) -> tuple[str, NavigationFacts, Mapping[str, Any]]:
        nav = self.nav
        event, facts = navigation_event(
            effect, report, wants_summary=nav.request.summarize, has_entries=nav.entry_count > 0
        )
        return event, facts, NO_DATA

    def _call(self, **fields: Any) -> NavCall:
        lines, resend = self.journal.take()
        return NavCall(nav=self.nav, journal=lines, resend=resend, **fields)

    async def _activity(self, name: str, call: NavCall, *, deliver: bool = False) -> NavReported:
        try:
            reported: NavReported = await workflow.execute_activity(
                name,
                call,
                result_type=NavReported,
                start_to_close_timeout=SHORT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=DELIVER if deliver else ONCE,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except (ActivityError, asyncio.CancelledError):
            self.journal.lost(call.journal)
            raise
        if reported.nav is not None:
            self.nav = reported.nav
        return reported

    # -- the effect table -------------------------------------------------------------------------

    async def collect_entries(self) -> Report:
        await self._activity("nav_collect", self._call(), deliver=True)
        return Report(outcome=ReportOutcome.OK)

    async def run_hooks(self) -> Report:
        try:
            reported = await self._activity("nav_hooks", self._call())
        except ActivityError:
            # Hooks that cannot be consulted cancel: the move must not go ahead without the
            # hooks that might have refused it (as an operation's hooks do).
            return Report(outcome=ReportOutcome.CANCELLED)
        return Report(outcome=ReportOutcome(reported.outcome))

    async def start_summary(self) -> Report:
        await self._flush()  # the navigation's steps so far are journaled before the summary's
        op = Op(
            session_id=self.nav.session_id,
            operation_id=workflow.uuid4().hex[:12],
            reason="navigation",
            kind="branch_summary",
            branch=self.nav,
        )
        self.summary = OperationFlow(self.operation, op)
        try:
            result = await self.summary.run()
        finally:
            self.summary = None
        self._summary_result = result
        if result.status == "committed":
            self._summary_entry_id = result.entry_id
            self._short_summary = result.short_summary
            self._moved = True
        return Report(outcome=ReportOutcome(result.status))

    async def cancel_summary(self) -> None:
        if self.summary is not None:
            self.summary.interrupt("cancel")
        task, self._in_flight = self._in_flight, None
        if task is not None and not task.done():
            await task

    async def stop_hooks(self) -> None:
        # A session_before_tree handler that never returns must not hold the navigation: its
        # activity is cancelled like a model call (D22) and settles before the step goes on;
        # nothing was written before the hooks answered.
        await self._stop_in_flight()

    async def switch_leaf(self) -> Report:
        return await self._switch(with_summary=False)

    async def switch_leaf_with_summary(self) -> Report:
        return await self._switch(with_summary=True)

    async def _switch(self, *, with_summary: bool) -> Report:
        entry_id = derived_id(self.nav.navigation_id, "leaf")
        call = self._call(entry_id=entry_id, with_summary=with_summary)
        try:
            await self._activity("nav_switch", call, deliver=True)
        except ActivityError as error:
            self._stopped = _message(error)
            raise _Stopped from None
        if with_summary:
            self._summary_entry_id = entry_id
            self._from_extension = True
        self._moved = True
        return Report(outcome=ReportOutcome.OK)

    async def rebuild_context(self) -> None:
        """Nothing to rebuild: each activity reads the session fresh."""
        return None

    async def emit_session_tree(self) -> None:
        call = self._call(
            label_id=derived_id(self.nav.navigation_id, "label"),
            summary_entry_id=self._summary_entry_id,
            from_extension=self._from_extension,
        )
        emitting = asyncio.ensure_future(self._activity("nav_emit", call, deliver=True))
        self._after_move = emitting
        try:
            reported = await emitting
        except ActivityError as error:
            # The label met another writer's change (D27): it was not written.
            self._stopped = _message(error)
            raise _Stopped from None
        finally:
            self._after_move = None
        self._leaf_id = reported.leaf_id
        if reported.short_summary is not None:
            self._short_summary = reported.short_summary

    async def _flush(self) -> None:
        if self.journal.lines:
            call = self._call()
            await workflow.execute_activity(
                "nav_finish",
                call,
                start_to_close_timeout=SHORT,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=DELIVER,
            )

    def _result(self) -> NavigateResult:
        nav = self.nav
        old = nav.old_leaf_id
        base = NavigateResult(navigation_id=nav.navigation_id, status=self.state, old_leaf_id=old)
        if self._stopped is not None:
            return _replace(base, status="failed", error=self._stopped, error_kind="conflict")
        if self.state == NavigationState.FAILED:
            result = self._summary_result
            conflict = result is not None and result.status == "conflict"
            return _replace(
                base,
                error=result.error if result is not None else None,
                error_kind="conflict" if conflict else (result and result.error_kind) or "fatal",
            )
        if self.state == NavigationState.CANCELLED:
            return _replace(base, aborted=self._summary_result is not None, new_leaf_id=old)
        if not self._moved:  # done by a row that moved nothing (the same position), or refused
            return _replace(base, new_leaf_id=old)
        return _replace(
            base,
            editor_text=nav.editor_text,
            new_leaf_id=self._leaf_id,
            summary_entry_id=self._summary_entry_id,
            short_summary=self._short_summary if self._summary_entry_id else None,
        )


def _replace(result: NavigateResult, **changes: Any) -> NavigateResult:
    return dataclasses.replace(result, **changes)


def _message(error: ActivityError) -> str:
    cause: BaseException | None = error.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return cause.message if isinstance(cause, ApplicationError) else str(error.cause or error)
