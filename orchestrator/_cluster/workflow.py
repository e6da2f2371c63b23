"""The session workflow: one per session, its id the session id (issue 10).

Theory of operation. Temporal runs at most one workflow per id, so making the session id the
workflow id gives the fleet one owner per session by construction: every request for a session,
from any client through any server, reaches the same workflow, on whichever worker holds it now.
Requests are updates (``prompt``, ``compress``, ``navigate``, ``fork``) and signals
(``abort``, ``close``); what the session is doing is a query (``state``), and so are the
``session.event`` events of the run in progress (``events``), which the answers of ``prompt``
and ``compress`` also carry. The workflow keeps
nothing a store does not already keep: it completes after ``idle_s`` without work, and the next
request starts a fresh run with the same id. A busy session never idles, so its history would
grow without bound: past ``history_bound`` events, or when Temporal suggests it, the workflow
continues as new once no request is in progress, carrying only its input (the session lives in
the store; nothing of a turn carries over when none runs).

Turns. The session's turn machine is a :class:`~orchestrator._cluster.turn.flow.TurnFlow`: the
shipped turn table stepped by the pure step, as the one-process turn driver steps it. A prompt
runs a turn to its end (automatic compactions, overflow recovery and agent retries included, as
the table decides); a prompt while a run is in progress is queued and the table takes it as a
follow-up when the machine rests, as in one process. ``compress`` steps ``manual_compact``
through the same table: it stops a running agent first (D22) and the interrupted turn is not
resumed. One manual compaction at a time: a second ``compress`` while one is asked for or runs
is refused by the validator (the refusal is not written to the history) and, should two arrive
in the same workflow task, by the handler itself, whose check-and-set runs without an await.

No ``workflow.patched`` branch keeps an older shape of the workflow: every worker build is
versioned (:mod:`~orchestrator._cluster.versioning`), so a run only ever meets the code and tables
it started with, and a change of shape is a new build (docs/scale-out.md).

Navigation is :class:`~orchestrator._cluster.navigation.flow.NavigationFlow` (the navigation table,
its branch summary an ``OperationFlow``); ``fork`` is one activity (hooks and the new session).
Which requests may run together is the session machine's decision (``machines/session.toml``,
stepped by the update validators and handlers here as the one-process server steps it): one
navigation at a time, no compaction or prompt while one runs, no navigation while a compaction or a
turn runs (the navigation table's ``turn_running`` row refuses it too, for histories recorded
before).

The operation itself is :class:`~orchestrator._cluster.operation.flow.OperationFlow`: the shipped
operation table stepped by the pure step, effects as activities. The tables are data the
worker loaded (:func:`~orchestrator._cluster.worker.load_tables`) before any workflow ran, so
the workflow reads no file and a replay steps exactly the table the history was made with.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from orchestrator._cluster.calls import ForkCall, Nav, TurnPolicy
    from orchestrator._cluster.contract import (
        BUSY_TYPE,
        NO_AGENT,
        NO_AGENT_TYPE,
        WORKFLOW_NAME,
        CompressRequest,
        CompressResult,
        ForkDone,
        ForkRequest,
        NavigateRequest,
        NavigateResult,
        PromptRequest,
        PromptResult,
        SessionStart,
    )
    from orchestrator._cluster.local import run_local
    from orchestrator._cluster.navigation.flow import NavigationFlow
    from orchestrator._cluster.operation.flow import HEARTBEAT, SHORT, OperationFlow
    from orchestrator._cluster.operation.flow import ONCE as ONE_ATTEMPT
    from orchestrator._cluster.turn.compactions import NEVER_RAN, ManualCompaction
    from orchestrator._cluster.turn.flow import TurnFlow
    from orchestrator._core.errors import BusyError
    from orchestrator._lifecycle.admission import admit
    from orchestrator._lifecycle.guards import SessionFacts
    from orchestrator._lifecycle.machine import load_machine
    from orchestrator._lifecycle.names import (
        NavigationEvent,
        OperationState,
        SessionEvent,
        TurnEvent,
        TurnState,
    )


@workflow.defn(name=WORKFLOW_NAME)
class SessionWorkflow:
    """One session's lifecycle, hosted by Temporal."""

    def __init__(self) -> None:
        self._navigation: NavigationFlow | None = None
        self._closing = False
        self._bound = 0
        self._done: list[str] = []
        self._turn: TurnFlow | None = None
        self._policy: TurnPolicy | None = None

    def _turns(self) -> TurnFlow:
        if self._turn is None:
            self._turn = TurnFlow(
                load_machine("turn"), load_machine("operation"), workflow.info().workflow_id
            )
        return self._turn

    def _working(self) -> bool:
        return self._turn_running() or self._navigation is not None

    def _idle(self) -> bool:
        """Nothing runs and no request is being taken (a fork, a queued prompt included)."""
        return not self._working() and workflow.all_handlers_finished()

    def _turn_running(self) -> bool:
        """A compaction or a turn runs: the navigation table's ``turn_running`` fact."""
        return self._turn is not None and self._turn.running

    def _facts(self) -> SessionFacts:
        """What runs in this session, as the session machine's guards read it."""
        turn = self._turn
        manual = turn is not None and (
            turn.manual is not None or turn.state == TurnState.MANUAL_COMPACTING
        )
        return SessionFacts(
            turn_running=self._turn_running(),
            compaction_running=manual,
            navigation_running=self._navigation is not None,
        )

    def _admit(self, request: SessionEvent, facts: SessionFacts | None = None) -> None:
        """Step the session table (``machines/session.toml``); a refusal fails the update."""
        try:
            admit(request, facts or self._facts(), table=load_machine("session"))
        except BusyError as refused:
            raise ApplicationError(str(refused), type=BUSY_TYPE, non_retryable=True) from None

    @workflow.run
    async def run(self, start: SessionStart) -> dict[str, Any]:
        """Serve requests until idle for ``start.idle_s`` (or closed), then complete.

        Past ``start.history_bound`` history events (or when Temporal suggests it), continue
        as new once no request is in progress: the new run starts from ``start`` alone.
        """
        try:
            return await self._serve(start)
        except asyncio.CancelledError:
            await self._settle_cancellation()
            raise

    async def _serve(self, start: SessionStart) -> dict[str, Any]:
        idle = timedelta(seconds=start.idle_s)
        self._bound = start.history_bound
        while not self._closing:
            if self._idle():
                # No idle timer while a request is being taken (the one that started this run
                # is, before this loop first runs): it would be cancelled at once.
                try:
                    await workflow.wait_condition(
                        lambda: not self._idle() or self._closing or self._history_full(),
                        timeout=idle,
                    )
                except TimeoutError:
                    if self._idle():
                        break
            await workflow.wait_condition(self._idle)
            if self._history_full() and not self._closing:
                await workflow.wait_condition(workflow.all_handlers_finished)
                # The next run starts on the deployment's current build: a busy session
                # moves to new code here, so an old build's workers can drain (versioning.py).
                workflow.continue_as_new(
                    start,
                    initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
                )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return {"sessionId": start.session_id, "operations": self._operations()}

    async def _settle_cancellation(self) -> None:
        """Settle the work in progress as an abort does, then let the cancellation end the run.

        Temporal's cancellation (``handle.cancel()``) cancels only this method, not the update
        handlers, whose turn, operation or navigation would otherwise be cut off mid-call by the
        run's end. So the cancellation is an abort: the tables' ``abort``/``cancel`` rows stop
        the agent, the wait or the model call (D22), nothing is written, the journal says
        ``cancelled``, and each caller gets the answer an abort gives. Requests that arrive
        meanwhile are served. Then the run ends as cancelled; the next request starts a new run
        (the session lives in the store). Ending, rather than serving on, is what keeps a later
        cancellation working: Temporal records one cancellation request per run and treats
        another as a no-op.
        """
        self._closing = True
        self.abort()
        await workflow.wait_condition(workflow.all_handlers_finished)

    def _operations(self) -> list[str]:
        return [*self._done, *(self._turn.operations if self._turn is not None else [])]

    async def _turn_policy(self) -> TurnPolicy:
        """The worker's turn settings, asked once per run (recorded in the history)."""
        if self._policy is None:
            # A local activity: the worker's settings, recorded as one marker event.
            policy: TurnPolicy = await run_local("turn_policy", limit=SHORT, result_type=TurnPolicy)
            self._policy = self._policy or policy
        return self._policy

    @workflow.update(name="prompt")
    async def prompt(self, request: PromptRequest) -> PromptResult:
        """Run a turn for ``request.text`` (``session.prompt``); queued while a run is in progress.

        Raises:
            ApplicationError: ``NoAgent``: the worker has no agent (``serve`` without ``--model``).
        """
        turn = self._turns()
        policy = await self._turn_policy()
        if not policy.has_agent:
            raise ApplicationError(NO_AGENT, type=NO_AGENT_TYPE, non_retryable=True)
        self._admit(SessionEvent.PROMPT)
        turn.policy = policy
        if turn.running:
            turn.queue(request.text)
            return PromptResult(state=turn.state, queued=True)
        await turn.run(TurnEvent.USER_PROMPT, request.text)
        reply = turn.core.counters.last_reply
        return PromptResult(
            state=turn.state,
            reply=None if reply is None else dict(reply),
            events=list(turn.events),
            events_run=workflow.info().run_id,
        )

    def _history_full(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested() or info.get_current_history_length() >= self._bound
        )

    @workflow.update(name="compress")
    async def compress(self, request: CompressRequest) -> CompressResult:
        """Compact the session now (``session.compress``), through the operation table.

        Raises:
            ApplicationError: ``Busy``: a compaction is already running in this session.
        """
        self._refuse_when_busy(request)
        turn = self._turns()
        policy = await self._turn_policy()
        # From here to the run (or the interrupt) nothing awaits: check and act at once.
        self._refuse_when_busy(request)
        manual = turn.manual = ManualCompaction(focus=request.focus, reason=request.reason)
        if turn.running:
            turn.interrupt(TurnEvent.MANUAL_COMPACT)
            await workflow.wait_condition(lambda: manual.done)
        else:
            turn.policy = policy
            await turn.run(TurnEvent.MANUAL_COMPACT)
        outcome = manual.outcome or CompressResult(
            operation_id="", status=OperationState.CANCELLED, reason=NEVER_RAN
        )
        # The run's events so far: the server sends those it has not sent before the answer.
        return dataclasses.replace(
            outcome, events=list(turn.events), events_run=workflow.info().run_id
        )

    @compress.validator
    def _refuse_when_busy(self, request: CompressRequest) -> None:
        self._admit(SessionEvent.COMPACT)

    @workflow.update(name="navigate")
    async def navigate(self, request: NavigateRequest) -> NavigateResult:
        """Move the leaf (``session.tree.navigate``), through the navigation table.

        Raises:
            ApplicationError: ``Busy``: a navigation is already running in this session.
            ActivityError: The target is unknown, or the leaf move met another writer (D27).
        """
        # Two in the same workflow task: the second is refused here (no await since the check).
        # A turn that runs is the navigation table's refusal (its turn_running row), as before.
        self._admit(
            SessionEvent.NAVIGATE, SessionFacts(navigation_running=self._navigation is not None)
        )
        nav = Nav(
            session_id=workflow.info().workflow_id,
            navigation_id=workflow.uuid4().hex[:12],
            request=request,
        )
        flow = NavigationFlow(load_machine("navigation"), load_machine("operation"), nav)
        working = self._turn_running()  # the table's turn_running row refuses
        self._navigation = flow
        try:
            result = await flow.run(working=working)
            self._done.append(f"{result.navigation_id}:{result.status}")
            return result
        finally:
            self._navigation = None

    @navigate.validator
    def _refuse_second_navigation(self, request: NavigateRequest) -> None:
        self._admit(SessionEvent.NAVIGATE)

    @workflow.update(name="fork")
    async def fork(self, request: ForkRequest) -> ForkDone:
        """Fork the session before a user message into a new session (``session.fork``).

        Forking reads the session and writes another: it runs beside any other work, as in
        one process.
        """
        done: ForkDone = await workflow.execute_activity(
            "fork",
            ForkCall(
                session_id=workflow.info().workflow_id,
                entry_id=request.entry_id,
                new_session_id=request.new_session_id or str(workflow.uuid4()),
            ),
            result_type=ForkDone,
            start_to_close_timeout=SHORT,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=ONE_ATTEMPT,
        )
        return done

    @workflow.signal(name="abort")
    def abort(self) -> None:
        """Stop the work in progress, if any; the tables decide what that means (D22)."""
        if self._turn is not None:
            self._turn.interrupt(TurnEvent.ABORT)
        if self._navigation is not None:
            self._navigation.interrupt(NavigationEvent.CANCEL)

    @workflow.signal(name="close")
    def close(self) -> None:
        """Complete once the work in progress has ended."""
        self._closing = True

    @workflow.query(name="events")
    def events(self, after: int) -> dict[str, Any]:
        """The events of the run in progress numbered after ``after`` (``session.event``)."""
        turn = self._turn
        return {
            "run": workflow.info().run_id,
            "events": [] if turn is None else turn.events_after(after),
        }

    @workflow.query(name="state")
    def state(self) -> dict[str, Any]:
        """What the session is doing: the turn's, operation's and navigation's machine states."""
        flow: OperationFlow | None = None
        turn, nav = self._turn, self._navigation
        if turn is not None and turn.flow is not None and not turn.flow.done:
            flow = turn.flow
        if flow is None and nav is not None and nav.summary is not None:
            flow = nav.summary  # a navigation's branch summary is the operation that runs
        return {
            "busy": self._working(),
            "turnState": TurnState.IDLE if turn is None else turn.state,
            "operation": None if flow is None else flow.op.operation_id,
            "operationState": None if flow is None else flow.state,
            "navigation": None if nav is None else nav.nav.navigation_id,
            "navigationState": None if nav is None else nav.state,
            "operations": self._operations(),
        }
