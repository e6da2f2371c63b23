"""The runtime: an agent session driven through the turn and navigation machines.

Theory of operation. :class:`AgentSession` is the one async layer. It owns a
:class:`~orchestrator.Session` (store, tree, context), the machines, the model routes, the
hooks, the event bus, the journal and the tracer. The machines decide; this class performs.

The turn loop (:meth:`_drive`) fires an event into the turn machine, performs the effects of
the row taken (each effect is a method named ``_fx_<effect>``), and an effect that produces an
outcome (the agent's reply, a finished wait, a compaction's result) returns the next event.
The loop ends when the machine rests in ``idle`` with nothing queued.

Interrupts. ``abort()`` and a manual ``compact()`` can arrive while an effect is awaiting (the
agent, a retry wait, a compaction). They record the interrupt and cancel the effect's own
cancel scope; the loop then fires the interrupt's event (``abort`` / ``manual_compact``) from
whatever state the machine is in, and the table decides what that means there (D22: a retry
wait is cancelled alone; manual compaction stops the active work, waits for it to settle,
compacts, and does not resume the turn).

Facts. Guards read a :class:`~orchestrator._lifecycle.guards.Facts` record that this class builds
from its per-turn counters (D18 overflow recovery once per user turn, D19 one automatic compaction
per turn) and from the last reply's measurements.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from orchestrator._core.errors import Cancelled, SessionError
from orchestrator._core.model import Model
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.navigate import Navigator, fork
from orchestrator._runtime.operation import OperationRun
from orchestrator._runtime.operations import OperationRunner, raise_for
from orchestrator._runtime.ports import Ports, random_operation_id
from orchestrator._runtime.summarize import SummaryRoutes
from orchestrator._runtime.turn_effects import TurnEffects
from orchestrator._runtime.types import (
    ForkResult,
    NavigationResult,
    OperationOutcome,
    RuntimeSettings,
    TurnCounters,
    TurnResult,
)
from orchestrator._store.fork import fork_path
from orchestrator._store.journal import Journal
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session, wall_clock_ms
from orchestrator._store.settle import Settlement, settle_unfinished_operations
from orchestrator._telemetry.traced_model import TracedModel
from orchestrator._telemetry.tracing import LifecycleTracer


class AgentSession(TurnEffects):
    """An agent session: prompts, compactions, navigation and forks, through machines.

    Args:
        session: The session to drive.
        agent: Runs turns (required for :meth:`prompt`).
        summarizer: Summary routes (default: the agent's own model route when it has one, as
            the seed says summaries use the current model route; else the offline summarizer).
        settings: Runtime settings.
        hooks: Hook registry (default: empty).
        journal: Lifecycle journal (default: none).
        tracer: OpenTelemetry tracer wrapper (default: none).
        sleep: Awaited for retry waits (inject a fake clock's ``sleep`` in tests).
        clock_ms: Epoch-ms clock for prunes and message times.
        operation_ids: Source of operation ids (default: random; simulations pass a counter).
    """

    def __init__(
        self,
        session: Session,
        *,
        agent: Agent | None = None,
        summarizer: SummaryRoutes | None = None,
        settings: RuntimeSettings | None = None,
        hooks: Hooks | None = None,
        journal: Journal | None = None,
        tracer: LifecycleTracer | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock_ms: Callable[[], int] = wall_clock_ms,
        operation_ids: Callable[[], str] | None = None,
    ) -> None:
        self.session = session
        self.agent = agent
        self.settings = settings or RuntimeSettings()
        self.tracer = tracer or LifecycleTracer(None)
        base = summarizer or SummaryRoutes(
            candidates=(_current_route(agent),),
            reserve_tokens=self.settings.compaction.reserve_tokens,
            retry=self.settings.retry,
        )
        self.hooks = hooks or Hooks()
        self.events = EventBus()
        self.journal = journal
        self.settlements: list[Settlement] = []
        self.owner = "AgentSession"  # named in the lock of the files this runtime writes (D27)
        self._sleep = sleep
        self._clock_ms = clock_ms
        self._operation_ids = operation_ids or random_operation_id
        self.summarizer = base
        self._turn_state = TurnCounters()
        self._dropped: set[str] = set()
        self._queue: list[str] = []
        self._pending_prompt: str | None = None
        self._busy = False
        self._lock = anyio.Lock()
        self._effect_scope: anyio.CancelScope | None = None
        self._interrupt: str | None = None
        self._manual_focus: str | None = None
        self._manual_dry_run = False
        self._manual_waiters: list[tuple[anyio.Event, list[OperationOutcome]]] = []
        self._turns = 0
        self._retry_wait_ms = 0
        self.turn = Runner(load_machine("turn"), observers=(self.observe_step,))

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        owner: str = "AgentSession",
        random_hex: Callable[[], str] | None = None,
        **kwargs: Any,
    ) -> AgentSession:
        """Open a session file as its owner, with its journal, settling half-done operations.

        The session is owned until :meth:`close` (D27): its lock is taken before anything is
        read, so settling (D24) and every later operation run with no other owner. No model is
        called while settling: an operation whose commit entry is in the file is marked
        committed, one caught before its commit cancelled, any other failed. Each settlement is
        emitted as an ``operation_settled`` event and traced.

        Args:
            path: The session file (created when missing).
            owner: Who changes the session, named in the refusal another process gets
                (``"orchestrator serve"``).
            random_hex: Entry-id randomness (simulations pass a counter).
            **kwargs: Passed to the constructor.

        Raises:
            SessionLockedError: another process owns the session.
        """
        options: dict[str, Any] = {}
        if "clock_ms" in kwargs:
            options["clock"] = kwargs["clock_ms"]
        if random_hex is not None:
            options["random_hex"] = random_hex
        session = Session.open(Path(path), owner=owner, **options)
        try:
            journal = Journal.open(path)
            runtime = cls(session, journal=journal, **kwargs)
            runtime.owner = owner
            runtime.settlements = settle_unfinished_operations(
                journal, session.tree.by_id, is_applied=runtime._prune_applied
            )
        except BaseException:
            session.close()
            raise
        for settled in runtime.settlements:
            with runtime.tracer.operation_span(
                settled.kind or "operation", settled.operation_id, "reopened"
            ):
                runtime.tracer.on_step(
                    Step(
                        machine="operation",
                        source=settled.source,
                        event="reopened",
                        dest=settled.dest,
                        effects=(),
                    )
                )
            runtime.events.emit(
                "operation_settled",
                id=settled.operation_id,
                kind=settled.kind,
                source=settled.source,
                dest=settled.dest,
            )
        return runtime

    def _prune_applied(self, operation: Any) -> bool:
        ids = operation.data.get("entryIds") if operation.kind == "prune" else None
        if not isinstance(ids, list) or not ids:
            return False
        return all(
            isinstance(self.session.tree.by_id.get(i, {}).get("message"), dict)
            and self.session.tree.by_id[i]["message"].get("prunedAt") is not None
            for i in ids
        )

    def close(self) -> None:
        """Release the session (its write lock)."""
        self.session.close()

    # -- observation ---------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The turn machine's state."""
        return self.turn.state

    @property
    def is_busy(self) -> bool:
        """A turn (or a manual compaction) is in progress."""
        return self._busy

    @property
    def is_navigating(self) -> bool:
        """A tree navigation (perhaps writing a branch summary) is in progress."""
        return self.navigator.running

    def _refuse_during_navigation(self, what: str) -> None:
        if self.navigator.running:
            raise SessionError(f"Cannot {what} while a tree navigation is in progress")

    def now_ms(self) -> int:
        """The runtime's clock."""
        return self._clock_ms()

    def observe_step(self, step: Step) -> None:
        """Journal, trace and announce one machine step (every machine's observer)."""
        if self.journal is not None and step.machine != "operation":
            self.journal.record(step)
        self.tracer.on_step(step)
        self.events.emit(
            "transition",
            machine=step.machine,
            source=step.source,
            event=step.event,
            dest=step.dest,
            effects=list(step.effects),
        )

    @property
    def summarizer(self) -> SummaryRoutes:
        """The summary routes (each model wrapped in a span with the GenAI attributes)."""
        return self.ports.routes

    @summarizer.setter
    def summarizer(self, routes: SummaryRoutes) -> None:
        traced = dataclasses.replace(
            routes,
            candidates=tuple(TracedModel(m, self.tracer) for m in routes.candidates),
            remote=TracedModel(routes.remote, self.tracer) if routes.remote is not None else None,
            short_summary=routes.short_summary or self.settings.short_summary,
        )
        self._wire(traced)

    @property
    def session(self) -> Session:
        """The session driven (assigning another one rewires every driver to it)."""
        return self._session

    @session.setter
    def session(self, session: Session) -> None:
        self._session = session
        if hasattr(self, "ports"):
            self._wire(self.ports.routes)

    @property
    def settings(self) -> RuntimeSettings:
        """The runtime settings (assigning new ones takes effect at the next operation)."""
        return self._settings

    @settings.setter
    def settings(self, settings: RuntimeSettings) -> None:
        self._settings = settings
        if hasattr(self, "ports"):
            self._wire(self.ports.routes)

    def _wire(self, traced: SummaryRoutes) -> None:
        self.ports = Ports(
            session=self.session,
            routes=traced,
            hooks=self.hooks,
            events=self.events,
            journal=self.journal,
            tracer=self.tracer,
            clock_ms=self._clock_ms,
            sleep=self._sleep,
            ids=self._operation_ids,
            timeout_s=self.settings.model_timeout_s,
            deadline_s=self.settings.operation_deadline_s,
        )
        self.operations = OperationRunner(self.ports, self.settings.compaction)
        self.navigator = Navigator(
            self.ports,
            self.operations,
            branch_reserve_tokens=self.settings.branch_reserve_tokens,
            turn_running=lambda: self._busy,
        )

    @property
    def current_operation(self) -> OperationRun | None:
        """The operation in progress, if any."""
        return self.operations.current

    @property
    def branch_operation(self) -> OperationRun | None:
        """The branch summary in progress, if any."""
        current = self.operations.current
        return current if current is not None and current.kind == "branch_summary" else None

    async def run_hook(self, name: str, payload: dict[str, Any]) -> Mapping[str, Any] | None:
        """Run a hook; handler errors become ``hook_error`` events (D25)."""
        return await self.ports.run_hook(name, payload)

    # -- prompting -----------------------------------------------------------------------------

    async def prompt(self, text: str) -> TurnResult:
        """Send a user message and run the turn to its end (compactions and retries included).

        A prompt sent while a turn runs is queued and runs after it (the queued turn continues
        the session). Returns when the session is idle again.

        Raises:
            SessionError: no agent was given.
        """
        if self.agent is None:
            raise SessionError("this session has no agent; pass agent= to AgentSession")
        self._refuse_during_navigation("prompt")
        if self._busy:
            self._queue.append(text)
            return TurnResult(queued=True, state=self.state)
        self._pending_prompt = text
        await self._run("user_prompt")
        return TurnResult(reply=self._turn_state.last_reply, state=self.state)

    async def _run(self, event: str) -> None:
        async with self._lock:
            self._busy = True
            self._turns += 1
            try:
                with self.tracer.turn_span(self.session.session_id, self._turns):
                    await self._drive(event)
            finally:
                self._busy = False
                self._release_manual_waiters()

    async def _drive(self, first: str) -> None:
        event: str | None = first
        while event is not None:
            step = self.turn.fire(event, self._facts())
            event = await self._perform(step)
            if event is None:
                event = self._follow_up()

    def _follow_up(self) -> str | None:
        if self._interrupt is not None:
            return self._take_interrupt()
        if self.state == "continuing":
            return "resume"
        if self.state == "idle" and self._queue:
            self._pending_prompt = self._queue.pop(0)
            return "user_prompt"
        return None

    def _take_interrupt(self) -> str:
        event, self._interrupt = self._interrupt or "abort", None
        return event

    async def _perform(self, step: Step) -> str | None:
        outcome: str | None = None
        for effect in step.effects:
            result = await getattr(self, f"_fx_{effect}")()
            if self._interrupt is not None:
                return self._take_interrupt()
            if result is not None:
                outcome = result
        return outcome

    async def _interruptible(self, work: Callable[[], Awaitable[str | None]]) -> str | None:
        with anyio.CancelScope() as scope:
            self._effect_scope = scope
            try:
                return await work()
            finally:
                self._effect_scope = None
        return None

    def _facts(self) -> Facts:
        t = self._turn_state
        return Facts(
            compaction_enabled=self.settings.compaction.enabled,
            over_threshold=t.over_threshold,
            context_full=t.context_full,
            overflow_attempted=t.overflow_attempted,
            auto_compactions=t.auto_compactions,
            retry_attempt=t.retry_attempt,
            max_retries=self.settings.retry.max_retries if self.settings.retry.enabled else 0,
            will_retry=t.will_retry,
            auto_continue=self.settings.compaction.auto_continue,
        )

    # -- interrupts ----------------------------------------------------------------------------

    def abort(self) -> None:
        """Stop the active work: the agent, a retry wait (only the wait, D22), or a compaction."""
        if not self._busy:
            return
        self._interrupt = "abort"
        if self._effect_scope is not None:
            self._effect_scope.cancel()

    def abort_compaction(self) -> None:
        """Cancel a running compaction (automatic or manual); nothing is applied (D22)."""
        if self.state in ("compacting", "manual_compacting"):
            self.abort()

    def abort_branch_summary(self) -> None:
        """Cancel a running branch summary; history and leaf stay as they were (D22)."""
        self.navigator.cancel()

    # -- navigation and forks ------------------------------------------------------------------

    async def navigate(
        self,
        target_id: str,
        *,
        summarize: bool = False,
        instructions: str | None = None,
        replace_instructions: bool = False,
        label: str | None = None,
    ) -> NavigationResult:
        """Move the active leaf to ``target_id``, optionally summarizing the abandoned branch.

        Navigating to a user message moves the leaf to just before it and returns its text for
        the editor; any other entry becomes the leaf. With ``summarize`` the abandoned branch is
        summarized and attached at the new position (D17). Navigating alone starts no turn.

        Returns:
            What happened; ``cancelled`` when a hook cancelled or the summary was aborted.

        Raises:
            SessionError: a turn or another navigation is running, or the id is unknown.
            ModelError: the branch summary failed; history and leaf are unchanged.
        """
        self._refuse_during_navigation("navigate")
        return await self.navigator.navigate(
            target_id,
            summarize=summarize,
            instructions=instructions,
            replace_instructions=replace_instructions,
            label=label,
        )

    async def fork(self, entry_id: str, path: str | os.PathLike[str] | None = None) -> ForkResult:
        """Copy the path before a user message into a new session (pi's fork).

        Args:
            entry_id: A user message.
            path: The new session file; default: beside this one (in memory for an in-memory
                session).

        Raises:
            SessionError: ``Invalid entry ID for forking``, or the target file exists.
        """
        store: SessionStore
        if path is None and isinstance(self.session.store, MemoryStore):
            store = MemoryStore()
        else:
            target = Path(path) if path is not None else fork_path(self.session.store.location)
            if target.exists():
                raise SessionError(f"{target}: already exists")
            store = JsonlStore(target)
            store.own(self.owner)  # the new file is ours from before it exists (D27)
            if target.exists():  # created by someone else in between
                store.close()
                raise SessionError(f"{target}: already exists")
        try:
            result = await fork(self.ports, entry_id, store)
        except BaseException:
            store.close()
            raise
        if result.session is None:
            store.close()  # cancelled by a hook: nothing was written, let go of the new file
        return result

    # -- manual compaction ---------------------------------------------------------------------

    async def compact(self, focus: str | None = None, *, dry_run: bool = False) -> OperationOutcome:
        """Compact now, with optional focus instructions (the JSON-RPC ``session.compress``).

        Active work is stopped and allowed to settle first; the interrupted turn is not resumed
        (D22). Nothing to compact is an outcome, not an error (``status == "skipped"``, D12).
        A dry run runs the same operation machine, hooks included, but its commit only reports
        the entry it would append.

        Raises:
            Cancelled: the compaction was cancelled (by ``abort_compaction`` or a hook).
            ModelError: the summary failed; the session is unchanged.
            SessionError: a manual compaction or a tree navigation is already running.
        """
        self._refuse_during_navigation("compact")
        if self._manual_waiters or self.state == "manual_compacting":
            raise SessionError("A manual compaction is already running")
        self._manual_focus = focus
        self._manual_dry_run = dry_run
        if self._busy:
            done = anyio.Event()
            box: list[OperationOutcome] = []
            self._manual_waiters.append((done, box))
            self._interrupt = "manual_compact"
            if self._effect_scope is not None:
                self._effect_scope.cancel()
            await done.wait()
            if not box:
                raise Cancelled("Compaction cancelled: the session closed before it ran")
            outcome = box[0]
        else:
            await self._run("manual_compact")
            outcome = self._turn_state.outcome or OperationOutcome(operation_id="", status="failed")
        return raise_for(outcome)

    def _release_manual_waiters(self) -> None:
        for done, _ in self._manual_waiters:
            done.set()
        self._manual_waiters.clear()


def _current_route(agent: Agent | None) -> Model:
    # A ChatAgent (or any agent with a ``model`` route) summarizes with its own model.
    model = getattr(agent, "model", None)
    return model if isinstance(model, Model) else OfflineSummarizer()
