"""The session workflow's activities: the effects that touch the world (issue 10).

Theory of operation. Each activity performs one effect of the operation table and reports its
outcome; none decides anything. Every activity first writes the journal lines it carries, then reads
the session from the shared store *as it was when the operation planned* (the entries up to
:attr:`~orchestrator._cluster.calls.Op.expect_last_id`), rebuilds the same
:class:`~orchestrator._runtime.operation.jobs.CompactionJob` the one-process host builds, and
performs:

* ``prepare``: plan (pure) and say where the session ends; the start event and its facts.
* ``run_hooks``: ``session_before_compact`` / ``session.compacting`` on this worker's hooks.
* ``call_model``: one attempt at one summary request
  (:func:`~orchestrator._runtime.outcomes.attempt_summary`), heartbeating while it waits, so a
  worker that dies is noticed within the heartbeat timeout.
* ``commit``: append the entry, conditional on the planned tail (D27), idempotent by its id: if
  an entry with that id is already stored, an earlier delivery committed it and this one
  reports success without writing.
* ``rewrite``: a prune's commit (D23): the planned tool outputs replaced in place, atomically,
  conditional on the planned tail; delivered again, it finds them pruned and has nothing to do.
* ``finish``: the last journal lines, and ``session_compact`` for a committed compaction
  (``session_compact_failed`` for one that failed or was cancelled).

Store and journal work is blocking I/O, so it runs in a thread; model calls are async.

Reading little (issue 10). A worker reaches the store through its
:class:`~orchestrator._cluster.stores.WorkerStores`: pooled connections, and parsed sessions
kept in a :class:`~orchestrator._cluster.cache.SessionCache` that is checked against the
store's stamp before each use (one small query), so an activity parses a session only when
another writer changed it or this worker has not seen it yet. The compaction plan is kept with
the parse, by the tail it was made at, so later activities of an operation do not plan again.
The journal lines an activity carries are written with one durable write (the last line's,
which makes the earlier ones durable too), and ``finish`` reads only the committed entry.
Nothing here decides whether a commit may happen: the store's conditional append does, in its
own transaction, whatever the cache held.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from orchestrator._cluster.cache import Cached
from orchestrator._cluster.calls import Call, JournalLine, Op, Policy, Prepared, Reported, TurnCall
from orchestrator._cluster.delivery import redelivered, store_work, transient
from orchestrator._cluster.heartbeat import heartbeating
from orchestrator._cluster.journaling import write_lines
from orchestrator._cluster.navigation.activities import TreeActivities
from orchestrator._cluster.stores import WorkerStores, fixed_id, shown
from orchestrator._cluster.turn.activities import TurnActivities
from orchestrator._cluster.views import planned_view
from orchestrator._core.branch_plan import collect_branch_entries, prepare_branch_entries
from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.entries import Entry
from orchestrator._core.errors import OrchestratorError
from orchestrator._core.model import Model
from orchestrator._core.summary_request import FALLBACK_CONTEXT_WINDOW
from orchestrator._lifecycle.names import OperationState
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.operation.compact_hooks import retries_after
from orchestrator._runtime.operation.driver import commit_failure
from orchestrator._runtime.operation.jobs import BranchJob, CompactionJob, PruneJob
from orchestrator._runtime.operation.runner import routes_for
from orchestrator._runtime.operation.summarize import (
    CompactionInputs,
    CompactionResult,
    Part,
    SummaryRoutes,
    compaction_parts,
)
from orchestrator._runtime.outcomes import attempt_summary
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.locations import is_database_url
from orchestrator._store.protocol import SessionStore, Tail
from orchestrator._store.session import Session, wall_clock_ms
from orchestrator._telemetry.tracing import facts_delta

StoreOpener = Callable[[str, str], SessionStore]
Job = CompactionJob | BranchJob


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """What a compaction planned from a session at one tail (kept with the cached parse)."""

    path: list[Entry]
    plan: CompactionPlan
    kept: Sequence[dict[str, Any]]


class SessionActivities:
    """The activities a worker offers, over its store, routes and hooks.

    Args:
        database: Where sessions live (see :mod:`orchestrator._cluster.stores`).
        routes: The summary models this worker calls.
        settings: Compaction settings and time limits.
        hooks: The hooks this worker runs (D25).
        agent_factory: Makes the agent of a turn, as ``serve --model`` does (``None``: prompts
            are refused, as by a server without ``--model``).
        stores: The worker's pool and cache (default: new ones for ``database``); closed by
            :meth:`close`, which the worker calls when it stops.
    """

    def __init__(
        self,
        database: str,
        routes: SummaryRoutes,
        settings: RuntimeSettings | None = None,
        hooks: Hooks | None = None,
        agent_factory: Callable[[], Agent] | None = None,
        *,
        stores: WorkerStores | None = None,
    ) -> None:
        self.database = database
        self.routes = routes
        self.settings = settings or RuntimeSettings()
        self.hooks = hooks or Hooks()
        self.stores = stores if stores is not None else WorkerStores(database)
        self.turns = TurnActivities(self.stores, self.settings, agent_factory, self.hooks)

    def close(self) -> None:
        """Close the worker's connection pool and drop its cached sessions."""
        self.stores.close()

    def all(self) -> Sequence[Callable[..., Any]]:
        """Every activity, for the worker (turns, navigation and fork included)."""
        compaction = (
            self.prepare,
            self.run_hooks,
            self.call_model,
            self.commit,
            self.rewrite,
            self.finish,
        )
        return (*compaction, *self.turns.all(), *TreeActivities(self).all())

    # -- activities -------------------------------------------------------------------------------

    @activity.defn(name="prepare")
    async def prepare(self, call: Call) -> Prepared:
        """Plan the compaction; report the start event and where the session ends.

        It only reads, so a worker lost meanwhile or a connection dropped under it is delivered
        again; a session that cannot be planned fails at once (the same at every attempt).
        """
        turn = redelivered(call.turn) if call.turn is not None else None
        return await store_work(self._prepare, call.op, turn, once=True)

    @activity.defn(name="run_hooks")
    async def run_hooks(self, call: Call) -> Reported:
        """Consult the hooks; report their outcome, the requests and how they shaped them."""
        job = await store_work(self._journal_then_job, redelivered(call))
        assert isinstance(job, CompactionJob), "only a compaction consults hooks here"
        # The hooks get the session as read; its connection goes back to the pool meanwhile.
        _close(job)
        try:
            async with heartbeating():
                report = await job.consult_hooks()
        finally:
            _close(job)
        op = dataclasses.replace(
            call.op,
            additional_context=list(job.inputs.additional_context),
            prompt_override=job.inputs.prompt_override,
            preserve_data=job.inputs.preserve_data,
            supplied=dataclasses.asdict(job.supplied) if job.supplied is not None else None,
        )
        text, gate = job.hook_summary() if job.supplied is not None else ("", None)
        return Reported(
            outcome=report.outcome,
            data=dict(report.data),
            text=text,
            gate=gate.as_json() if gate is not None else None,
            routes=[len(part.routes) for part in job.parts],
            op=op,
        )

    @activity.defn(name="call_model")
    async def call_model(self, call: Call) -> Reported:
        """Make one attempt at one summary request (no retry: the table decides)."""
        job = await store_work(self._journal_then_job, call)
        # The job holds what the request is built from; the store is not needed meanwhile.
        _close(job)
        part = job.parts[call.part]
        model = self.routes.fallback if call.offline else part.routes[call.candidate]
        if model is None:
            return Reported(outcome="fatal", error="no offline fallback", purpose=part.purpose)
        # A split turn's prefix does not depend on the history summary: the operation's first
        # call also makes the first attempt of every later independent request, as one process
        # does (ask_effects.py's _start_early). The table still takes each result, in order,
        # when its request is reached; one activity for both costs the history one activity,
        # not two.
        early = [
            (index, later)
            for index, later in enumerate(job.parts)
            if call.early and index > call.part and later.independent and later.routes
        ]
        async with heartbeating():
            attempts = await asyncio.gather(
                self._attempt(part, model, call),
                *(self._attempt(later, later.routes[0], Call(op=call.op)) for _, later in early),
            )
        first, *others = attempts
        return dataclasses.replace(
            first,
            early={str(index): got for (index, _), got in zip(early, others, strict=True)},
        )

    async def _attempt(self, part: Part, model: Model, call: Call) -> Reported:
        attempt = await attempt_summary(
            part,
            model,
            call.halvings,
            call.texts,
            self.settings.model_timeout_s,
            call.feedback,
            idle_s=self.settings.model_idle_timeout_s,
        )
        gate = attempt.gate.as_json() if attempt.gate is not None else None
        return Reported.of(attempt.report, text=attempt.text, purpose=part.purpose, gate=gate)

    @activity.defn(name="commit")
    async def commit(self, call: Call) -> Reported:
        """Append the compaction entry once, conditional on the planned tail (D24, D27).

        Delivered again (its worker lost, or its connection dropped mid-commit), it finds its
        entry if the first delivery wrote it, and its journal lines are not written twice.
        """
        return await store_work(self._commit, redelivered(call))

    @activity.defn(name="rewrite")
    async def rewrite(self, call: Call) -> Reported:
        """Prune the planned tool outputs in place, conditional on the planned tail (D23)."""
        return await store_work(self._rewrite, redelivered(call))

    @activity.defn(name="finish")
    async def finish(self, call: Call) -> None:
        """Journal the last steps; tell the hooks how a compaction ended.

        ``session_compact`` for a committed one, ``session_compact_failed`` with the payload
        the workflow worded for one that failed, was cancelled or (manual) had nothing to do.
        """
        entry = await store_work(self._finish, redelivered(call))
        op = call.op
        if entry is not None:
            await self.hooks.run(
                "session_compact",
                {
                    "type": "session_compact",
                    "compactionEntry": entry,
                    "fromExtension": op.supplied is not None,
                    "reason": op.reason,
                    "willRetry": retries_after(op.reason),
                },
                lambda _name, _error: None,
            )
        elif call.compact_failed is not None:
            await self.hooks.run(
                "session_compact_failed",
                {"type": "session_compact_failed", **call.compact_failed},
                lambda _name, _error: None,
            )

    # -- the work ---------------------------------------------------------------------------------

    def _prepare(self, op: Op, turn: TurnCall | None = None) -> Prepared:
        if turn is not None:
            self.turns.write_journal(turn)  # the turn's steps before the operation's (in order)
        session, cached = self._session(op.session_id, must_exist=True)
        with contextlib.closing(session.store):
            if op.branch is not None:
                # A branch summary works on the session as its navigation found it (D27).
                session = planned_view(
                    session, Tail(op.branch.expect_last_id, op.branch.expect_length)
                )
            pruned_ids: list[str] = []
            routes: list[int] = []
            if op.kind == "prune":
                prune = PruneJob(session)
                start = prune.start()
                pruned_ids = [e["id"] for e in prune.pruned(wall_clock_ms())]
            else:
                job = self._job(session, op, cached)
                start = job.start()
                if op.kind != "compaction":
                    routes = [len(part.routes) for part in job.parts]
            tail = session.tail()
        retry = self.routes.retry
        return Prepared(
            event=start.event,
            facts=facts_delta(start.facts),
            data={k: v for k, v in start.data.items() if v is not None},
            expect_last_id=tail.last_id,
            expect_length=tail.length,
            routes=routes,
            policy=Policy(
                enabled=retry.enabled,
                max_retries=retry.max_retries,
                base_delay_ms=retry.base_delay_ms,
                switch_after_ms=retry.switch_after_ms,
                max_delay_ms=retry.max_delay_ms,
                timeout_s=self.settings.model_timeout_s,
                deadline_s=self.settings.operation_deadline_s,
                gate=self.routes.gate,
                fallback=self.routes.fallback is not None,
            ),
            pruned_ids=pruned_ids,
        )

    def _journal_then_job(self, call: Call) -> Job:
        self._write_journal(call.op, call.journal, resend=call.resend)
        stored, cached = self._session(call.op.session_id)
        try:
            job = self._job(_as_planned(stored, call.op), call.op, cached)
        except BaseException:
            stored.store.close()
            raise
        if isinstance(job, BranchJob):
            stored.store.close()  # a branch job holds what it needs; it keeps no session
        return job

    def _commit(self, call: Call) -> Reported:
        self._write_journal(call.op, call.journal, resend=call.resend)
        op, entry_id = call.op, call.entry_id
        assert entry_id is not None, "the workflow fixes the entry id before the commit"
        stored, cached = self._session(op.session_id, entry_id=entry_id)
        with contextlib.closing(stored.store):
            found = stored.tree.by_id.get(entry_id)
            if found is not None:
                # An earlier delivery of this commit appended it (its worker died before it
                # could say so): report it, do not append it again.
                return Reported(outcome="ok", data={"entryId": entry_id}, result=_result_of(found))
            session = _as_planned(stored, op, entry_id)
            job = self._job(session, op, cached)
            result = job.result(call.texts, call.models, call.written)
            entry = job.entry(session, result)
            try:
                job.append(session, entry, Tail(op.expect_last_id, op.expect_length))
            except (OrchestratorError, OSError) as error:
                return _refused(error)
            planned = Tail(op.expect_last_id, op.expect_length)
            self.stores.remember(op.session_id, session, cached, [entry], planned)
            result_of = {**_result_of(entry), "estimateAfter": sum(session.context().estimates)}
        return Reported(outcome="ok", data={"entryId": entry_id}, result=result_of)

    def _rewrite(self, call: Call) -> Reported:
        self._write_journal(call.op, call.journal, resend=call.resend)
        op = call.op
        session = self._planned(op)
        with contextlib.closing(session.store):
            job = PruneJob(session)
            pruned = job.pruned(wall_clock_ms())
            ids = [e["id"] for e in pruned]
            try:
                job.rewrite(pruned, Tail(op.expect_last_id, op.expect_length))
            except (OrchestratorError, OSError) as error:
                return _refused(error)
            finally:
                # The rewrite changed entries in place: the next use reads the session again.
                self.stores.cache.drop(op.session_id)
        return Reported(outcome="ok", data={"entryIds": ids}, tokens_saved=job.tokens_saved)

    def _finish(self, call: Call) -> Entry | None:
        self._write_journal(call.op, call.journal, resend=call.resend)
        if (
            call.status != OperationState.COMMITTED
            or call.entry_id is None
            or call.op.kind != "compaction"
        ):
            return None
        session_id, entry_id = call.op.session_id, call.entry_id
        if is_database_url(self.database):
            # One row, not the session: the entry is all the hook needs.
            from orchestrator._store.postgres import PostgresStore

            with contextlib.closing(self.stores.store(session_id)) as store:
                assert isinstance(store, PostgresStore)
                return store.find_entry(entry_id)
        session, _ = self._session(session_id)
        with contextlib.closing(session.store):
            return session.tree.by_id.get(entry_id)

    def _session(
        self, session_id: str, *, entry_id: str | None = None, must_exist: bool = False
    ) -> tuple[Session, Cached | None]:
        """The session as stored now, from the cache when it is current (close its store).

        New entries get ``entry_id``. ``must_exist``: a session that is not stored is refused
        (``NoSession``) rather than started empty.
        """
        session, cached = self.stores.session(session_id, random_hex=fixed_id(entry_id))
        if cached is None and must_exist and not session.store.exists():
            session.store.close()
            raise ApplicationError(
                f"session {session_id}: not in {shown(self.database)}",
                type="NoSession",
                non_retryable=True,
            )
        return session, cached

    def _stored(self, op: Op, *, entry_id: str | None = None) -> Session:
        """The session as stored now; new entries get ``entry_id`` (close its store when done)."""
        return self._session(op.session_id, entry_id=entry_id)[0]

    def _planned(self, op: Op) -> Session:
        """The session as it was when ``op`` planned (close its store when done)."""
        return _as_planned(self._stored(op), op)

    def _job(self, session: Session, op: Op, cached: Cached | None = None) -> Job:
        if op.branch is not None:
            return self._branch_job(session, op)
        routes = routes_for(self.routes, op.reason)
        ports = Ports(session=session, routes=routes, hooks=self.hooks)
        settings = self.settings.compaction
        key = (session.tail(), settings)
        planned = cached.plans.get(key) if cached is not None else None
        if isinstance(planned, Planned):
            job = CompactionJob(
                ports,
                routes,
                reason=op.reason,
                settings=settings,
                focus=op.focus,
                plan=planned.plan,
                kept=planned.kept,
            )
            job.path = planned.path
        else:
            job = CompactionJob(ports, routes, reason=op.reason, settings=settings, focus=op.focus)
            if cached is not None and job.plan is not None:
                cached.plans[key] = Planned(job.path, job.plan, job.inputs.kept_messages)
        if op.supplied is not None:
            job.supplied = CompactionResult(**op.supplied)
        job.inputs = CompactionInputs(
            focus=op.focus,
            additional_context=tuple(op.additional_context),
            prompt_override=op.prompt_override,
            preserve_data=op.preserve_data,
            kept_messages=job.inputs.kept_messages,
        )
        if job.plan is not None:
            job.parts = compaction_parts(job.plan, routes, job.inputs)
        return job

    def _branch_job(self, session: Session, op: Op) -> BranchJob:
        """The branch summary of a navigation (D17), planned as the one-process navigator does."""
        nav = op.branch
        assert nav is not None
        # D21: a branch summary uses the current model's route, as a manual compaction does.
        routes = routes_for(self.routes, "navigation")
        candidates = routes.candidates
        window = (candidates[0].context_window if candidates else 0) or FALLBACK_CONTEXT_WINDOW
        entries, ancestor = collect_branch_entries(
            session.tree, nav.old_leaf_id, nav.request.target_id
        )
        plan = prepare_branch_entries(
            entries,
            max(1, window - self.settings.branch_reserve_tokens),
            old_leaf_id=nav.old_leaf_id,
            target_id=nav.request.target_id,
            common_ancestor_id=ancestor,
        )
        return BranchJob(
            routes,
            plan,
            new_leaf_id=nav.new_leaf_id,
            old_leaf_id=nav.old_leaf_id,
            instructions=nav.request.instructions,
            replace_instructions=nav.request.replace_instructions,
        )

    def _write_journal(self, op: Op, lines: Sequence[JournalLine], *, resend: bool) -> None:
        if not lines:
            return
        with self.stores.journal(op.session_id) as journal:
            write_lines(
                journal,
                "operation",
                lines,
                resend=resend,
                mine=lambda r: r.operation_id == op.operation_id,
                data={},
                operation_id=op.operation_id,
                kind=op.kind,
            )


def _as_planned(session: Session, op: Op, entry_id: str | None = None) -> Session:
    """``session`` cut back to the entries stored when ``op`` planned (D27).

    Another writer may have appended since; the operation still works on what it planned from,
    and its commit then conflicts. A session changed beyond recognition (the planned last entry
    is gone) is returned as it is: the commit will conflict on it too.
    """
    return planned_view(session, Tail(op.expect_last_id, op.expect_length), entry_id)


def _refused(error: OrchestratorError | OSError) -> Reported:
    """The commit's report when the store refused it (a conflict, D27, or a failure).

    Raises:
        OrchestratorError: The connection failed and nothing was written: deliver it again.
    """
    if transient(error):
        raise error
    return Reported.of(commit_failure(error))


def _close(job: Job) -> None:
    if isinstance(job, CompactionJob) and job.ports.session is not None:
        job.ports.session.store.close()


def _result_of(entry: Entry) -> dict[str, Any]:
    return {
        "summary": entry.get("summary"),
        "tokensBefore": entry.get("tokensBefore"),
        "firstKeptEntryId": entry.get("firstKeptEntryId"),
        "shortSummary": entry.get("shortSummary"),
        "details": entry.get("details"),
        "fromExtension": bool(entry.get("fromExtension")),
    }
