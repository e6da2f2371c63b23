"""The ports record: everything a runtime driver may touch, passed in as one frozen value.

The turn driver, the operation runner and the navigator take this record instead of the
session object, so none of them can reach into another's state (house style habit 17). Each
field is one kind of I/O: the session store, the agent, the summary models, the hooks, the event
stream, the lifecycle journal, the tracer, the clock, the sleep used for waits, and the id source.
Tests instrument exactly these to check that nothing happens outside the table.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from orchestrator._core.model import Model
from orchestrator._lifecycle.machine import MachineDef, Step, load_machine
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session, wall_clock_ms
from orchestrator._telemetry.traced_model import TracedModel
from orchestrator._telemetry.tracing import LifecycleTracer

T = TypeVar("T")


HEAVY_ENTRIES = 5_000
"""From this many entries, work that grows with the session (a fork's copy, a navigation's new
context) runs through :attr:`Ports.offload`; below, on the event loop, where the thread's start
would cost more than the work."""


async def in_thread(work: Callable[[], T]) -> T:
    """Run ``work`` in a worker thread; a cancellation waits for it (nothing half done)."""
    return await anyio.to_thread.run_sync(work)


def random_operation_id() -> str:
    """Twelve random hex digits (no system call: see ``_store.session._random_hex``)."""
    return f"{random.getrandbits(48):012x}"


def default_routes(agent: Agent | None, settings: RuntimeSettings) -> SummaryRoutes:
    """The current model route: the agent's own (a ``ChatAgent``'s), else the offline one."""
    model = getattr(agent, "model", None)
    route = model if isinstance(model, Model) else OfflineSummarizer()
    return SummaryRoutes(
        candidates=(route,),
        reserve_tokens=settings.compaction.reserve_tokens,
        retry=settings.retry,
        gate=True,
    )


def traced_routes(
    routes: SummaryRoutes, tracer: LifecycleTracer, *, short_summary: bool
) -> SummaryRoutes:
    """The routes with each model wrapped in a span carrying the GenAI attributes."""
    return dataclasses.replace(
        routes,
        candidates=tuple(TracedModel(m, tracer) for m in routes.candidates),
        remote=TracedModel(routes.remote, tracer) if routes.remote is not None else None,
        fallback=TracedModel(routes.fallback, tracer) if routes.fallback is not None else None,
        short_summary=routes.short_summary or short_summary,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Ports:
    """What the runtime's drivers perform their effects through.

    Attributes:
        session: The session (store, tree, live context); ``None`` for a summary of a bare plan.
        routes: The summary models and their retry policy.
        agent: Runs the agent's turns (``None``: this session only compacts and navigates).
        hooks: The hook registry (D25).
        events: The event stream.
        journal: The lifecycle journal (``None``: not journaled, as for a dry run).
        tracer: The OpenTelemetry wrapper.
        clock_ms: Epoch-ms clock (prune times, message times).
        sleep: Awaited for every wait, in seconds.
        ids: Source of operation ids.
        timeout_s: Per model call to a route that answers in one piece, seconds (``None``: no
            limit).
        idle_s: Per model call to a route that streams: the longest silence, seconds (``None``:
            the route's own).
        deadline_s: Per operation, seconds, over all its calls and waits (``None``: no limit).
        tables: Where the machine tables come from, by name (tests pass modified copies to
            show that the behaviour follows the table).
        offload: Runs work that grows with the session off the event loop (default: a worker
            thread; the server passes its bounded, fair scheduler, ``_rpc/fair.py``).
    """

    session: Session | None
    routes: SummaryRoutes
    agent: Agent | None = None
    hooks: Hooks = field(default_factory=Hooks)
    events: EventBus = field(default_factory=EventBus)
    journal: Journal | None = None
    tracer: LifecycleTracer = field(default_factory=lambda: LifecycleTracer(None))
    clock_ms: Callable[[], int] = wall_clock_ms
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    ids: Callable[[], str] = random_operation_id
    timeout_s: float | None = None
    idle_s: float | None = None
    deadline_s: float | None = None
    tables: Callable[[str], MachineDef] = load_machine
    offload: Callable[[Callable[[], Any]], Awaitable[Any]] = in_thread

    async def heavy(self, size: int, work: Callable[[], T]) -> T:
        """``work``, which grows with ``size`` entries: off the loop from :data:`HEAVY_ENTRIES`."""
        if size < HEAVY_ENTRIES:
            return work()
        result: T = await self.offload(work)
        return result

    async def run_hook(self, name: str, payload: dict[str, Any]) -> Mapping[str, Any] | None:
        """Run a hook; a handler's exception becomes a ``hook_error`` event (D25)."""
        return await self.hooks.run(name, payload, self._hook_error)

    def _hook_error(self, name: str, error: BaseException) -> None:
        self.events.emit("hook_error", hook=name, error=f"{type(error).__name__}: {error}")

    def hook_result_problems(self, name: str, problems: Sequence[str]) -> None:
        """Report what was malformed in a handler's result (its default applies instead, D25)."""
        for problem in problems:
            self.events.emit("hook_error", hook=name, error=f"invalid result: {problem}")

    def observe(self, step: Step) -> None:
        """Trace and announce one machine step (journaling is the machine driver's)."""
        self.tracer.on_step(step)
        if self.events.wants("transition"):  # every step: built only when someone listens
            self.events.emit(
                "transition",
                machine=step.machine,
                source=step.source,
                event=step.event,
                dest=step.dest,
                effects=list(step.effects),
            )
