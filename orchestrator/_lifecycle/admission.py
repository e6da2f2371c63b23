"""The session machine (``machines/session.toml``): which operations may run together.

Each request to a session (a prompt, a manual compaction, a navigation, a fork, a hosted pi summary,
closing) steps the table once from ``asked``, with
:class:`~orchestrator._lifecycle.guards.SessionFacts` saying what already runs there. An
``admitted`` request goes to its own machine; a ``refused`` one raises
:class:`~orchestrator._core.errors.BusyError` with the words its refusal effect names (the JSON-RPC
server answers ``-32001`` by that type). Both hosts decide here: the one-process server from what
its sessions run, the session workflow from what it hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from orchestrator._core.errors import BusyError
from orchestrator._lifecycle.guards import SessionFacts
from orchestrator._lifecycle.load import MachineDef
from orchestrator._lifecycle.machine import load_machine, step
from orchestrator._lifecycle.names import SessionEvent, SessionState

BUSY_COMPACTING = "A compaction is already running in this session"
BUSY_NAVIGATING = "A navigation is already running in this session"
PROMPT_WHILE_NAVIGATING = "Cannot prompt while a navigation is running"
COMPACT_WHILE_NAVIGATING = "Cannot compact while a navigation is running"
NAVIGATE_WHILE_WORKING = (
    "Cannot navigate while the agent is working; wait for the turn to end or abort it"
)
CLOSE_WHILE_BUSY = "Session is busy; abort it or wait before closing"
HOSTED_ON_OPEN_SESSION = (
    "{method}: this server has {path} open (session.open); close it there first, or let pi's "
    "own compaction run"
)

REFUSALS: Mapping[str, str] = MappingProxyType(
    {
        "refuse_prompt_while_navigating": PROMPT_WHILE_NAVIGATING,
        "refuse_second_compaction": BUSY_COMPACTING,
        "refuse_compaction_while_navigating": COMPACT_WHILE_NAVIGATING,
        "refuse_navigation_while_working": NAVIGATE_WHILE_WORKING,
        "refuse_second_navigation": BUSY_NAVIGATING,
        "refuse_hosted_on_open_session": HOSTED_ON_OPEN_SESSION,
        "refuse_close_while_busy": CLOSE_WHILE_BUSY,
    }
)
"""The words of each refusal effect (templates: ``{method}`` and ``{path}`` where given)."""


def admit(
    request: SessionEvent, facts: SessionFacts, *, table: MachineDef | None = None, **words: str
) -> None:
    """Step the session table for ``request``; return when admitted.

    Args:
        request: What is asked of the session.
        facts: What runs there now (``turn_running``, ``compaction_running``,
            ``navigation_running``, ``session_open``).
        table: The table to step (default: the shipped one; tests pass a modified copy).
        words: Filled into the refusal's template (``method``, ``path``).

    Raises:
        BusyError: The table refused; its effect names the words.
    """
    taken = step(table or load_machine("session"), SessionState.ASKED, request, facts)
    if taken.dest == SessionState.ADMITTED:
        return
    refusal = next((e for e in taken.effects if e in REFUSALS), None)
    message = REFUSALS[refusal].format(**words) if refusal else f"{request}: refused"
    raise BusyError(message)
