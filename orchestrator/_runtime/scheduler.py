"""The scheduler layer: how an anyio host's effects wait, and what keeps memory and lag low.

Theory of operation. The interpreter (:mod:`~orchestrator._runtime.driver`) only steps, performs
and translates. How an effect that waits for something slow runs on one event loop, and the work-
arounds a thousand sessions at once need, live here, behind :class:`Scheduler` and three helpers:

* **Interrupts and work in flight.** A cancel request (``abort``, ``cancel``, ``manual_compact``,
  ``deadline_passed``) can arrive while an effect awaits a model, a wait or an agent. The request
  only records the event and wakes the loop (:meth:`Scheduler.request`); the loop steps it
  through the table, and the row's own stop effect cancels the work and waits until it settled
  (:meth:`Scheduler.stop`). So awaiting work runs in a child task with its own cancel scope, and
  the loop waits for whichever comes first: its report or a listed interrupt.
* **Where the table leaves no choice, no child task.** In a state where every row an interrupt
  can take starts by stopping the work in flight (:func:`direct_states`), the work would be
  cancelled as soon as the interrupt is stepped, so it runs in the loop's own task under a
  cancel scope the interrupt cancels at once; the row's stop effect then finds it settled. That
  is every awaiting state of an operation and of a turn but two (a turn's prune and its
  continuation). A child task, its event and the passes to start it and hear from it cost a
  compaction about a tenth of its CPU with a thousand at once (issue 9).
* **Start slots** (:mod:`~orchestrator._runtime.admission`): the stretch of work between two
  waits never yields, so it holds one of a few slots per event loop. :meth:`Scheduler.run` gives
  the slot back while the work waits, and takes one again afterwards when asked to.
* **Memory.** A driver that lives as long as its session hands its interpreter its own bound
  methods through :func:`weakly`; one that ends drops its effect table (:meth:`Scheduler.let_go`
  and the interpreter's); and what is derived from a table is cached per table
  (:func:`per_table`), not per driver. Each breaks a reference cycle that only a full collection
  would free, or saves work a thousand drivers would each repeat.

Nothing here decides anything: which event an interrupt is, and what it stops, is the table's.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import anyio
from anyio.abc import TaskGroup

from orchestrator._lifecycle.guards import INTERRUPTS, STOPPING
from orchestrator._lifecycle.machine import MachineDef
from orchestrator._runtime import admission

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def weakly(method: Callable[P, R]) -> Callable[P, R]:
    """The bound ``method``, without keeping its object alive.

    A driver that lives as long as its session (the turn driver, the navigator) gives its
    interpreter its own bound methods, and the interpreter is its attribute: a reference cycle,
    which reference counting never frees. Such a cycle holds the driver's session, every entry
    of it, until a full collection; and the loader puts what it parses in the oldest generation
    without counting it (``_core.loading.gc_paused``), so CPython may never see a reason to run
    one (60 sessions of 10k entries opened, compacted and closed in turn kept 1.4 GB). What the
    driver hands its own interpreter goes through this instead.

    Raises:
        ReferenceError: The object was freed (its interpreter outlived it).
    """
    bound: Any = method
    owner, function = weakref.ref(bound.__self__), bound.__func__  # one weakref per object
    name = function.__qualname__

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        target = owner()
        if target is None:
            raise ReferenceError(f"{name}: its object was freed")
        result: R = function(target, *args, **kwargs)
        return result

    return call


_PER_TABLE: dict[tuple[int, object], tuple[MachineDef, object]] = {}


def per_table(defn: MachineDef, key: object, compute: Callable[[], T]) -> T:
    """``compute()`` once per table and ``key``: a driver is built per operation, not per table.

    Keyed by the table's ``id()``, holding the table itself so that the id is not reused by
    another while the entry lives; tables built by tests come and go, so the cache is bounded.
    """
    known = _PER_TABLE.get((id(defn), key))
    if known is not None and known[0] is defn:
        value: Any = known[1]
        return value  # type: ignore[no-any-return]
    value = compute()
    if len(_PER_TABLE) > 512:
        _PER_TABLE.clear()
    _PER_TABLE[(id(defn), key)] = (defn, value)
    return value  # type: ignore[no-any-return]


def direct_states(defn: MachineDef) -> frozenset[str]:
    """The states where work in flight may run in the loop's own task (see the module comment).

    Those where every row of every interrupt the host may request (:data:`INTERRUPTS`) performs
    a stop effect (:data:`STOPPING`): stepping the interrupt always cancels the work, so it may
    as well be cancelled when the interrupt arrives. A machine whose interrupts are not declared
    has no such state.
    """
    return per_table(defn, "direct", lambda: _direct_states(defn))


def _direct_states(defn: MachineDef) -> frozenset[str]:
    interrupts = INTERRUPTS.get(defn.name)
    if interrupts is None:
        return frozenset()
    stopping = STOPPING.get(defn.name, frozenset())
    return frozenset(
        state
        for state in defn.states
        if all(
            stopping.intersection(row.effects)
            for event in interrupts
            for row in defn.rows_for(state, event)
        )
    )


def cancel_scope(scope: anyio.CancelScope) -> None:
    """Cancel ``scope``. A deadline in the past cancels like ``scope.cancel()`` on every backend.

    I use it because anyio 4.16's trio backend calls trio<0.25's ``cancel()`` with an argument it
    does not take.
    """
    scope.deadline = -math.inf


@dataclass(slots=True)
class _InFlight:
    scope: anyio.CancelScope
    done: anyio.Event
    report: Any = None


class Scheduler:
    """One machine's pending interrupts, its work in flight and its start slot.

    It holds the table, never the interpreter or the driver (no reference cycle): the state an
    interrupt is checked against is passed in.

    Args:
        defn: The table (what an interrupt is, and in which states work runs in this task).
    """

    def __init__(self, defn: MachineDef) -> None:
        self.defn = defn
        self.slot: admission.Slot | None = None
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._in_flight: _InFlight | None = None
        self._in_task: anyio.CancelScope | None = None
        self._direct = direct_states(defn)
        self._interrupts = INTERRUPTS.get(defn.name)

    # -- interrupts -------------------------------------------------------------------------------

    def request(self, event: str, state: str) -> None:
        """Record an interrupt and wake the loop; the table decides what it means.

        Raises:
            ValueError: The machine declares its interrupts and ``event`` is not one of them (a
                driver bug: work awaited in the loop's own task could not be interrupted by it).
        """
        if self._interrupts is not None and event not in self._interrupts:
            raise ValueError(f"{self.defn.name}: {event!r} is not an interrupt of this machine")
        self._pending.append(event)
        self._wake.set()
        if self._in_task is not None and self.defn.rows_for(state, event):
            # The row will stop the work (see direct_states): stop it now, so the loop can step.
            cancel_scope(self._in_task)

    def take(self) -> str | None:
        """The oldest pending interrupt, if any (removed)."""
        return self._pending.pop(0) if self._pending else None

    def take_listed(self, state: str) -> str | None:
        """The oldest pending interrupt the table lists in ``state``; those before it dropped."""
        while self._pending:
            event = self._pending.pop(0)
            if self.defn.rows_for(state, event):
                return event
        return None

    def drop(self) -> None:
        """Forget pending interrupts (the run that they were meant for has ended)."""
        self._pending.clear()

    def _wanted(self, state: str) -> bool:
        return any(self.defn.rows_for(state, event) for event in self._pending)

    # -- work in flight ---------------------------------------------------------------------------

    async def run(
        self,
        work: Callable[[], Awaitable[T]],
        state: str,
        group: TaskGroup | None,
        *,
        again: bool = False,
    ) -> T | None:
        """Run awaiting work until it reports or an interrupt listed in ``state`` arrives.

        The start slot, if held, is given back while the work waits; with ``again``, one is
        taken again afterwards (what follows the wait never waits either).

        Returns:
            The work's result, or ``None`` when an interrupt arrived first (the work was
            cancelled, or, in a child task, keeps running until :meth:`stop`).

        Raises:
            RuntimeError: Work in a state that needs a child task, and no task group to run it.
        """
        held = self.slot is not None
        self.let_slot_go()
        if state not in self._direct:
            report = await self._in_child(work, state, group)
        else:
            # In this task: a listed interrupt cancels the work at once (the module comment).
            scope = anyio.CancelScope()
            if self._wanted(state):
                # Asked for already: the work starts cancelled, as a child task would be at once.
                cancel_scope(scope)
            self._in_task = scope
            report = None  # cancelled by an interrupt: the loop steps it
            try:
                with scope:
                    report = await work()
            finally:
                self._in_task = None
        if again and held:
            self.slot = await admission.start_slot()
        return report

    async def _in_child(
        self, work: Callable[[], Awaitable[T]], state: str, group: TaskGroup | None
    ) -> T | None:
        if group is None:
            raise RuntimeError(f"{self.defn.name}: work in flight in {state} needs a task group")
        flight = _InFlight(scope=anyio.CancelScope(), done=anyio.Event())

        async def run() -> None:
            try:
                with flight.scope:
                    flight.report = await work()
            finally:
                flight.done.set()
                self._wake.set()

        self._in_flight = flight
        group.start_soon(run)
        while not flight.done.is_set() and not self._wanted(state):
            self._wake = anyio.Event()
            if flight.done.is_set() or self._wanted(state):
                break
            await self._wake.wait()
        if flight.done.is_set():
            self._in_flight = None
            report: T = flight.report
            return report
        return None

    async def settle(self) -> None:
        """Wait, shielded, until the work in flight (if any) has reported on its own."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            with anyio.CancelScope(shield=True):
                await flight.done.wait()

    async def stop(self) -> None:
        """Cancel the work in flight, if any, and wait until it has settled."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        cancel_scope(flight.scope)
        with anyio.CancelScope(shield=True):
            await flight.done.wait()

    # -- start slots and memory -------------------------------------------------------------------

    async def take_slot(self) -> None:
        """Wait for a start slot and hold it (given back by :meth:`let_slot_go` or a wait)."""
        self.slot = await admission.start_slot()

    def let_slot_go(self) -> None:
        """Give back the start slot, if held (idempotent)."""
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()

    def hand_slot(self) -> admission.Slot | None:
        """The start slot, if held, handed to whoever goes on with the same stretch of work."""
        slot, self.slot = self.slot, None
        return slot

    def let_go(self) -> None:
        """Drop the work in flight (the run has ended; nothing is awaited any more)."""
        self._in_flight = None
        self._in_task = None
