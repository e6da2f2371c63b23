"""The runtime façade: an agent session, its turns, compactions, navigation and forks.

:class:`AgentSession` holds no lifecycle: it builds a frozen record of ports and three parts that
take it, never the façade (turn driver, operation runner, navigator; ``wiring.py``). Each public
method checks its arguments, asks the session table (``machines/session.toml``), then hands it on.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from orchestrator._lifecycle.names import SessionEvent
from orchestrator._runtime import arguments as check
from orchestrator._runtime import ports as _ports
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.navigation.driver import Navigator, fork_to
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.runner import OperationRunner
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports, default_routes, random_operation_id, traced_routes
from orchestrator._runtime.reopen import open_runtime
from orchestrator._runtime.turn.driver import TurnDriver
from orchestrator._runtime.types import (
    ForkResult,
    NavigationResult,
    OperationOutcome,
    RuntimeSettings,
    TurnResult,
)
from orchestrator._runtime.wiring import Rewires, admit, rebuild
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session, wall_clock_ms
from orchestrator._store.settle import Settlement
from orchestrator._telemetry.tracing import LifecycleTracer


class AgentSession:
    """An agent session: prompts, compactions, navigation and forks, through machines.

    Args:
        session: The session to drive.
        agent: Runs turns (required for :meth:`prompt`).
        summarizer: Summary routes (default: the agent's own model route when it has one,
            as summaries use the current model route; else the offline summarizer).
        settings: Runtime settings.
        hooks: Hook registry (default: empty).
        journal: Lifecycle journal (default: none).
        tracer: OpenTelemetry tracer wrapper (default: none).
        sleep: Awaited for retry waits (inject a fake clock's ``sleep`` in tests).
        clock_ms: Epoch-ms clock for prunes and message times.
        operation_ids: Source of operation ids (default: random; simulations pass a counter).
        events: The event bus (default: a new one). Passed to :meth:`open` with listeners
            already subscribed, it lets them hear what opening emits (``operation_settled``).
        offload: Runs a fork's copy and a navigation's context off the loop (big sessions).
    """

    ports: Ports
    operations: OperationRunner
    turn: TurnDriver
    navigator: Navigator

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
        events: EventBus | None = None,
        offload: Callable[[Callable[[], Any]], Awaitable[Any]] = _ports.in_thread,
    ) -> None:
        self._session, self._agent = session, agent
        # A runtime compacts: its contexts keep what summary requests need measured as they
        # grow, so no compaction waits for a backlog (_core/measures.py).
        session.keep_measured()
        self._settings = settings = settings or RuntimeSettings()
        self.tracer = tracer or LifecycleTracer(None)
        self.hooks = hooks or Hooks()
        self.events = events if events is not None else EventBus()
        self.journal = journal
        self.settlements: list[Settlement] = []
        self.owner = "AgentSession"  # named in the lock of the files this runtime writes (D27)
        self.ports = Ports(
            session=session,
            routes=SummaryRoutes(candidates=()),
            hooks=self.hooks,
            events=self.events,
            journal=journal,
            tracer=self.tracer,
            clock_ms=clock_ms,
            sleep=sleep,
            ids=operation_ids or random_operation_id,
            offload=offload,
        )
        self.summarizer = summarizer or default_routes(agent, settings)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        owner: str = "AgentSession",
        random_hex: Callable[[], str] | None = None,
        **kwargs: Any,
    ) -> AgentSession:
        """Open a session file as ``owner`` until :meth:`close` (D27), settling its journal.

        Half-done operations are settled without calling a model (D24; see
        :mod:`~orchestrator._runtime.reopen`). ``random_hex`` is the entry-id randomness
        (simulations pass a counter); ``kwargs`` go to the constructor.

        Raises:
            SessionLockedError: another process owns the session.
        """
        return open_runtime(cls, path, owner=owner, random_hex=random_hex, **kwargs)

    def close(self) -> None:
        """Release the session (its lock) through the turn table's ``close`` row.

        Raises:
            SessionError: A turn or a tree navigation is running (abort it first).
        """
        admit(SessionEvent.CLOSE, self.ports, self.turn, self.navigator)
        self.turn.close()

    session = Rewires[Session]()
    """The session driven (assigning another one rewires every driver to it)."""
    agent = Rewires[Agent | None]()
    """The agent that runs turns."""
    settings = Rewires[RuntimeSettings]()
    """The runtime settings (assigning new ones takes effect at the next effect)."""

    @property
    def summarizer(self) -> SummaryRoutes:
        """The summary routes (each model wrapped in a span with the GenAI attributes)."""
        return self.ports.routes

    @summarizer.setter
    def summarizer(self, routes: SummaryRoutes) -> None:
        self._wire(traced_routes(routes, self.tracer, short_summary=self._settings.short_summary))

    def _wire(self, routes: SummaryRoutes) -> None:
        turn = getattr(self, "turn", None)
        parts = rebuild(self.ports, routes, self._session, self._agent, self._settings, turn)
        self.ports, self.operations, self.turn, self.navigator = parts

    # -- observation -----------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The turn machine's state."""
        return self.turn.state

    @property
    def is_busy(self) -> bool:
        """A turn (or a manual compaction) is in progress."""
        return self.turn.busy

    @property
    def is_navigating(self) -> bool:
        """A tree navigation (perhaps writing a branch summary) is in progress."""
        return self.navigator.running

    @property
    def current_operation(self) -> OperationRun | None:
        """The operation in progress, if any."""
        return self.operations.current

    @property
    def branch_operation(self) -> OperationRun | None:
        """The branch summary in progress, if any."""
        current = self.operations.current
        return current if current is not None and current.kind == "branch_summary" else None

    def now_ms(self) -> int:
        """The runtime's clock."""
        return self.ports.clock_ms()

    async def run_hook(self, name: str, payload: dict[str, Any]) -> Mapping[str, Any] | None:
        """Run a hook; handler errors become ``hook_error`` events (D25)."""
        return await self.ports.run_hook(name, payload)

    # -- requests --------------------------------------------------------------------------------

    async def prompt(self, text: str) -> TurnResult:
        """Run a turn to its end (compactions and retries included); queued while one runs.

        Raises:
            SessionError: no agent was given, a tree navigation is in progress, or the session
                is closed.
            TypeError: ``text`` is not a string (nothing is written).
        """
        check.require_open(self._session, closed=self.closed)
        check.require_prompt(text, agent=self._agent)
        admit(SessionEvent.PROMPT, self.ports, self.turn, self.navigator)
        return await self.turn.prompt(text)

    def abort(self) -> None:
        """Stop the active work: the agent, a retry wait (only the wait, D22), or a compaction."""
        self.turn.abort()

    def stop(self) -> None:
        """Stop for good (a server shutting down): abort, drop queued prompts, start no turn."""
        self.turn.stop()
        self.navigator.cancel()

    def abort_compaction(self) -> None:
        """Cancel a running compaction (automatic or manual); nothing is applied (D22)."""
        if self.state in ("compacting", "manual_compacting"):
            self.turn.abort()

    def abort_branch_summary(self) -> None:
        """Cancel a running branch summary; history and leaf stay as they were (D22)."""
        self.navigator.cancel()

    async def compact(self, focus: str | None = None, *, dry_run: bool = False) -> OperationOutcome:
        """Compact now: active work is stopped and settles first, and is not resumed (D22).

        Nothing to compact is an outcome (``status == "skipped"``, D12). A dry run runs the same
        operation machine, hooks included; its commit only reports.

        Raises:
            Cancelled: the compaction was cancelled (by ``abort_compaction`` or a hook).
            ModelError: the summary failed; the session is unchanged.
            SessionError: a manual compaction or a tree navigation is already running, or the
                session is closed.
            ConflictError: another program wrote meanwhile; nothing was applied, and the
                session is read again as the file is now, so asking again works (D27).
        """
        check.require_open(self._session, closed=self.closed)
        check.require_text("compact", "focus", focus, optional=True)
        if not dry_run:
            check.require_writable(self._session)
        admit(SessionEvent.COMPACT, self.ports, self.turn, self.navigator)
        return await self.turn.compact(focus, dry_run=dry_run)

    async def navigate(
        self,
        target_id: str,
        *,
        summarize: bool = False,
        instructions: str | None = None,
        replace_instructions: bool = False,
        label: str | None = None,
    ) -> NavigationResult:
        """Move the leaf to ``target_id`` (before it, for a user message), maybe summarizing.

        With ``summarize`` the abandoned branch is summarized and attached at the new position
        (D17); see :class:`~orchestrator._runtime.navigation.driver.Navigator`.

        Raises:
            SessionError: a turn or another navigation is running, or the id is unknown.
            ModelError: the branch summary failed; history and leaf are unchanged.
            ConflictError: another program wrote meanwhile; nothing was applied, and the
                session is read again as the file is now (the leaf where that program left
                it), so asking again works (D27).
        """
        check.require_open(self._session, closed=self.closed)
        check.require_navigation(target_id, instructions, label)
        admit(SessionEvent.NAVIGATE, self.ports, self.turn, self.navigator)
        if summarize:
            check.require_writable(self._session)
        return await self.navigator.navigate(
            target_id,
            summarize=summarize,
            instructions=instructions,
            replace_instructions=replace_instructions,
            label=label,
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` released the session (every later call is refused)."""
        return self.turn.machine.done

    async def fork(self, entry_id: str, path: str | os.PathLike[str] | None = None) -> ForkResult:
        """Copy the path before a user message into a new session (pi's fork).

        ``path`` defaults to a file beside this one (in memory for an in-memory session).

        Raises:
            SessionError: ``Invalid entry ID for forking``, the target file exists, or the
                session is closed.
        """
        check.require_open(self._session, closed=self.closed)
        check.require_text("fork", "entry_id", entry_id)
        admit(SessionEvent.FORK, self.ports, self.turn, self.navigator)
        return await fork_to(self.ports, entry_id, path, owner=self.owner)
