"""The navigator: tree navigation driven by ``machines/navigation.toml``, and forking.

Theory of operation. One navigator per session. A navigation validates its target (an unknown
id is the caller's mistake, refused before anything starts), then steps the table from
``navigate`` with the facts its guards read: a turn running (refused), the same position (a
no-op). From there each effect performs one thing and reports an outcome the table turns into
the next state:

    collect_entries -> collected        run_hooks -> hooks_done | hook_supplied | hooks_cancelled
    start_summary   -> summary_committed | summary_skipped | summary_cancelled | summary_failed
    switch_leaf / switch_leaf_with_summary -> switched

Whether to summarize (asked for, and the branch has entries), to attach a hook's summary, or
only to move the leaf is the table's choice. ``cancel`` (``abort_branch_summary``) records the
request and fires through the table; its ``cancel_summary`` effect cancels the branch-summary
operation and waits for it to settle, so history and leaf stay as they were (D22).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from orchestrator._core.branch_plan import collect_branch_entries, prepare_branch_entries
from orchestrator._core.entries import Entry
from orchestrator._core.errors import ConflictError, ModelTimeoutError, SessionError, model_error
from orchestrator._core.summary_request import FALLBACK_CONTEXT_WINDOW, no_room_for_branch
from orchestrator._lifecycle.guards import NO_NAVIGATION_FACTS, Facts
from orchestrator._lifecycle.machine import Step
from orchestrator._lifecycle.names import (
    NavigationEvent,
    NavigationState,
    OperationState,
    ReportOutcome,
)
from orchestrator._runtime.disk import off_loop
from orchestrator._runtime.driver import (
    NO_DATA,
    Effect,
    Interpreter,
    Report,
    first_error,
    run_table,
)
from orchestrator._runtime.hook_results import TreeChanges, tree_changes
from orchestrator._runtime.navigation.core import AWAITING, navigation_effects, start_facts
from orchestrator._runtime.navigation.moves import (
    NavigationTarget,
    apply_navigation,
    is_leaf_marker,
    navigation_target,
)
from orchestrator._runtime.operation.runner import OperationRunner
from orchestrator._runtime.outcomes import navigation_event
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.scheduler import cancel_scope, weakly
from orchestrator._runtime.soon import call_later
from orchestrator._runtime.types import ForkResult, NavigationResult, OperationOutcome
from orchestrator._store.fork import branched_session, fork_path, fork_target
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import SessionStore
from orchestrator._telemetry.tracing import facts_delta

_log = logging.getLogger("orchestrator")

__all__ = ["BUSY", "ForkResult", "NavigationResult", "Navigator", "fork", "fork_to"]

BUSY = "Cannot navigate while the agent is working; wait for the turn to end or abort it"


class _Request:
    """One navigation's inputs and what its effects learned (the effects' shared memory)."""

    def __init__(
        self,
        target: NavigationTarget,
        old_leaf: str | None,
        *,
        summarize: bool,
        instructions: str | None,
        replace_instructions: bool,
        label: str | None,
    ) -> None:
        self.target = target
        self.old_leaf = old_leaf
        self.summarize = summarize
        self.instructions = instructions
        self.replace_instructions = replace_instructions
        self.label = label
        self.entries: list[Entry] = []
        self.ancestor: str | None = None
        self.supplied: Mapping[str, Any] | None = None
        self.summary_entry: Entry | None = None
        self.from_extension = False
        self.outcome: OperationOutcome | None = None
        self.moved = False  # an effect moved the leaf (a switch, or a committed summary)
        self.hook_timeout: float | None = None  # the deadline that ended the hooks' phase


class Navigator:
    """Moves a session's leaf through the navigation table.

    Args:
        ports: What the effects perform through.
        operations: Runs the branch-summary operation.
        branch_reserve_tokens: Reserve for branch summaries (budget = window - reserve).
        turn_running: Whether a turn is in progress (read as a fact when a navigation starts).
    """

    def __init__(
        self,
        ports: Ports,
        operations: OperationRunner,
        *,
        branch_reserve_tokens: int,
        turn_running: Callable[[], bool],
    ) -> None:
        self.ports = ports
        self.operations = operations
        self.branch_reserve_tokens = branch_reserve_tokens
        self.turn_running = turn_running
        self.effects: Mapping[str, Effect] = {}  # made by the first navigation (effect_table)
        self.machine: Interpreter | None = None
        self._request: _Request | None = None
        self._after_hooks: anyio.CancelScope | None = None
        self._group: Any = None

    @property
    def running(self) -> bool:
        """A navigation is in progress."""
        return self.machine is not None and not self.machine.done

    def cancel(self) -> None:
        """Ask the navigation in progress to cancel; the table decides what that means now.

        Once the navigation is done (the leaf moved), only its ``session_tree`` handlers may
        still run: a cancel then stops them, so a handler that never returns cannot hold the
        call; what was written stays written.
        """
        if (
            self.machine is not None
            and not self.machine.done
            and self.machine.listed(NavigationEvent.CANCEL)
        ):
            self.machine.interrupt(NavigationEvent.CANCEL)
        elif self._after_hooks is not None:
            cancel_scope(self._after_hooks)

    async def navigate(
        self,
        target_id: str,
        *,
        summarize: bool = False,
        instructions: str | None = None,
        replace_instructions: bool = False,
        label: str | None = None,
    ) -> NavigationResult:
        """Navigate the session tree (see :meth:`AgentSession.navigate`).

        Raises:
            SessionError: a turn is running, or the target is unknown.
            ModelError: the branch summary failed, with its kind and retry-after.
            ConflictError: another program wrote meanwhile; nothing was attached (D27).
        """
        session = self._session()
        old_leaf = session.leaf_id
        request = _Request(
            navigation_target(session.tree, target_id),
            old_leaf,
            summarize=summarize,
            instructions=instructions,
            replace_instructions=replace_instructions,
            label=label,
        )
        self._request = request
        self.effects = self.effects or self.effect_table()
        machine = Interpreter(
            self.ports.tables("navigation"), self.effects, observers=(weakly(self._record),)
        )
        self.machine = machine
        facts = start_facts(working=self.turn_running(), target_id=target_id, old_leaf_id=old_leaf)
        with self.ports.tracer.navigation_span(session.session_id, target_id):
            try:
                async with anyio.create_task_group() as group:
                    stop_timer = self._start_deadline(machine, group)
                    try:
                        await self._loop(group, NavigationEvent.NAVIGATE, facts)
                    finally:
                        stop_timer()
            except BaseExceptionGroup as errors:
                error = first_error(errors)
                # Its own cause kept (`from None` would erase it: a surface reads the chain for
                # the system error behind it), the group's context hidden.
                raise error from error.__cause__
            except anyio.get_cancelled_exc_class():
                # Cancelled from outside (a server shutting down, a TUI quitting): settle through
                # the table's cancel row, shielded, so nothing is attached and the session can be
                # closed or navigate again (D22).
                with anyio.CancelScope(shield=True):
                    if not machine.done and machine.listed(NavigationEvent.CANCEL):
                        async with anyio.create_task_group() as group:
                            await self._loop(group, NavigationEvent.CANCEL, NO_NAVIGATION_FACTS)
                raise
            finally:
                if not machine.done:  # an error (a refused step) ended it: the navigation is over
                    self.machine = None
        return self._result(machine.state, request)

    def effect_table(self) -> Mapping[str, Effect]:
        """The navigation table's effects, by name, as this host performs them."""
        # Weakly bound: this table and the last navigation's machine are kept, and would make a
        # reference cycle holding the session until a full collection (see scheduler.weakly). Made
        # when first needed: most sessions never navigate.
        effects = navigation_effects(self)
        return {name: weakly(effect) for name, effect in effects.items()}

    def _start_deadline(self, machine: Interpreter, group: Any) -> Callable[[], None]:
        """Arm the operation deadline over the hooks' phase; returns what disarms it.

        A ``session_before_tree`` handler that never answers must not hold the navigation for
        good: the table's ``deadline_passed`` row fails it and cancels the handler. Once the
        summary runs, its operation keeps its own deadline (the table has no row there).
        """
        seconds = self.ports.deadline_s
        if seconds is None:
            return lambda: None

        def passed() -> None:
            if not machine.done and machine.listed(NavigationEvent.DEADLINE_PASSED):
                self._current().hook_timeout = seconds
                machine.interrupt(NavigationEvent.DEADLINE_PASSED)

        stop = call_later(seconds, passed)
        if stop is not None:
            return stop
        timer = anyio.CancelScope()  # trio has no timed callbacks: a task in the group

        async def wait() -> None:
            with timer:
                await anyio.sleep(seconds)
                passed()

        group.start_soon(wait)
        return lambda: cancel_scope(timer)

    async def _loop(self, group: Any, event: str, facts: Facts) -> None:
        self._group = group
        try:
            await run_table(self, event, facts)
        finally:
            self._group = None
        self._machine().drop_interrupts()

    # -- the loop's words (driver.TableHost) ------------------------------------------------------

    async def step(self, event: str, facts: Facts, data: Mapping[str, Any]) -> tuple[str, ...]:
        """Take one step; the row's effects."""
        return self._machine().step(event, facts, data).effects

    def perform(self, name: str) -> Awaitable[Report | None]:
        """Perform one effect; the slow ones in flight, so a cancel can be stepped meanwhile."""
        machine = self._machine()
        if name in AWAITING:
            return machine.in_flight(self._group, self.effects[name])
        return machine.perform(name)

    def interrupted(self) -> tuple[str, Facts] | None:
        """The oldest pending interrupt, if the table lists it now."""
        return self._machine().interrupted(NO_NAVIGATION_FACTS)

    def translate(self, effect: str, report: Report) -> tuple[str, Facts, Mapping[str, Any]]:
        """The event ``effect``'s report fires (the navigation core's words)."""
        request = self._current()
        event, facts = navigation_event(
            effect, report, wants_summary=request.summarize, has_entries=bool(request.entries)
        )
        return event, facts, NO_DATA

    def _machine(self) -> Interpreter:
        assert self.machine is not None
        return self.machine

    def _result(self, state: str, request: _Request) -> NavigationResult:
        session = self._session()
        old = request.old_leaf
        if state == NavigationState.REFUSED:
            raise SessionError(BUSY)
        if state == NavigationState.FAILED:
            if request.hook_timeout is not None:
                raise ModelTimeoutError(
                    "session_before_tree handlers did not answer within "
                    f"{request.hook_timeout:g} s",
                )
            outcome = request.outcome
            if outcome is not None and outcome.status == OperationState.CONFLICT:
                # Another program wrote meanwhile (D27): the store's reason, not a model failure.
                raise ConflictError(
                    outcome.error or "Branch summary conflicted with another writer"
                )
            raise model_error(
                (outcome.error_kind if outcome else None) or "fatal",
                (outcome.error if outcome else None) or "Branch summarization failed",
                retry_after=outcome.retry_after if outcome else None,
            ) from (outcome.cause if outcome else None)
        if state == NavigationState.CANCELLED:
            aborted = request.outcome is not None
            return NavigationResult(
                cancelled=True, aborted=aborted, new_leaf_id=old, old_leaf_id=old
            )
        if not request.moved:  # done by a row that moved nothing (the same position)
            return NavigationResult(new_leaf_id=old, old_leaf_id=old)
        return NavigationResult(
            editor_text=request.target.editor_text,
            new_leaf_id=session.leaf_id,
            old_leaf_id=old,
            summary_entry=request.summary_entry,
        )

    def _session(self) -> Any:
        session = self.ports.session
        assert session is not None, "a navigator needs a session"
        return session

    def _current(self) -> _Request:
        assert self._request is not None
        return self._request

    def _record(self, step: Step, data: Mapping[str, Any]) -> None:
        del data
        if self.ports.journal is not None:
            # What the guards read, so the journal replays through the table (D31).
            facts = facts_delta(step.facts) if step.facts is not None else {}
            self.ports.journal.write_step(step, data={"facts": facts})
        self.ports.observe(step)

    # -- the effect table -------------------------------------------------------------------------

    async def collect_entries(self) -> Report:
        request, tree = self._current(), self._session().tree
        # Two walks of paths that grow with the session: off the loop on a big one. Nothing
        # appends meanwhile: the session table admits no turn or compaction beside a navigation.
        entries, request.ancestor = await self.ports.heavy(
            len(tree),
            lambda: collect_branch_entries(tree, request.old_leaf, request.target.target_id),
        )
        # A leaf marker records where an earlier navigation left the leaf; it is no content of
        # the branch. A branch of markers only is nothing to summarize: a plain move (row 9),
        # not a "No content to summarize" entry (pi, which writes no markers, has none there).
        request.entries = [entry for entry in entries if not is_leaf_marker(entry)]
        return Report(outcome=ReportOutcome.OK)

    async def run_hooks(self) -> Report:
        request = self._current()
        hook = await self.ports.run_hook(
            "session_before_tree",
            {
                "type": "session_before_tree",
                "preparation": {
                    "targetId": request.target.target_id,
                    "oldLeafId": request.old_leaf,
                    "commonAncestorId": request.ancestor,
                    "entriesToSummarize": [e["id"] for e in request.entries],
                    "userWantsSummary": request.summarize,
                    "customInstructions": request.instructions,
                    "replaceInstructions": request.replace_instructions,
                    "label": request.label,
                },
            },
        )
        if hook and hook.get("cancel"):
            return Report(outcome=ReportOutcome.CANCELLED)
        checked = tree_changes(hook)
        self.ports.hook_result_problems("session_before_tree", checked.problems)
        changes: TreeChanges = checked.value
        request.instructions, request.replace_instructions, request.label = changes.applied(
            request.instructions, request.replace_instructions, request.label
        )
        if changes.supplied is not None:
            request.supplied = changes.supplied
            return Report(outcome=ReportOutcome.SUPPLIED)
        return Report(outcome=ReportOutcome.DONE)

    async def start_summary(self) -> Report:
        request = self._current()
        candidates = self.ports.routes.candidates
        window = (candidates[0].context_window if candidates else 0) or FALLBACK_CONTEXT_WINDOW
        if window <= self.branch_reserve_tokens:
            # Nothing of the branch could fit: pi would commit "No content to summarize" for
            # a branch full of content, without asking any model. Refused instead, nothing
            # written, as a compaction's request that leaves no room is (summary_request.py).
            request.outcome = OperationOutcome(
                operation_id="",
                status=OperationState.FAILED,
                error=no_room_for_branch(window, self.branch_reserve_tokens),
                error_kind="fatal",
            )
            return Report(outcome=ReportOutcome.FAILED)
        plan = prepare_branch_entries(
            request.entries,
            max(1, window - self.branch_reserve_tokens),
            old_leaf_id=request.old_leaf,
            target_id=request.target.target_id,
            common_ancestor_id=request.ancestor,
        )
        outcome = await self.operations.branch_summary(
            plan,
            new_leaf_id=request.target.new_leaf_id,
            old_leaf_id=request.old_leaf,
            instructions=request.instructions,
            replace_instructions=request.replace_instructions,
        )
        request.outcome = outcome
        request.summary_entry = outcome.entry
        request.moved = outcome.entry is not None
        return Report(outcome=ReportOutcome(outcome.status))

    async def cancel_summary(self) -> None:
        self.operations.cancel()
        assert self.machine is not None
        await self.machine.wait_in_flight()

    async def stop_hooks(self) -> None:
        # A handler that never returns must not hold the navigation: it is cancelled like a
        # model call (D22); nothing was written before the hooks answered.
        assert self.machine is not None
        await self.machine.stop_in_flight()

    async def switch_leaf(self) -> Report:
        request = self._current()
        apply_navigation(self._session(), request.target, old_leaf_id=request.old_leaf)
        request.moved = True
        return Report(outcome=ReportOutcome.OK)

    async def switch_leaf_with_summary(self) -> Report:
        request = self._current()
        supplied = request.supplied or {}
        request.summary_entry = apply_navigation(
            self._session(),
            request.target,
            old_leaf_id=request.old_leaf,
            summary=supplied.get("summary"),
            details=supplied.get("details"),
            from_extension=True,
        )
        request.from_extension = True
        request.moved = True
        return Report(outcome=ReportOutcome.OK)

    async def rebuild_context(self) -> None:
        # The whole path's context: on a big session, off the loop (Ports.heavy), kept here.
        session = self._session()
        if not session.context_is_live:
            session.take_context(await self.ports.heavy(len(session.tree), session.build_context))

    async def emit_session_tree(self) -> None:
        request, session = self._current(), self._session()
        summary_entry = request.summary_entry
        if request.label:
            # pi labels the summary entry when there is one, else the target. Like pi, the label
            # entry is a child of the new leaf (labels are never in the context).
            session.append_label(
                summary_entry["id"] if summary_entry else request.target.target_id, request.label
            )
        try:
            with anyio.CancelScope() as self._after_hooks:
                await self.ports.run_hook(
                    "session_tree",
                    {
                        "type": "session_tree",
                        "newLeafId": session.leaf_id,
                        "oldLeafId": request.old_leaf,
                        "summaryEntry": summary_entry,
                        "fromExtension": request.from_extension if summary_entry else None,
                    },
                )
        finally:
            self._after_hooks = None
        self.ports.events.emit(
            "session_tree",
            newLeafId=session.leaf_id,
            oldLeafId=request.old_leaf,
            summaryEntryId=summary_entry["id"] if summary_entry else None,
        )


async def fork_to(
    ports: Ports, entry_id: str, path: str | os.PathLike[str] | None, *, owner: str
) -> ForkResult:
    """Fork into a new file (default: beside the session; in memory for an in-memory session).

    The new file is owned by ``owner`` from before it exists (D27), and let go again when a hook
    cancels the fork.

    Raises:
        SessionError: ``Invalid entry ID for forking``, or the target file exists.
    """
    session = ports.session
    assert session is not None, "forking needs a session"
    store: SessionStore
    if path is None and isinstance(session.store, MemoryStore):
        store = MemoryStore()
    else:
        target = Path(path) if path is not None else fork_path(session.store.location)
        if os.path.lexists(target):  # a symbolic link too, even one that points nowhere
            raise SessionError(f"{target}: already exists")
        store = JsonlStore(target)
        store.own(owner)
        if os.path.lexists(target):  # created by someone else in between
            store.close()
            raise SessionError(f"{target}: already exists")
    try:
        result = await fork(ports, entry_id, store)
        if result.session is not None and isinstance(store, JsonlStore):
            # A fork into a file writes it now, as `orchestrator fork` does, even when the
            # path holds no assistant message yet (pi defers that write): the caller named a
            # file and is told it exists, and a second fork to it is "already exists", not a
            # lock this process holds on a file nobody can see.
            await off_loop(result.session, result.session.flush)
    except BaseException:
        # Cancelled or failed before the caller heard of it (a slow `session_fork` hook and a
        # server stopping): the file this fork made, if it wrote one, goes too, so that nothing
        # was forked, as the caller is told, and the path can be used again.
        if isinstance(store, JsonlStore):
            _remove_new_file(store)
        store.close()
        raise
    if result.session is None:
        store.close()  # cancelled by a hook: nothing was written, let go of the new file
    return result


def _remove_new_file(store: JsonlStore) -> None:
    """Remove the file a fork created, while its lock (taken before it existed) is held."""
    try:
        os.unlink(store.path)
    except FileNotFoundError:
        pass  # not written yet (pi's deferred write)
    except OSError as error:
        _log.warning("%s: could not remove the unfinished fork: %s", store.path, error)


async def fork(ports: Ports, entry_id: str, store: SessionStore) -> ForkResult:
    """Fork the path before a user message into a new session (pi's fork)."""
    session = ports.session
    assert session is not None, "forking needs a session"
    leaf, editor_text = fork_target(session, entry_id)
    hook = await ports.run_hook(
        "session_before_fork", {"type": "session_before_fork", "entryId": entry_id}
    )
    if hook and hook.get("cancel"):
        return ForkResult(cancelled=True, editor_text=editor_text)
    # The copy and its write grow with the path: off the loop on a big session, reading a
    # snapshot of the tree that appends meanwhile (a fork runs beside a turn) leave alone.
    tree = session.tree.snapshot()
    new = await ports.heavy(len(tree), lambda: branched_session(session, leaf, store, tree=tree))
    await ports.run_hook(
        "session_fork",
        {"type": "session_fork", "previousSessionFile": session.store.location},
    )
    ports.events.emit(
        "session_fork",
        previousSessionFile=session.store.location,
        newSessionFile=store.location,
        entryId=entry_id,
    )
    return ForkResult(session=new, editor_text=editor_text)
