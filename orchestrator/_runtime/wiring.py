"""The parts of an agent session, built over one ports record.

The turn driver, the operation runner and the navigator each take the ports record, never the
session façade. When the façade's ports change (new summary routes, settings, session or agent),
:func:`wire` builds a new operation runner and navigator over them and points the existing turn
driver at them, so the turn machine keeps its state. Which of them may run together is the
session table's choice (``machines/session.toml``), asked by :func:`admit` before a request is
handed to one of them, from what they run now.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast

from orchestrator._lifecycle.admission import DIRECT_REFUSALS
from orchestrator._lifecycle.admission import admit as admit_to
from orchestrator._lifecycle.guards import SessionFacts
from orchestrator._lifecycle.names import SessionEvent
from orchestrator._runtime.agent import Agent
from orchestrator._runtime.navigation.driver import Navigator
from orchestrator._runtime.operation.runner import OperationRunner
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.turn.driver import TurnDriver
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.session import Session


class Parts(NamedTuple):
    """What a session's requests are handed to."""

    ports: Ports
    operations: OperationRunner
    turn: TurnDriver
    navigator: Navigator


def wire(ports: Ports, settings: RuntimeSettings, turn: TurnDriver | None = None) -> Parts:
    """Build the parts over ``ports`` (keeping ``turn``, rewired, when there is one)."""
    operations = OperationRunner(ports, settings.compaction)
    driver = turn or TurnDriver(ports, operations, settings)
    # The navigator asks after the turn through a weak reference: held strongly, the two would
    # make a reference cycle holding the session until a full collection (see
    # scheduler.weakly). One that was freed is not running.
    turn_ref = weakref.ref(driver)
    navigator = Navigator(
        ports,
        operations,
        branch_reserve_tokens=settings.branch_reserve_tokens,
        turn_running=lambda: (turn := turn_ref()) is not None and turn.busy,
    )
    driver.rewire(ports, operations, settings)
    return Parts(ports=ports, operations=operations, turn=driver, navigator=navigator)


def admit(request: SessionEvent, ports: Ports, turn: TurnDriver, navigator: Navigator) -> None:
    """Step the session table for a Python caller's request, from what the parts run now.

    A navigation asks only whether another one runs: a running turn is the navigation table's
    own refusal (its ``turn_running`` row, journaled), as on the cluster. Closing a closed
    session asks nothing: it does nothing.

    Raises:
        BusyError: The table refused, in the words the Python API has always used.
    """
    if request == SessionEvent.CLOSE and turn.machine.done:
        return
    navigating = navigator.running
    facts = SessionFacts(navigation_running=navigating)
    if request != SessionEvent.NAVIGATE:
        facts = SessionFacts(
            turn_running=turn.busy,
            compaction_running=turn.compacting,
            navigation_running=navigating,
        )
    admit_to(request, facts, table=ports.tables("session"), refusals=DIRECT_REFUSALS)


def rebuild(
    ports: Ports,
    routes: SummaryRoutes,
    session: Session,
    agent: Agent | None,
    settings: RuntimeSettings,
    turn: TurnDriver | None,
) -> Parts:
    """The parts over ``ports`` given new routes, session, agent and settings (see :func:`wire`)."""
    fresh = dataclasses.replace(
        ports,
        session=session,
        routes=routes,
        agent=agent,
        timeout_s=settings.model_timeout_s,
        idle_s=settings.model_idle_timeout_s,
        deadline_s=settings.operation_deadline_s,
    )
    return wire(fresh, settings, turn)


T = TypeVar("T")


class Wired(Protocol):
    """What holds the parts: its ports, and how it rebuilds them."""

    ports: Ports

    def _wire(self, routes: SummaryRoutes) -> None: ...


class Rewires(Generic[T]):
    """An attribute whose assignment rebuilds the ports; the parts use them from the next effect."""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = f"_{name}"

    def __get__(self, holder: Wired | None, owner: type[Any] | None = None) -> T:
        # On the class itself (``help()``, introspection) the descriptor stands for itself.
        return cast("T", self if holder is None else getattr(holder, self.name))

    def __set__(self, holder: Wired, value: T) -> None:
        setattr(holder, self.name, value)
        holder._wire(holder.ports.routes)
