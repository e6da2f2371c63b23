"""The activities of tree navigation and fork on the cluster (issue 10).

Theory of operation. The navigation table (``machines/navigation.toml``) runs in the session
workflow (:mod:`orchestrator._cluster.navigation.flow`); what touches the store or runs a hook is an
activity here, one per effect, and none decides anything:

* ``nav_start``: where the session is (its leaf, and where it ends, D27) and where the target
  puts the leaf: the facts of the table's first step. An unknown target is refused here.
* ``nav_collect`` (``collect_entries``): the abandoned branch, counted, and the common ancestor.
* ``nav_hooks`` (``run_hooks``): ``session_before_tree`` on this worker's hooks (D25).
* ``nav_switch`` (``switch_leaf`` / ``switch_leaf_with_summary``): the leaf move's commit. No
  process keeps the session in memory here, so a move without a summary is written as a leaf
  marker (``custom`` entry, never in the context) under the new leaf, and a hook's summary as a
  branch summary there; both conditional on where the session ended when the navigation
  started (D27), and idempotent by an entry id the workflow derived from the navigation id, so
  a delivery repeated after a lost worker finds its entry and writes nothing.
* ``nav_emit`` (``emit_session_tree``): the label, if asked for (idempotent the same way), and
  ``session_tree``.
* ``nav_finish``: the last journal lines of a navigation that wrote nothing.
* ``fork``: ``session_before_fork``, the new session in the store, ``session_fork``.

The branch summary itself is an operation
(:class:`~orchestrator._cluster.operation.flow.OperationFlow` over the shared activities with
``Op.kind == "branch_summary"``). Every activity first writes the journal lines it carries, as the
operation's activities do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from orchestrator._cluster.calls import ForkCall, Nav, NavCall, NavReported, derived_id
from orchestrator._cluster.contract import ForkDone
from orchestrator._cluster.delivery import redelivered, store_work
from orchestrator._cluster.heartbeat import heartbeating
from orchestrator._cluster.journaling import write_lines
from orchestrator._cluster.stores import WorkerStores, fixed_id, shown
from orchestrator._cluster.views import planned_view
from orchestrator._core.branch_plan import collect_branch_entries
from orchestrator._core.entries import BRANCH_SUMMARY, CUSTOM
from orchestrator._core.errors import ConflictError, SessionError
from orchestrator._runtime.hook_results import TreeChanges, tree_changes
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.navigation.moves import (
    LEAF_MARKER,
    navigation_target,
    position_is_recorded,
    recorded_position,
)
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator._store.fork import branched_session, fork_target
from orchestrator._store.protocol import Tail
from orchestrator._store.session import Session, branch_summary_fields

NAVIGATION = "navigation"
"""The navigation machine's name in the journal."""


class Worker(Protocol):
    """What the tree's activities use of the worker's operation activities."""

    database: str
    routes: SummaryRoutes
    hooks: Hooks
    stores: WorkerStores


class TreeActivities:
    """Navigation and fork activities, over the store, routes and hooks of ``owner``.

    Args:
        owner: The worker's operation activities
            (:class:`~orchestrator._cluster.operation.activities.SessionActivities`).
    """

    def __init__(self, owner: Worker) -> None:
        self.owner = owner

    def all(self) -> Sequence[Callable[..., Any]]:
        """Every activity, for the worker."""
        return (
            self.nav_start,
            self.nav_collect,
            self.nav_hooks,
            self.nav_switch,
            self.nav_emit,
            self.nav_finish,
            self.fork,
        )

    # -- activities -------------------------------------------------------------------------------

    @activity.defn(name="nav_start")
    async def nav_start(self, call: NavCall) -> NavReported:
        """Where the session is and where the target puts the leaf (an unknown id is refused)."""
        return await store_work(self._start, call, once=True)

    @activity.defn(name="nav_collect")
    async def nav_collect(self, call: NavCall) -> NavReported:
        """Collect the abandoned branch (counted) and the common ancestor."""
        return await store_work(self._collect, redelivered(call), once=True)

    @activity.defn(name="nav_hooks")
    async def nav_hooks(self, call: NavCall) -> NavReported:
        """Run ``session_before_tree``: it may cancel, supply a summary, or reshape the request."""
        session, entry_ids, _ = await store_work(self._journal_then_branch, call)
        nav, request = call.nav, call.nav.request
        ports = self._ports(session)
        try:
            # Heartbeating, so a cancel (the table's stop_hooks) reaches a hanging handler.
            async with heartbeating():
                hook = await ports.run_hook(
                    "session_before_tree",
                    {
                        "type": "session_before_tree",
                        "preparation": {
                            "targetId": request.target_id,
                            "oldLeafId": nav.old_leaf_id,
                            "commonAncestorId": nav.ancestor_id,
                            "entriesToSummarize": entry_ids,
                            "userWantsSummary": request.summarize,
                            "customInstructions": request.instructions,
                            "replaceInstructions": request.replace_instructions,
                            "label": request.label,
                        },
                    },
                )
        finally:
            session.store.close()
        if hook and hook.get("cancel"):
            return NavReported(outcome="cancelled", nav=nav)
        checked = tree_changes(hook)
        ports.hook_result_problems("session_before_tree", checked.problems)
        changes: TreeChanges = checked.value
        if hook:
            instructions, replace, label = changes.applied(
                request.instructions, request.replace_instructions, request.label
            )
            request = dataclasses.replace(
                request, instructions=instructions, replace_instructions=replace, label=label
            )
            nav = dataclasses.replace(nav, request=request)
        if changes.supplied is not None:
            supplied = dict(changes.supplied)
            return NavReported(outcome="supplied", nav=dataclasses.replace(nav, supplied=supplied))
        return NavReported(outcome="done", nav=nav)

    @activity.defn(name="nav_switch")
    async def nav_switch(self, call: NavCall) -> NavReported:
        """Move the leaf in the store: a leaf marker, or a hook's summary, written once (D27)."""
        return await store_work(self._switch, redelivered(call))

    @activity.defn(name="nav_emit")
    async def nav_emit(self, call: NavCall) -> NavReported:
        """Write the label (once), run ``session_tree``; report the leaf and the short summary."""
        # Heartbeating, so an abort after the move (the workflow cancels this activity)
        # reaches a session_tree handler that never returns.
        async with heartbeating():
            labelled = asyncio.ensure_future(asyncio.to_thread(self._label, call))
            try:
                leaf_id, summary_entry = await asyncio.shield(labelled)
            except asyncio.CancelledError:
                # The label is written whole or not at all: settle it, then run no handler.
                leaf_id, summary_entry = await labelled
            else:
                nav = call.nav
                with contextlib.suppress(asyncio.CancelledError):
                    # An abort stops the handler, as in one process; what was written stays
                    # written and the navigation answers as moved.
                    await self._ports(None).run_hook(
                        "session_tree",
                        {
                            "type": "session_tree",
                            "newLeafId": leaf_id,
                            "oldLeafId": nav.old_leaf_id,
                            "summaryEntry": summary_entry,
                            "fromExtension": call.from_extension if summary_entry else None,
                        },
                    )
        nav = call.nav
        short = summary_entry.get("shortSummary") if summary_entry else None
        return NavReported(outcome="ok", nav=nav, leaf_id=leaf_id, short_summary=short)

    @activity.defn(name="nav_finish")
    async def nav_finish(self, call: NavCall) -> None:
        """Journal the last steps of a navigation."""
        await store_work(self._write_journal, redelivered(call))

    @activity.defn(name="fork")
    async def fork(self, request: ForkCall) -> ForkDone:
        """Fork a session before a user message into a new session in the store."""
        source = await store_work(self._open, request.session_id)
        try:
            leaf, editor_text = _refused_as_session_error(fork_target, source, request.entry_id)
            ports = self._ports(source)
            hook = await ports.run_hook(
                "session_before_fork",
                {"type": "session_before_fork", "entryId": request.entry_id},
            )
            if hook and hook.get("cancel"):
                return ForkDone(cancelled=True, session_id=None, editor_text=editor_text)
            await store_work(self._branch, source, leaf, request.new_session_id)
            await ports.run_hook(
                "session_fork",
                {"type": "session_fork", "previousSessionFile": source.store.location},
            )
        finally:
            source.store.close()
        return ForkDone(cancelled=False, session_id=request.new_session_id, editor_text=editor_text)

    # -- the work ---------------------------------------------------------------------------------

    def _open(self, session_id: str) -> Session:
        """The session as stored now (close its store when done)."""
        session, cached = self.owner.stores.session(session_id)
        if cached is None and not session.store.exists():
            session.store.close()
            raise ApplicationError(
                f"session {session_id}: not in {shown(self.owner.database)}",
                type="NoSession",
                non_retryable=True,
            )
        return session

    def _start(self, call: NavCall) -> NavReported:
        nav = call.nav
        opened = self._open(nav.session_id)
        with contextlib.closing(opened.store):
            session = recorded_position(opened)
            target = _refused_as_session_error(
                navigation_target, session.tree, nav.request.target_id
            )
            tail = session.tail()
        return NavReported(
            outcome="ok",
            nav=dataclasses.replace(
                nav,
                old_leaf_id=session.leaf_id,
                new_leaf_id=target.new_leaf_id,
                editor_text=target.editor_text,
                expect_last_id=tail.last_id,
                expect_length=tail.length,
            ),
        )

    def _collect(self, call: NavCall) -> NavReported:
        session, entry_ids, ancestor = self._journal_then_branch(call)
        session.store.close()
        nav = call.nav
        return NavReported(
            outcome="ok",
            nav=dataclasses.replace(nav, entry_count=len(entry_ids), ancestor_id=ancestor),
        )

    def _journal_then_branch(self, call: NavCall) -> tuple[Session, list[str], str | None]:
        """Journal; the session as the navigation found it, the abandoned entries, the ancestor."""
        self._write_journal(call)
        session = self._planned(call.nav)
        try:
            entries, ancestor = collect_branch_entries(
                session.tree, call.nav.old_leaf_id, call.nav.request.target_id
            )
        except BaseException:
            session.store.close()
            raise
        return session, [e["id"] for e in entries], ancestor

    def _planned(self, nav: Nav, entry_id: str | None = None) -> Session:
        """The session as the navigation found it; new entries get ``entry_id`` (close it)."""
        session = self._stored(nav.session_id, entry_id)
        return recorded_position(planned_view(session, _tail(nav), entry_id))

    def _stored(self, session_id: str, entry_id: str | None) -> Session:
        return self.owner.stores.session(session_id, random_hex=fixed_id(entry_id))[0]

    def _switch(self, call: NavCall) -> NavReported:
        self._write_journal(call)
        nav, entry_id = call.nav, call.entry_id
        assert entry_id is not None, "the workflow fixes the entry id before the switch"
        stored = self._stored(nav.session_id, entry_id)
        with contextlib.closing(stored.store):
            if entry_id in stored.tree.by_id:
                # An earlier delivery of this switch wrote it: do not write it again.
                return NavReported(outcome="ok", nav=nav)
            session = recorded_position(planned_view(stored, _tail(nav), entry_id))
            expect = _tail(nav)
            try:
                if call.with_summary and nav.supplied is not None:
                    entry = session.new_entry(
                        BRANCH_SUMMARY,
                        branch_summary_fields(
                            summary=nav.supplied["summary"],
                            from_id=nav.old_leaf_id,
                            details=nav.supplied.get("details"),
                            from_extension=True,
                        ),
                        parent_id=nav.new_leaf_id,
                    )
                    session.attach_branch_summary(entry, expect=expect)
                else:
                    _move(session, nav.new_leaf_id)
                    if not position_is_recorded(session):
                        session.append_entry(
                            CUSTOM,
                            {
                                "customType": LEAF_MARKER,
                                "data": {"from": nav.old_leaf_id, "to": nav.request.target_id},
                            },
                            parent_id=session.leaf_id,
                            expect=expect,
                        )
                session.flush()
            except ConflictError as error:
                raise _conflict(error, "nothing was applied") from None
        return NavReported(outcome="ok", nav=nav)

    def _label(self, call: NavCall) -> tuple[str | None, dict[str, Any] | None]:
        self._write_journal(call)
        nav = call.nav
        session = recorded_position(self._stored(nav.session_id, call.label_id))
        with contextlib.closing(session.store):
            summary_id = call.summary_entry_id
            summary = session.tree.by_id.get(summary_id) if summary_id else None
            label = nav.request.label
            if label and call.label_id not in session.tree.by_id:
                # pi labels the summary entry when there is one, else the target; the label is a
                # child of the new leaf, as in the one-process navigator. Conditional like the
                # move (D27): the store must still end where this navigation left it, else the
                # label would hang from another writer's entry and move the leaf there.
                written = summary_id or derived_id(nav.navigation_id, "leaf")
                tail = session.tail()
                left = tail.last_id == written if written in session.tree.by_id else None
                if left is None:
                    left = tail == _tail(nav)  # the move wrote nothing: the tail is as it was
                try:
                    if not left:
                        raise ConflictError(
                            f"{shown(self.owner.database)}: session {nav.session_id} changed "
                            "after the leaf moved"
                        )
                    session.append_label(summary_id or nav.request.target_id, label, expect=tail)
                    session.flush()
                except ConflictError as error:
                    raise _conflict(error, "the label was not written") from None
            return session.leaf_id, summary

    def _branch(self, source: Session, leaf: str | None, new_session_id: str) -> None:
        store = self.owner.stores.store(new_session_id)
        with contextlib.closing(store):
            if store.exists():
                raise ApplicationError(
                    f"{new_session_id}: already exists", type="SessionError", non_retryable=True
                )
            new = branched_session(source, leaf, store, session_id=new_session_id)
            new.flush()  # no process keeps it in memory: it is in the store at once

    def _ports(self, session: Session | None) -> Ports:
        return Ports(session=session, routes=self.owner.routes, hooks=self.owner.hooks)

    def _write_journal(self, call: NavCall) -> None:
        lines = call.journal
        if not lines:
            return
        nav = call.nav
        with self.owner.stores.journal(nav.session_id) as journal:
            write_lines(
                journal,
                NAVIGATION,
                lines,
                resend=call.resend,
                mine=lambda r: (
                    r.machine == NAVIGATION and r.data.get("navigationId") == nav.navigation_id
                ),
                data={"navigationId": nav.navigation_id},
                durable_last=False,
            )


def _conflict(error: ConflictError, what: str) -> ApplicationError:
    """Another writer came first (D27): the request fails with ``-32007``."""
    return ApplicationError(f"{error}; {what}", type="Conflict", non_retryable=True)


def _tail(nav: Nav) -> Tail:
    return Tail(nav.expect_last_id, nav.expect_length)


def _move(session: Session, leaf_id: str | None) -> None:
    if leaf_id is None:
        session.reset_leaf()
    else:
        session.branch(leaf_id)


def _refused_as_session_error(function: Callable[..., Any], *args: Any) -> Any:
    """Call ``function``; a :class:`SessionError` (the caller's mistake) fails the request."""
    try:
        return function(*args)
    except SessionError as error:
        raise ApplicationError(str(error), type="SessionError", non_retryable=True) from None
