"""The navigation machine's driver, written once for both hosts (issue 34, house style 18).

Theory of operation. ``machines/navigation.toml`` is run by the anyio navigator in one process
(:mod:`orchestrator._runtime.navigation.driver`) and by the Temporal workflow
(:mod:`orchestrator._cluster.navigation.flow`). What does not depend on how an effect is performed
lives here, once: the facts of the first step, which effects run in flight, the binding of every
effect name of the table to what performs it (:func:`navigation_effects`), and the translation of
each effect's report into the next event and its facts
(:func:`~orchestrator._runtime.outcomes.navigation_event`). A host implements
:class:`NavigationSide` and nothing else: one process with anyio and the session in memory, the
workflow with activities and a child operation flow.

Exceptions to the table, kept here so that they are in one place (house style 19):

* An unknown target is the caller's mistake, refused before the table starts (no row: there is
  no state to be in, and the table's ``refused`` state is for a session that is working).
* A ``cancel`` the current state does not list is dropped, not refused: it arrives while effects
  run. After the machine is done, a cancel stops only the ``session_tree`` handlers still running
  (what was written stays written), so a handler that never returns cannot hold the call.
* The label is written inside ``emit_session_tree`` (on the summary entry when there is one,
  else on the target, as pi labels): on the cluster the label and the ``session_tree`` handlers
  are one activity, the label written whole or not at all before any handler runs, so a
  separate effect would change every recorded history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from orchestrator._lifecycle.guards import NavigationFacts
from orchestrator._runtime.driver import Report

Effect = Callable[[], Awaitable[Report | None]]

AWAITING = frozenset({"run_hooks", "start_summary"})
"""Effects that await something slow: they run in flight, so a cancel can be stepped meanwhile."""


class NavigationSide(Protocol):
    """What a host performs for the navigation table's effects."""

    async def collect_entries(self) -> Report:
        """Collect the abandoned branch's entries."""
        ...

    async def run_hooks(self) -> Report:
        """Run ``session_before_tree``: ``done``, ``supplied`` or ``cancelled``."""
        ...

    async def start_summary(self) -> Report:
        """Run the branch-summary operation; its status."""
        ...

    async def cancel_summary(self) -> None:
        """Cancel the branch-summary operation and wait until it settled."""
        ...

    async def stop_hooks(self) -> None:
        """Cancel the ``session_before_tree`` handlers in flight and wait until they settled."""
        ...

    async def switch_leaf(self) -> Report:
        """Move the leaf."""
        ...

    async def switch_leaf_with_summary(self) -> Report:
        """Attach the hook-supplied summary under the new position."""
        ...

    async def rebuild_context(self) -> None:
        """Rebuild the live context from the new leaf."""
        ...

    async def emit_session_tree(self) -> None:
        """Apply any label, run the ``session_tree`` hook, emit ``session_tree``."""
        ...


def navigation_effects(side: NavigationSide) -> dict[str, Effect]:
    """Every effect of the navigation table, bound to what performs it on ``side``."""
    return {
        "collect_entries": side.collect_entries,
        "run_hooks": side.run_hooks,
        "start_summary": side.start_summary,
        "cancel_summary": side.cancel_summary,
        "stop_hooks": side.stop_hooks,
        "switch_leaf": side.switch_leaf,
        "switch_leaf_with_summary": side.switch_leaf_with_summary,
        "rebuild_context": side.rebuild_context,
        "emit_session_tree": side.emit_session_tree,
    }


def start_facts(*, working: bool, target_id: str, old_leaf_id: str | None) -> NavigationFacts:
    """The facts ``navigate`` is stepped with: the session working, the same position.

    Whether a running turn refuses the navigation, or the same position makes it a no-op, is the
    table's choice (its ``turn_running`` and ``same_position`` rows, in the table's order). A
    host that has not read where the session is passes ``old_leaf_id=None`` for no position.
    """
    return NavigationFacts(turn_running=working, same_position=target_id == old_leaf_id)
