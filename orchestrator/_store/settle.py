"""Settling on reopen: operations the journal shows half-done are closed (decision D24).

No model is called. The operation table decides where each one goes through its ``reopened``
rows: before the commit it is ``cancelled`` (nothing was applied); in ``committing`` it is
``committed`` when its commit landed and ``failed`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass

from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import step
from orchestrator._store.journal import Journal, JournaledOperation

SETTLE_EVENT = "reopened"
"""The operation table's event for an operation found half-done when the session is reopened."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """How one half-done operation was closed on reopen.

    Attributes:
        operation_id: The operation.
        kind: Its kind.
        source: The state it was left in.
        dest: The final state it was settled to.
    """

    operation_id: str
    kind: str | None
    source: str
    dest: str


def settle_unfinished_operations(
    journal: Journal,
    entry_ids_in_session: Container[str],
    *,
    is_applied: Callable[[JournaledOperation], bool] | None = None,
) -> list[Settlement]:
    """Close every operation the journal shows half-done, without calling any model (D24).

    The operation table decides where each one goes, through its ``reopened`` rows: before the
    commit it is ``cancelled`` (nothing was applied); in ``committing`` it is ``committed`` when
    its commit landed and ``failed`` otherwise. The commit landed when the ``entryId`` recorded on
    reaching ``committing`` is in the session, or when ``is_applied`` says so (a prune rewrites
    entries instead of appending one, so the driver checks, e.g., for ``prunedAt``). One record
    per settled operation is appended, with ``data["settled"] = True``.

    Args:
        journal: The session's journal.
        entry_ids_in_session: The ids of the entries now in the session.
        is_applied: Optional check of whether an operation's change is in the session.

    Returns:
        What was settled, in journal order.

    Raises:
        TransitionError: The table has no ``reopened`` row for a state an operation was left
            in (a journal written by a different table).
    """
    defn = journal.operation_machine
    settled = []
    for op in journal.open_operations():
        applied = (op.entry_id is not None and op.entry_id in entry_ids_in_session) or (
            is_applied is not None and is_applied(op)
        )
        taken = step(defn, op.state, SETTLE_EVENT, Facts(entry_present=applied))
        journal.record(
            taken,
            operation_id=op.operation_id,
            kind=op.kind,
            data={"settled": True, "applied": applied},
        )
        settled.append(
            Settlement(operation_id=op.operation_id, kind=op.kind, source=op.state, dest=taken.dest)
        )
    return settled
