"""The operation run's effects that get the summary: hooks, model calls, retry waits, stopping.

:class:`~orchestrator._runtime.operation.run.OperationRun` steps the operation table and performs
its effects (the theory of operation is there). These are the effects of the phases before the
commit (``consulting_hooks``, ``summarizing``, ``waiting_retry``), the ``stop_work`` that ends
them, and the early attempts a split turn's later requests start alongside the first. They are
apart from the loop because they are what talks to the hooks and the models; like every effect
of a run they share its fields, so they are written as a mixin the run inherits, and they name
the fields they use in :class:`AskEffects`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator._core.model import Model
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.driver import Interpreter, Report
from orchestrator._runtime.operation.driver import OperationDriver, part_routes
from orchestrator._runtime.operation.retry import NO_MODEL
from orchestrator._runtime.operation.summarize import Part, SummaryRoutes
from orchestrator._runtime.outcomes import Attempt, Attempts, attempt_summary
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.scheduler import cancel_scope


@dataclass(slots=True)
class _Early:
    """The first attempt of a later request, started alongside the first (see _start_early)."""

    scope: anyio.CancelScope
    done: anyio.Event
    attempt: Attempt = field(
        default_factory=lambda: Attempt(Report(outcome=ReportOutcome.CANCELLED))
    )


class AskEffects:
    """The effects before the commit, mixed into ``OperationRun`` (whose fields they share)."""

    # The run's fields these effects use (set by OperationRun.__init__).
    ports: Ports
    job: Any
    routes: SummaryRoutes
    driver: OperationDriver
    machine: Interpreter
    _at: Attempts
    _group: Any
    _early: dict[int, _Early]

    def _answered_early(self) -> _Early | None:
        """The finished early attempt the next ``call_model`` takes its answer from, if any."""
        at = self._at
        if at.candidate or at.retries or at.halvings or at.refusals or at.offline:
            return None  # only a part's first attempt was started early
        early = self._early.get(at.part)
        return early if early is not None and early.done.is_set() else None

    async def _run_hooks(self) -> Report:
        report: Report = await self.job.consult_hooks()
        self.driver.routes = part_routes(self.job.parts)  # the hooks made the requests
        if report.outcome == "supplied":
            self.driver.hook_supplied(*self.job.hook_summary())
        return report

    async def _drop_hook_result(self) -> None:
        self.job.supplied = None  # the gate refused it: summarized as without the hook

    def _route(self) -> tuple[Part, Model | None]:
        part = self.job.parts[self._at.part]
        if self._at.offline:
            return part, self.routes.fallback
        model = part.routes[self._at.candidate] if self._at.candidate < len(part.routes) else None
        return part, model

    async def _call_model(self) -> Report:
        part, model = self._route()
        if model is None:
            return Report(outcome=ReportOutcome.FATAL, error=NO_MODEL)
        at = self._at
        first = not (at.candidate or at.retries or at.halvings or at.refusals or at.offline)
        if first and self._at.part == 0:
            self._start_early(model)
        early = self._early.pop(self._at.part, None) if first else None
        if early is not None:
            if not early.done.is_set():  # a finished one is taken without a pass of the loop
                await early.done.wait()
            attempt = early.attempt
        else:
            attempt = await self._attempt(part, model, self._at.halvings, self._at.feedback)
        return self.driver.accept(attempt, part.purpose)

    async def _attempt(
        self, part: Part, model: Model, halvings: int, feedback: str = ""
    ) -> Attempt:
        ports = self.ports
        return await attempt_summary(
            part, model, halvings, self.driver.texts, ports.timeout_s, feedback, idle_s=ports.idle_s
        )

    def _start_early(self, model: Model) -> None:
        # A split turn's prefix does not depend on the history summary, so the first call of the
        # operation also starts the first attempt of every later independent request: a split
        # compaction costs about one model latency, not two. The table still decides, in order,
        # what each result means when its part is reached; a result it never reaches is dropped.
        if self._group is None:
            return
        for index, part in enumerate(self.job.parts[1:], start=1):
            if not part.independent or not part.routes:
                continue
            early = _Early(scope=anyio.CancelScope(), done=anyio.Event())
            self._early[index] = early
            self._group.start_soon(self._run_early, early, part, part.routes[0])

    async def _run_early(self, early: _Early, part: Part, model: Model) -> None:
        try:
            with early.scope:
                early.attempt = await self._attempt(part, model, 0)
        finally:
            early.done.set()

    def _drop_early(self) -> None:
        for early in self._early.values():
            cancel_scope(early.scope)
        self._early.clear()

    async def _sleep_retry(self) -> Report:
        await self.routes.sleep(self.driver.retry_wait_s())
        return Report(outcome=ReportOutcome.OK)

    async def _stop_work(self) -> None:
        self._drop_early()
        await self.machine.stop_in_flight()
