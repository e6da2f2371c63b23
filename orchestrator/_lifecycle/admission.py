"""The session machine (``machines/session.toml``): which operations may run together.

Each request to a session (a prompt, a manual compaction, a navigation, a fork, a hosted pi summary,
closing) steps the table once from ``asked``, with
:class:`~orchestrator._lifecycle.guards.SessionFacts` saying what already runs there. An
``admitted`` request goes to its own machine; a ``refused`` one raises
:class:`~orchestrator._core.errors.BusyError` with the words its refusal effect names (the JSON-RPC
server answers ``-32001`` by that type). Every host decides here: the one-process server from
what its sessions run, the session workflow from what it hosts, and the Python API
(:class:`~orchestrator._runtime.session.AgentSession`) from what its drivers run.

The one exception to one vocabulary: a Python caller has always read other words for the same
refusals (:data:`DIRECT_REFUSALS`, ``"Cannot prompt while a tree navigation is in progress"``)
than a JSON-RPC client (:data:`REFUSALS`); the table's effect names which refusal it is, and each
surface keeps its words, so neither audience sees its messages change.
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
        "refuse_close_while_navigating": CLOSE_WHILE_BUSY,
    }
)
"""The words of each refusal effect (templates: ``{method}`` and ``{path}`` where given)."""

DIRECT_REFUSALS: Mapping[str, str] = MappingProxyType(
    {
        **REFUSALS,
        "refuse_prompt_while_navigating": "Cannot prompt while a tree navigation is in progress",
        "refuse_second_compaction": "A manual compaction is already running",
        "refuse_compaction_while_navigating": (
            "Cannot compact while a tree navigation is in progress"
        ),
        "refuse_second_navigation": "Cannot navigate while a tree navigation is in progress",
        "refuse_close_while_busy": (
            "Cannot close the session while a turn is running; abort it first"
        ),
        "refuse_close_while_navigating": (
            "Cannot close the session while a tree navigation is in progress; abort it first"
        ),
    }
)
"""The words the Python API says for the same refusals (see the module comment)."""


def admit(
    request: SessionEvent,
    facts: SessionFacts,
    *,
    table: MachineDef | None = None,
    refusals: Mapping[str, str] = REFUSALS,
    **words: str,
) -> None:
    """Step the session table for ``request``; return when admitted.

    Args:
        request: What is asked of the session.
        facts: What runs there now (``turn_running``, ``compaction_running``,
            ``navigation_running``, ``session_open``).
        table: The table to step (default: the shipped one; tests pass a modified copy).
        refusals: The words of each refusal effect (the Python API passes its own).
        words: Filled into the refusal's template (``method``, ``path``).

    Raises:
        BusyError: The table refused; its effect names the words.
    """
    taken = step(table or load_machine("session"), SessionState.ASKED, request, facts)
    if taken.dest == SessionState.ADMITTED:
        return
    refusal = next((e for e in taken.effects if e in refusals), None)
    message = refusals[refusal].format(**words) if refusal else f"{request}: refused"
    raise BusyError(message)
