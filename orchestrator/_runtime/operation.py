"""One journaled operation: a compaction, a branch summary or a prune.

Theory of operation. Each operation owns an operation machine (``machines/operation.toml``) and
an id. Every step of the machine goes to the lifecycle journal (fsynced, D24), to the tracer and
to listeners as ``compaction_update``. The phases are:

    preparing -> consulting_hooks -> summarizing [-> waiting_retry -> summarizing ...]
              -> committing -> committed        (or skipped / cancelled / failed)

The summary calls themselves run through :mod:`orchestrator._runtime.retry` (tenacity does the
waiting); the driver translates each reported attempt into the machine's events (``attempt_failed``
with the facts that pick the row, ``wait_done``, ``summary_overflow``), so the machine both records
and validates what happened: an attempt sequence the table does not allow raises. For a split turn
the history summary's attempts drive the machine and the concurrent turn-prefix attempts are traced
only, since one machine cannot be in two summarizing states at once.

The commit is one step: the entry to append is built first, its id journaled when the machine
enters ``committing``, then appended. On reopen, an operation left in ``committing`` is settled
``committed`` if that id is in the file and ``failed`` otherwise; earlier phases settle
``cancelled``. Nothing is ever half-applied, because nothing is applied before ``committing``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio

from orchestrator._core.errors import ModelError
from orchestrator._core.model import Purpose
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.retry import AttemptRecord, RetryPolicy
from orchestrator._store.journal import Journal

_STATUS = {
    "committed": "completed",
    "skipped": "skipped",  # nothing was done: a client must not read it as a success
    "failed": "failed",
    "cancelled": "cancelled",
}


class Operation:
    """The machine, journal and events of one operation.

    Args:
        kind: ``compaction``, ``branch_summary`` or ``prune``.
        journal: Where steps are recorded (``None``: not journaled).
        events: Where ``compaction_update`` goes.
        observers: Extra step observers (the tracer).
        retry: The retry policy the summarizer uses (for the machine's facts).
        candidates: How many candidate models there are.
        reason: Why it runs (``threshold``, ``overflow``, ``manual``, ``navigation``).
        operation_id: Its id (default: 12 random hex digits).
    """

    def __init__(
        self,
        kind: str,
        *,
        journal: Journal | None,
        events: EventBus,
        observers: tuple[Callable[[Step], None], ...] = (),
        retry: RetryPolicy | None = None,
        candidates: int = 1,
        reason: str | None = None,
        operation_id: str | None = None,
    ) -> None:
        self.id = operation_id or uuid.uuid4().hex[:12]
        self.kind = kind
        self.reason = reason
        self.error: BaseException | None = None
        self._journal = journal
        self._events = events
        self._retry = retry or RetryPolicy()
        self._candidates = candidates
        self._shrinks = 0
        self._data: dict[str, Any] = {}
        self.scope = anyio.CancelScope()
        self.runner = Runner(load_machine("operation"), observers=(self._record, *observers))
        self._emit_update("in_progress")

    @property
    def state(self) -> str:
        """The machine's state."""
        return self.runner.state

    def fire(self, event: str, facts: Facts | None = None, **data: Any) -> Step:
        """Fire an event; ``data`` is journaled with the step."""
        self._data = data
        return self.runner.fire(event, facts)

    def _record(self, step: Step) -> None:
        if self._journal is not None:
            data = {k: v for k, v in self._data.items() if v is not None}
            if self.reason and step.source == "preparing":
                data.setdefault("reason", self.reason)
            self._journal.record(step, operation_id=self.id, kind=self.kind, data=data)
        if self.runner.done:
            self._emit_update(_STATUS[self.runner.state])

    def _emit_update(self, status: str) -> None:
        self._events.emit("compaction_update", id=self.id, kind=self.kind, status=status)

    # -- translating summarizer attempts into machine events ------------------------------------

    def on_attempt(self, record: AttemptRecord, purpose: Purpose) -> None:
        """Feed one reported summarizer attempt to the machine (see the module comment)."""
        if purpose not in ("history", "branch") or self.state not in (
            "summarizing",
            "waiting_retry",
        ):
            return
        if self.state == "waiting_retry":
            self.fire("wait_done")
        if record.outcome == "ok":
            return
        error = record.error
        error_text = str(error) if error is not None else None
        if record.outcome == "failed" and error is not None and error.kind == "overflow":
            self.fire(
                "summary_overflow",
                Facts(shrink_attempts=self._shrinks),
                error=error_text,
                model=record.candidate,
            )
            self._shrinks += 1
            return
        retryable = record.outcome == "retry" or (
            error is not None and error.kind == "transient" and record.outcome != "failed"
        )
        facts = Facts(
            retryable=retryable,
            retry_attempt=record.attempt - 1
            if record.outcome == "retry"
            else self._retry.max_retries,
            max_retries=self._retry.max_retries,
            delay_ms=record.delay_ms,
            max_delay_ms=self._max_delay(),
            more_candidates=record.outcome == "next_candidate",
        )
        self.fire(
            "attempt_failed",
            facts,
            error=error_text,
            model=record.candidate,
            attempt=record.attempt,
            delay_ms=record.delay_ms or None,
        )

    def _max_delay(self) -> int:
        # The 30 s candidate switch applies while another candidate remains; on the last one the
        # retry module allows waits up to max_delay_ms.
        return self._retry.switch_after_ms if self._candidates > 1 else self._retry.max_delay_ms

    # -- endings ----------------------------------------------------------------------------------

    def settle_error(self, error: BaseException) -> None:
        """Bring the machine to ``failed`` after an error the attempts did not already end."""
        self.error = error
        if self.runner.done:
            return
        if self.state == "waiting_retry":
            self.fire("wait_done")
        if self.state == "summarizing":
            self.fire("attempt_failed", Facts(), error=str(error))
        elif self.state == "committing":
            self.fire("append_failed", error=str(error))

    def settle_cancel(self) -> None:
        """Bring the machine to ``cancelled`` (nothing was applied, D22)."""
        if not self.runner.done and self.state != "committing":
            self.fire("cancel")

    def error_text(self) -> str:
        """The failure as one line."""
        if isinstance(self.error, ModelError) or self.error is not None:
            return str(self.error) or type(self.error).__name__
        return ""
