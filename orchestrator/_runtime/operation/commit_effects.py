"""The operation run's effects that commit: the append or rewrite, and what follows it.

These are the effects of ``committing`` and of the final states, performed for
:class:`~orchestrator._runtime.operation.run.OperationRun` (whose docstring holds the theory of
operation): the conditional append or rewrite (D27), for a compaction in one disk-thread call
with the journal's fsync and the append's; the re-read after a conflict; the context rebuilt;
and ``session_compact`` or ``session_compact_failed`` told. They are what writes the session, so
they stand apart from the loop and from the model calls
(:mod:`~orchestrator._runtime.operation.ask_effects`, which says why both are mixins).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import anyio

from orchestrator._core.entries import Entry
from orchestrator._core.errors import OrchestratorError
from orchestrator._core.load_result import Tail
from orchestrator._lifecycle.machine import Step
from orchestrator._lifecycle.names import OperationState, ReportOutcome
from orchestrator._runtime.disk import off_loop
from orchestrator._runtime.driver import Report
from orchestrator._runtime.operation.compact_hooks import retries_after
from orchestrator._runtime.operation.driver import OperationDriver, commit_failure
from orchestrator._runtime.operation.jobs import CompactionJob
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.scheduler import Scheduler
from orchestrator._store.session import Session

_log = logging.getLogger("orchestrator")


class CommitEffects:
    """The commit and what follows it, mixed into ``OperationRun`` (whose fields they share)."""

    # The run's fields these effects use (set by OperationRun.__init__).
    ports: Ports
    job: Any
    driver: OperationDriver
    dry_run: bool
    _expect: Tail | None
    _scheduler: Scheduler
    _result: Any
    _entry: Entry | None
    _pruned: list[Entry]
    _commit_cause: BaseException | None
    _unsynced: bool

    if TYPE_CHECKING:
        # Declared for the type checker only: OperationRun defines them, and a stub that
        # existed at run time could only ever shadow the real one.

        @property
        def state(self) -> OperationState: ...

        @property
        def kind(self) -> str: ...

    def _commits_in_thread(self, taken: Step) -> bool:
        # A compaction's commit makes the journal durable itself, in the same worker-thread
        # call as the append (see _append_entry): one hop, not two.
        return (
            "append_entry" in taken.effects
            and isinstance(self.job, CompactionJob)
            and not self.dry_run
            and self.ports.session is not None
            and self._entry is not None
        )

    async def _append_entry(self) -> Report:
        session, entry = self.ports.session, self._entry
        if self.dry_run or session is None or entry is None:
            return Report(outcome=ReportOutcome.OK)
        return await self._commit(self._append(session, entry), {"entryId": entry["id"]})

    async def _append(self, session: Session, entry: Entry) -> None:
        if isinstance(self.job, CompactionJob):
            await self._write_in_thread(session, entry)
        else:
            self.job.append(session, entry, self._expect, flush=False)
            # Written; durable once flushed. The fsync runs in a worker thread while the
            # loop goes on; nothing else changes this session until the commit reported.
            await off_loop(session, session.flush)

    async def _rewrite_entries(self) -> Report:
        if self.dry_run:
            return Report(outcome=ReportOutcome.OK)
        return await self._commit(self._rewrite(), {"entryIds": [e["id"] for e in self._pruned]})

    async def _rewrite(self) -> None:
        self.job.rewrite(self._pruned, self._expect)

    async def _commit(self, write: Awaitable[None], data: dict[str, Any]) -> Report:
        try:
            await write
        except (OrchestratorError, OSError) as error:
            report = self.driver.committed(commit_failure(error))
            if report.outcome == "conflict":
                self._read_again()
            else:
                self._commit_cause = error
            return report
        return Report(outcome=ReportOutcome.OK, data=data)

    async def _write_in_thread(self, session: Session, entry: Entry) -> None:
        # In one worker-thread call, in this order: the journal's record of the entry's id made
        # durable (D24), the entry appended, the append fsynced. The event loop goes on with
        # other sessions meanwhile; nothing else writes this session until the commit reports,
        # and the tree and the live context take the entry back on the loop, once written.
        journal = self.ports.journal if self._unsynced else None
        self._unsynced = False
        expect = self._expect

        def commit() -> None:
            if journal is not None:
                journal.sync()
            session.write_entry(entry, expect=expect)

        session.check_new(entry)
        # The disk work is a wait like a model's: the start slot goes to the next operation
        # meanwhile (held through it, eight slots allowed eight commits at a time, about a
        # thousand a second: the bound of the thousand compactions, issue 9), and is taken
        # again for what follows (admission.py).
        scheduler = self._scheduler
        held = scheduler.slot is not None
        scheduler.let_slot_go()
        with anyio.CancelScope(shield=True):  # committing takes no cancel (the table says so)
            await off_loop(session, commit)
            if held:
                # Before taking the entry back: a batch of commits comes back from the disk at
                # once, and their adoptions (each O(kept entries)) must not all run in one pass.
                await scheduler.take_slot()
            session.adopt(entry)

    def _read_again(self) -> None:
        # Another program (pi) wrote meanwhile, so nothing was applied; what it wrote is read
        # now, so that the next operation, automatic or asked for, works from what is there
        # (D27). On the loop: a conflict is rare, and nothing else may change the session in
        # between. Unreadable as a session, the file is left alone and the session as it was.
        session = self.ports.session
        if session is None:
            return
        try:
            session.reload()
        except OrchestratorError as error:
            # Not a warning: the conflict itself is the caller's error, and says what happened
            # (a command line printed both, the second as a stray, unexplained line).
            _log.info("%s; the session stays as it was read", error)

    async def _rebuild_context(self) -> None:
        if self.ports.session is not None and not self.dry_run:
            self.ports.session.context()

    async def _emit_result(self) -> None:
        # The table chose the ending (the final state); this tells pi's hooks and the listeners
        # of it, in pi's words (compact_hooks.py). A dry run tells nobody: nothing happened.
        if self.kind != "compaction" or self.dry_run:
            return
        reason = self.job.reason
        if self.state != OperationState.COMMITTED:
            failed = self.driver.compact_failed(
                self.state, from_extension=self.job.supplied is not None
            )
            if failed is not None:
                await self.ports.run_hook(
                    "session_compact_failed", {"type": "session_compact_failed", **failed}
                )
                self.ports.events.emit("session_compact_failed", **failed)
            return
        entry, session = self._entry, self.ports.session
        if entry is None or session is None:
            return
        from_extension = bool(getattr(self._result, "from_extension", False))
        will_retry = retries_after(reason)
        await self.ports.run_hook(
            "session_compact",
            {
                "type": "session_compact",
                "compactionEntry": entry,
                "fromExtension": from_extension,
                "reason": reason,
                "willRetry": will_retry,
            },
        )
        self.ports.events.emit(
            "session_compact",
            entryId=entry["id"],
            fromExtension=from_extension,
            reason=reason,
            willRetry=will_retry,
        )
