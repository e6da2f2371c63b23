"""The turn driver: an agent session's turns, run by ``machines/turn.toml`` (D31).

Theory of operation. The table decides; this module performs. A run starts from a request
(``user_prompt`` or ``manual_compact``) and loops

    step(table, state, event, facts) -> Step(dest, effects)    # the only decision
    for each effect: report = await effects[name]()             # performs one thing, reports
    event = translate(effect, report)                           # the turn machine's words

until the effects report nothing and no request is waiting: the machine rests. Each effect
reports an outcome and never picks a state: ``call_agent`` reports how the agent's last reply
ended (``ok``, ``overflow``, ``truncated``, ``transient``, ``fatal``, see
:mod:`~orchestrator._runtime.turn.replies`), a compaction its operation's status, a wait ``ok``, and
``resume_turn`` that the agent may go on. Whether that means prune, compact, retry, resume or stop
is the row's choice, with guards reading :meth:`TurnDriver.facts` (the per-turn counters of D18
and D19 and the last reply's measurements).

Requests. ``abort`` and ``manual_compact`` only record the request and wake the loop; the loop
steps them through the table at the next point (between effects, or while an effect such as the
agent, a retry wait or a compaction is in flight), and the row's own stop effect (``stop_agent``,
``cancel_retry_wait``, ``cancel_compaction``) cancels the work in flight and waits until it has
settled (D22). A request the current state does not list is dropped. A prompt sent while a run is
in progress is queued; when the machine rests, the oldest queued prompt is stepped as
``follow_up`` if the state lists it (the table says a follow-up starts the next turn from
``idle``), and a request that arrives while the run winds down is stepped the same way before the
run lets go (:meth:`TurnDriver._late_request`); a prompt the table never takes is dropped when the
run ends. ``close`` is a row too:
its ``close_session`` effect releases the session.

A run cancelled from outside (the server shutting down) settles through the table's ``abort``
row, shielded, so the machine rests in a state the next request can use.

The driver takes the ports record, the operation runner and the settings, never the session
façade; nothing here reads a clock or makes an id except through the ports. The effects live by
concept in :mod:`~orchestrator._runtime.turn.agent_side` and
:mod:`~orchestrator._runtime.turn.compaction_side`, and reach the driver only through
:class:`~orchestrator._runtime.turn.host.Host`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import TaskGroup

from orchestrator._core.errors import Cancelled, SessionError
from orchestrator._lifecycle.guards import TurnFacts
from orchestrator._lifecycle.machine import Step
from orchestrator._lifecycle.names import TurnEvent, TurnState
from orchestrator._runtime.admission import Slot
from orchestrator._runtime.disk import ready_to_write
from orchestrator._runtime.driver import Effect, Interpreter, Report, first_error
from orchestrator._runtime.operation.runner import OperationRunner, raise_for
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.scheduler import weakly
from orchestrator._runtime.turn.agent_side import TurnAgent
from orchestrator._runtime.turn.compaction_side import TurnCompactions
from orchestrator._runtime.turn.core import TurnCore
from orchestrator._runtime.turn.host import ManualRequest
from orchestrator._runtime.types import (
    OperationOutcome,
    RuntimeSettings,
    TurnCounters,
    TurnResult,
)
from orchestrator._store.session import Session
from orchestrator._telemetry.tracing import facts_delta

_log = logging.getLogger("orchestrator")

__all__ = ["ManualRequest", "TurnDriver"]


class TurnDriver:
    """Runs an agent session's turns through the turn table.

    Args:
        ports: What the effects perform through (the session and the agent among them).
        operations: Runs the prunes and compactions.
        settings: The runtime settings (window, compaction, retry, prune).

    Raises:
        DefinitionError: The effect table does not match the turn table.
    """

    def __init__(
        self,
        ports: Ports,
        operations: OperationRunner,
        settings: RuntimeSettings,
    ) -> None:
        self.ports = ports
        self.operations = operations
        self.settings = settings
        self.core = TurnCore(TurnAgent(self), TurnCompactions(self))
        self.effects: Mapping[str, Effect] = self.core.effects()
        self.machine = Interpreter(
            ports.tables("turn"), self.effects, observers=(weakly(self._record),)
        )
        self._stopping = False  # stop(): nothing queued or new starts any more
        self.manual: ManualRequest | None = None
        # No pass of the loop to take it when free: a thousand requests at once would each
        # wait a pass for nothing (issue 9).
        self._lock = anyio.Lock(fast_acquire=True)
        self._group: TaskGroup | None = None
        self._turns = 0

    def rewire(self, ports: Ports, operations: OperationRunner, settings: RuntimeSettings) -> None:
        """Perform later effects through new ports (the session's routes or settings changed)."""
        self.ports, self.operations, self.settings = ports, operations, settings

    @property
    def state(self) -> str:
        """The turn machine's state."""
        return self.machine.state

    @property
    def busy(self) -> bool:
        """A run (a turn, or a manual compaction) is in progress."""
        return self._lock.locked()

    @property
    def compacting(self) -> bool:
        """A manual compaction is asked for or running (the session table's fact)."""
        return self.manual is not None or self.state == TurnState.MANUAL_COMPACTING

    @property
    def counters(self) -> TurnCounters:
        """The per-turn counters (D18, D19) and the last reply's measurements."""
        return self.core.counters

    def facts(self) -> TurnFacts:
        """What the turn table's guards read."""
        return self.core.facts()

    # -- requests ---------------------------------------------------------------------------------

    async def prompt(self, text: str) -> TurnResult:
        """Run a turn for ``text`` to its end; while a run is in progress, queue it instead.

        Whether the prompt may run beside what runs in the session is the session table's
        choice, asked before (:func:`~orchestrator._runtime.wiring.admit`).

        Raises:
            SessionError: The session is stopping.
        """
        if self._stopping:
            raise SessionError("The session is stopping: no new turn starts")
        if self.busy:
            self.core.follow_ups.append(text)
            return TurnResult(queued=True, state=self.state)
        await self._run(TurnEvent.USER_PROMPT, text)
        return TurnResult(reply=self.counters.last_reply, state=self.state)

    async def compact(self, focus: str | None, *, dry_run: bool) -> OperationOutcome:
        """Ask for a manual compaction and wait for its outcome.

        A second manual compaction, or one during a navigation, is the session table's refusal,
        asked before (:func:`~orchestrator._runtime.wiring.admit`).

        Raises:
            SessionError: The commit conflicted.
            Cancelled: It was cancelled, or it never ran (the run ended first).
            ModelError: It failed.
        """
        request = ManualRequest(focus=focus, dry_run=dry_run)
        self.manual = request
        if self.busy:
            self.machine.interrupt(TurnEvent.MANUAL_COMPACT)
            await request.done.wait()
        else:
            await self._run(TurnEvent.MANUAL_COMPACT)
        if request.outcome is None:
            raise Cancelled("Compaction cancelled: the session closed before it ran")
        return raise_for(request.outcome)

    def abort(self) -> None:
        """Ask the run in progress to stop; the table decides what that means now (D22)."""
        if self.busy:
            self.machine.interrupt(TurnEvent.ABORT)

    def stop(self) -> None:
        """Stop for good (a server shutting down): drop the queued prompts, start none again.

        The queue of prompts asked for while a run is in progress is this driver's, not a row
        of the turn table (issue 34 moves it there): so is dropping it. The run in progress is
        then aborted through the table like any abort.
        """
        self._stopping = True
        self.core.follow_ups.clear()
        self.abort()

    def close(self) -> None:
        """Step ``close`` through the table; its effect releases the session.

        Closing while a run or a navigation is in progress is the session table's refusal,
        asked before (:func:`~orchestrator._runtime.wiring.admit`): the turn machine may be idle
        while the navigation machine still commits a branch summary (D22, D27).

        Raises:
            TransitionError: The table does not list ``close`` in the current state.
        """
        if self.machine.done:
            return
        taken = self.machine.step(TurnEvent.CLOSE, self.facts())
        for name in taken.effects:
            self.machine.perform_now(name)

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self, event: str, prompt: str = "") -> None:
        async with self._lock:
            self.core.prompt = prompt
            self._turns += 1
            session = self.session()
            # A turn's first steps never wait either: up to its first effect in flight (the
            # agent, a compaction) it holds a start slot, so a thousand turns asked for at once
            # do not all take their first steps in one pass of the loop (admission.py).
            await self.machine.scheduler.take_slot()
            try:
                # A session given to the constructor: its journal and file opened, once, in a
                # worker thread (disk.py); AgentSession.open opened them already.
                await ready_to_write(session, self.ports.journal)
                late: str | None = event
                while late is not None:
                    with self.ports.tracer.turn_span(session.session_id, self._turns):
                        await self._drive(late)
                    late = self._late_request()
                    if late is not None:
                        self._turns += 1
                        await self.machine.scheduler.take_slot()
            finally:
                self.core.close_retry_streak()  # the run is over: so is any streak in it
                self.let_slot_go()
                self.machine.drop_interrupts()
                self.core.follow_ups.clear()
                request, self.manual = self.manual, None
                if request is not None:
                    request.done.set()

    def _late_request(self) -> str | None:
        """A request that came while the run wound down, after the machine's last look.

        Between the machine coming to rest and the run letting go of the session (its task
        group and span closing), a ``prompt()`` or ``compact()`` still finds the run busy and
        leaves its request for it: the end of the run would drop it (a prompt reported as
        queued and never run; a compaction raising "closed before it ran"). The table takes it
        now, as it would have a moment earlier.
        """
        # Only a request still waiting: one a state without its row dropped stays dropped.
        return self._at_rest()

    async def _drive(self, event: str) -> None:
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                await self._loop(event)
        except BaseExceptionGroup as errors:
            # An effect raised (an agent's bug, a refused step): the error is the caller's to
            # see, but the machine must not stay in `running` (every later prompt would be
            # refused), so the run settles through the abort row first, as a cancel does.
            error = first_error(errors)
            await self._settle()
            raise error from None
        except anyio.get_cancelled_exc_class():
            # Cancelled from outside: settle through the table so the machine can be used again.
            await self._settle()
            raise
        finally:
            self._group = None

    async def _settle(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.machine.listed(TurnEvent.ABORT):
                await self._loop(TurnEvent.ABORT)

    async def _loop(self, event: str | None) -> None:
        machine = self.machine
        while event is not None:
            taken = machine.step(event, self.facts())
            event = await self.core.perform(
                taken.effects, machine.perform, machine.take_listed_interrupt
            )
            if event is None:
                event = self._at_rest()

    def _at_rest(self) -> str | None:
        # stop() empties the queue and refuses new prompts: nothing queued starts after it.
        return self.core.at_rest(self.machine.take_listed_interrupt(), self.machine.listed)

    async def in_flight(self, work: Callable[[], Awaitable[Report]]) -> Report | None:
        """Run slow work in a child task, so a request can be stepped meanwhile.

        Returns:
            The work's report, or ``None`` when a request was stepped first.
        """
        if self._group is None:
            self.let_slot_go()  # the work waits for something slow, or takes a slot of its own
            return await work()
        return await self.machine.in_flight(self._group, work)

    def let_slot_go(self) -> None:
        """Give back the start slot of the turn's first steps, if still held (idempotent)."""
        self.machine.scheduler.let_slot_go()

    def hand_slot(self) -> Slot | None:
        """Hand the start slot of the turn's first steps, if still held, to whoever goes on.

        An operation the turn starts (a compaction, a prune) continues the same stretch of
        work: given back and asked for again, the slot would go to the back of the queue, behind
        every turn asked for meanwhile, and a thousand compactions asked for at once would all
        take their turn's first steps before the first of them planned (admission.py).
        """
        return self.machine.scheduler.hand_slot()

    def _record(self, step: Step, data: Mapping[str, Any]) -> None:
        del data
        journal = self.ports.journal
        # Closing is journaled only after records, with none left open (may_mark_close): the
        # next opening reads the journal from there on (issue 9), and a session opened and
        # closed again leaves no journal beside it.
        if journal is not None and (step.event != TurnEvent.CLOSE or journal.may_mark_close()):
            # What the guards read, so the journal replays through the table (D31).
            facts = facts_delta(step.facts) if step.facts is not None else {}
            try:
                journal.write_step(step, data={"facts": facts})
            except (OSError, SessionError) as error:
                if step.event != TurnEvent.CLOSE:
                    raise
                # The mark only spares the next opening a read: closing goes on without it.
                _log.warning("%s: the close was not journaled (%s)", journal.location, error)
        self.ports.observe(step)

    def session(self) -> Session:
        """The session driven."""
        session = self.ports.session
        assert session is not None, "a turn needs a session"
        return session
