"""The operation driver: one compaction, branch summary or prune, run by its table (D31).

Theory of operation. The table (``machines/operation.toml``) decides; this module performs. The
phases are

    preparing -> consulting_hooks -> summarizing [-> waiting_retry -> summarizing ...]
              -> committing -> committed   (or skipped / cancelled / failed / conflict)

Planning is pure and happens before the first step, which is the job's start event. From then on
the loop steps the table, performs the row's effects from :data:`the effect table
<OperationRun.effects>`, and translates each effect's :class:`~orchestrator._runtime.driver.Report`
into the next event with the facts its guards read:

* ``call_model`` reports ``ok`` (-> ``summary_ready``), ``overflow`` (-> ``summary_overflow``,
  with the halvings so far), or a failure kind (-> ``attempt_failed``, with whether it is
  retryable, the retries made on this candidate, the delay the next wait would take from
  :func:`~orchestrator._runtime.delays.retry_delay_ms`, and whether another candidate remains).
  Whether that means wait, next candidate, halve or fail is the table's choice.
* ``sleep_retry`` reports ``ok`` (-> ``wait_done``); ``run_hooks`` reports ``done``,
  ``supplied`` or ``cancelled``; the commit reports ``ok``, ``conflict`` or ``failed``.

Each step is journaled, traced and announced. Entering ``committing`` fixes the entry to append
and journals its id first, so a process killed mid-commit reopens to a settled operation:
``committed`` if that id is in the file, ``failed`` otherwise. Every record is written at once;
the journal is made durable (fsynced, D24) on entering ``committing``, before the commit is
written (for a compaction, in the commit's own disk-thread call). A final
state has no fsync of its own: the journal's next fsync (the next commit's, or the session's
close) makes it durable (:mod:`~orchestrator._runtime.disk`); the event loop never waits for
the disk (issue 9).

Cancelling (:meth:`OperationRun.cancel`) records the request and fires ``cancel`` through the
table; the row's ``stop_work`` ends the model call or wait in flight (D22). A refused step raises
``TransitionError``: a bug in the table or the driver, never reported as a model failure.

This module holds the loop, its words and the observation of each step. The effects live by
phase in :mod:`~orchestrator._runtime.operation.ask_effects` (hooks, model calls, retry waits,
stopping) and :mod:`~orchestrator._runtime.operation.commit_effects` (the commit and what follows).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from orchestrator._core.entries import Entry
from orchestrator._core.errors import ModelError
from orchestrator._lifecycle.guards import NO_OPERATION_FACTS, Facts, OperationFacts
from orchestrator._lifecycle.machine import Step
from orchestrator._lifecycle.names import OperationEvent, OperationState
from orchestrator._runtime.admission import Slot
from orchestrator._runtime.driver import Effect, Interpreter, Report, run_table
from orchestrator._runtime.operation.ask_effects import AskEffects
from orchestrator._runtime.operation.commit_effects import CommitEffects
from orchestrator._runtime.operation.driver import (
    AWAITING,
    STATUS,
    OperationDriver,
    ends_attempt,
    part_routes,
)
from orchestrator._runtime.operation.jobs import BranchJob, PruneJob, Start
from orchestrator._runtime.operation.summarize import Part, SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.scheduler import cancel_scope, direct_states
from orchestrator._runtime.soon import call_later, on_asyncio
from orchestrator._runtime.types import OperationOutcome
from orchestrator._telemetry.tracing import facts_delta


class Job(Protocol):
    """The kind-specific side of an operation (see :mod:`orchestrator._runtime.operation.jobs`)."""

    kind: str
    reason: str
    parts: tuple[Part, ...]

    def start(self) -> Start:
        """The start event, once planned."""
        ...

    def starts_early(self) -> bool:
        """Whether a later summary request may start alongside the first."""
        ...


class OperationRun(AskEffects, CommitEffects):
    """One operation: its machine, its effect table and the memory its effects share.

    Args:
        ports: What the effects perform through.
        job: What kind of operation, planned.
        routes: The summary routes and retry policy for it.
        dry_run: The commit reports the entry instead of appending it.
        session_id: The session the journal names, when ``ports`` has none (an operation for
            a session another program owns and writes: pi's, through our extension).
    """

    def __init__(
        self,
        ports: Ports,
        job: Any,
        *,
        routes: SummaryRoutes,
        dry_run: bool = False,
        session_id: str | None = None,
    ) -> None:
        self.ports = ports
        self.session_id = session_id
        self.job = job
        self.routes = routes
        self.dry_run = dry_run
        self.id = ports.ids()
        # What the effects share, and every decision that is not I/O (operation_driver.py).
        self.driver = OperationDriver(
            kind=str(job.kind),
            reason=job.reason,
            policy=routes.retry,
            gate=routes.gate,
            fallback=routes.fallback is not None,
            routes=part_routes(job.parts),
        )
        self._at = self.driver.at
        # Where the session ended when the job planned: the commit is conditional on it (D27).
        self._expect = ports.session.tail() if ports.session is not None else None
        self.effects: Mapping[str, Effect] = self.driver.effects(
            {
                "run_hooks": self._run_hooks,
                "call_model": self._call_model,
                "sleep_retry": self._sleep_retry,
                "stop_work": self._stop_work,
                "append_entry": self._append_entry,
                "rewrite_entries": self._rewrite_entries,
                "rebuild_context": self._rebuild_context,
                "emit_result": self._emit_result,
                "drop_hook_result": self._drop_hook_result,
            }
        )
        self.machine = Interpreter(
            ports.tables("operation"), self.effects, observers=(self._record,)
        )
        self._result: Any = None
        self._entry: Entry | None = None
        self._pruned: list[Entry] = []
        self._started = False
        self._group: Any = None
        self._early = {}
        self._scheduler = self.machine.scheduler

    @property
    def state(self) -> OperationState:
        """The machine's state."""
        return OperationState(self.machine.state)

    @property
    def kind(self) -> str:
        """``compaction``, ``branch_summary`` or ``prune``."""
        return str(self.job.kind)

    @property
    def texts(self) -> Mapping[str, str]:
        """The summary texts so far, by request purpose."""
        return self.driver.texts

    @property
    def models(self) -> Mapping[str, str]:
        """The models that wrote them, by request purpose."""
        return self.driver.models

    @property
    def written(self) -> Mapping[str, Mapping[str, Any]]:
        """What each request's accepted attempt reported (provenance, usage), by purpose."""
        return self.driver.written

    def cancel(self) -> None:
        """Ask for cancellation; the table decides what it means now (D22)."""
        if not self.machine.done and self.machine.listed(OperationEvent.CANCEL):
            self.machine.interrupt(OperationEvent.CANCEL)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, slot: Slot | None = None) -> OperationOutcome:
        """Run the operation to a final state and say how it ended.

        Args:
            slot: The start slot the operation holds, given back when it first waits
                (:mod:`~orchestrator._runtime.admission`).

        Raises:
            TransitionError: The table refused a step (a bug, not a model failure).
        """
        self.machine.scheduler.slot = slot
        try:
            return await self._run()
        finally:
            self._scheduler.let_slot_go()

    async def _run(self) -> OperationOutcome:
        start = self.job.start()
        self.driver.skipped = start.data.get("reason")
        with self.ports.tracer.operation_span(self.kind, self.id, self.job.reason) as span:
            try:
                if self._needs_children():
                    async with anyio.create_task_group() as group:
                        self._group = group
                        await self._drive(start, group)
                else:
                    await self._drive(start, None)
            except BaseExceptionGroup as group_error:
                # The loop's own error (a refused step, a bug) comes back grouped: unwrap it.
                error = _single(group_error)
                # Its own cause kept (`from None` would erase it: a surface reads the chain for
                # the system error behind it), the group's context hidden.
                raise error from error.__cause__
            except anyio.get_cancelled_exc_class():
                # Cancelled from outside (the turn stopped): settle through the table, shielded.
                with anyio.CancelScope(shield=True):
                    if self.machine.listed(OperationEvent.CANCEL):
                        cancel = OperationEvent.CANCEL
                        await self._loop(cancel, self._facts(), {}, settling=True)
                raise
            outcome = self.outcome()
            span.set(**_span_attributes(outcome), **self._branch_span_attributes())
            if self.driver.refused:  # which checks the gate failed, in order (D32)
                span.set(gate_refused=[check for _, check in self.driver.refused])
        self._let_go()
        return outcome

    def _needs_children(self) -> bool:
        # A task group costs a compaction's loop more than its plan's bookkeeping: only an
        # operation that may start a child task opens one. That is a later request started
        # early (a split turn's prefix), trio's deadline timer, or work in flight in a state
        # the table does not let run in this task (scheduler.direct_states).
        if self.job.starts_early():
            return True
        if self.ports.deadline_s is not None and not on_asyncio():
            return True
        defn = self.machine.defn
        return not set(defn.states) <= direct_states(defn)

    async def _drive(self, start: Start, group: TaskGroup | None) -> None:
        timer = anyio.CancelScope()
        stop_timer = None
        seconds = self.ports.deadline_s
        if seconds is not None:
            # A callback on asyncio's loop; a timer task on trio (soon.py).
            stop_timer = call_later(seconds, lambda: self._deadline_passed(seconds))
            if stop_timer is None:
                assert group is not None  # _needs_children
                group.start_soon(self._deadline, timer, seconds)
        try:
            await self._loop(start.event, start.facts, start.data, settling=False)
        finally:
            self._drop_early()
            cancel_scope(timer)
            if stop_timer is not None:
                stop_timer()

    def _let_go(self) -> None:
        # The effect table's bound methods and the machine's observers point back at this run:
        # a reference cycle that only the cyclic collector would free, after it had walked the
        # whole plan and its requests in every full collection meanwhile. A thousand operations
        # in flight make those collections a tenth of a second each (issue 9). Ended, the run
        # needs neither: reference counting frees it as soon as its caller lets go.
        self.effects = {}
        self.machine.let_go()
        self._group = None

    async def _loop(
        self, event: str, facts: OperationFacts, data: Mapping[str, Any], *, settling: bool
    ) -> None:
        # Settling (after a cancel from outside) performs every effect in place, shielded.
        self._settling = settling
        await run_table(self, event, facts, data)
        self.machine.drop_interrupts()

    # -- the loop's words (driver.TableHost) ------------------------------------------------------

    async def step(self, event: str, facts: Facts, data: Mapping[str, Any]) -> tuple[str, ...]:
        """Take one step, its commit's ids journaled first; the row's effects."""
        assert isinstance(facts, OperationFacts)
        taken = self.machine.step(event, facts, self._annotate(event, facts, data))
        if self._unsynced and not self._commits_in_thread(taken):
            await self._sync_journal()
        self._report_attempt(taken)
        return taken.effects

    def perform(self, name: str) -> Awaitable[Report | None]:
        """Perform one effect; one that waits runs in flight, its start slot given back."""
        if self._settling or not self._awaits(name):
            return self.machine.perform(name)
        # What follows the wait (the answer's steps, the commit's records) never waits either:
        # it takes a start slot again (admission.py).
        return self.machine.in_flight(self._group, self.effects[name], again=True)

    def interrupted(self) -> tuple[str, Facts] | None:
        """The oldest pending interrupt, if the table lists it now."""
        return self.machine.interrupted(NO_OPERATION_FACTS)

    def translate(self, effect: str, report: Report) -> tuple[str, Facts, Mapping[str, Any]]:
        """The event ``effect``'s report fires (the operation driver's words)."""
        return self.driver.translate(effect, report)

    def _awaits(self, name: str) -> bool:
        # Consulting hooks that nobody registered returns at once: no child task for it.
        if name == "run_hooks":
            return bool(self.job.hooks_wait())
        if name == "call_model" and self._answered_early() is not None:
            # Its answer came while the first request was asked (a split turn's prefix): taking
            # it waits for nothing, so the start slot is kept, not given back and queued for.
            return False
        return name in AWAITING

    def _annotate(
        self, event: str, facts: OperationFacts, data: Mapping[str, Any]
    ) -> dict[str, Any]:
        # Entering committing fixes what the commit writes, so its ids are journaled first.
        row = self.machine.defn.select(self.state, event, facts)
        out = dict(data)
        if row is not None and row.dest == OperationState.COMMITTING:
            session = self.ports.session
            if isinstance(self.job, PruneJob):
                self._pruned = self.job.pruned(self.ports.clock_ms())
                out["entryIds"] = [e["id"] for e in self._pruned]
            elif session is not None:
                self._result = self._job_result()
                self._entry = self.job.entry(session, self._result)
                out["entryId"] = self._entry["id"]
            else:
                self._result = self._job_result()
        return out

    def _job_result(self) -> Any:
        driver = self.driver
        return self.job.result(driver.texts, driver.models, driver.written)

    def _facts(self) -> OperationFacts:
        return NO_OPERATION_FACTS

    async def _deadline(self, scope: anyio.CancelScope, seconds: float) -> None:
        # The whole operation's deadline (waits and retries included) on the event loop's clock.
        # It only records the failure and fires the event; the table's row stops the work.
        with scope:
            await anyio.sleep(seconds)
            self._deadline_passed(seconds)

    def _deadline_passed(self, seconds: float) -> None:
        if not self.machine.done and self.machine.listed(OperationEvent.DEADLINE_PASSED):
            self.driver.deadline_passed(seconds)
            self.machine.interrupt(OperationEvent.DEADLINE_PASSED)

    # -- observation ------------------------------------------------------------------------------

    def _record(self, step: Step, data: Mapping[str, Any]) -> None:
        if not self._started:
            self._started = True
            self._update("in_progress")
        journal = self.ports.journal
        if journal is not None and not self.dry_run:
            kept = self.driver.journal_data(step.source, data)
            if step.facts is not None:
                # What the guards read, so the journal replays through the table (D31).
                kept["facts"] = facts_delta(step.facts)
            if step.source == OperationState.PREPARING:
                session = self.ports.session
                named = session.session_id if session is not None else self.session_id
                if named:  # (a session with no header yet has no id to name)
                    # Whose operation this is, should the file be replaced before it settles.
                    kept.setdefault("sessionId", named)
            # Every step is in the file before anyone hears of it; only the phases settling
            # needs are made durable, by _sync_journal before the step's effects (D24, issue 9).
            # The final state's record is made durable by the journal's next fsync (the next
            # commit's, or the session's close): a power cut before it leaves the operation at
            # `committing` or before, and reopening settles it to the same end (D24, issue 9).
            journal.write_step(step, operation_id=self.id, kind=self.kind, data=kept, durable=False)
            self._unsynced = step.dest == OperationState.COMMITTING
        self.ports.observe(step)
        if self.machine.done:
            self._update(STATUS[self.state])

    async def _sync_journal(self) -> None:
        # The fsync runs in a worker thread: the event loop goes on with other sessions.
        self._unsynced = False
        journal = self.ports.journal
        if journal is not None and not journal.in_memory_only:
            await anyio.to_thread.run_sync(journal.sync)

    def _update(self, status: str) -> None:
        self.ports.events.emit("compaction_update", id=self.id, kind=self.kind, status=status)

    def _report_attempt(self, taken: Step) -> None:
        # The CLI's progress line and traces hear every attempt, named by the row taken.
        observer = self.routes.on_attempt
        if observer is None or not ends_attempt(taken):
            return
        part, model = self._route()
        observer(self.driver.attempt_record(taken, model.name if model else ""), part.purpose)

    def outcome(self) -> OperationOutcome:
        """How the operation ended (call once the machine is final)."""
        ending = self.driver.ending(self.state)
        result = self._result if self.kind == "compaction" else None
        committed = ending.status == OperationState.COMMITTED
        return OperationOutcome(
            operation_id=self.id,
            **ending.fields(),
            retry_after=ending.retry_after,
            cause=self._commit_cause if ending.commit_failed else None,
            entry=self._entry if committed else None,
            result=result if committed else None,
            plan=getattr(self.job, "plan", None) if self.kind == "compaction" else None,
            tokens_saved=getattr(self.job, "tokens_saved", 0),
            from_extension=bool(getattr(self._result, "from_extension", False)),
            dry_run=self.dry_run,
        )

    def _branch_span_attributes(self) -> dict[str, Any]:
        # A branch summary's span says what a compaction's does: what it covered (the
        # abandoned branch's tokens, as its plan counts them) and the model that wrote it.
        if not isinstance(self.job, BranchJob):
            return {}
        plan = self.job.plan
        attrs: dict[str, Any] = {
            "tokens_before": plan.total_tokens,
            "summarized": len(plan.summarized_entry_ids),
        }
        if self.state == OperationState.COMMITTED and self._result is not None:
            attrs["model"] = self._result.model
        return attrs

    _commit_cause: BaseException | None = None
    _unsynced = False
    _settling = False


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    # Both halves of a split turn can fail the same way (a request that cannot fit the
    # summarizer's window is refused before any call): the caller gets one error, the first.
    leaves = _leaves(group)
    if all(isinstance(leaf, ModelError) for leaf in leaves):
        return leaves[0]
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup) and len(first.exceptions) == 1:
        first = first.exceptions[0]
    return first


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _span_attributes(outcome: OperationOutcome) -> dict[str, Any]:
    attrs: dict[str, Any] = {"outcome": outcome.status}
    if outcome.plan is not None:
        attrs["tokens_before"] = outcome.plan.tokens_before
        attrs["summarized"] = len(outcome.plan.summarize_entry_ids)
        attrs["kept"] = len(outcome.plan.kept_entry_ids)
    if outcome.result is not None:
        attrs["model"] = outcome.result.model
    if outcome.tokens_saved:
        attrs["tokens_saved"] = outcome.tokens_saved
    if outcome.error:
        attrs["error"] = outcome.error
    return attrs
