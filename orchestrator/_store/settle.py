"""Settling on reopen: operations the journal shows half-done are closed (decision D24).

No model is called. The operation table decides where each one goes through its ``reopened``
rows: before the commit it is ``cancelled`` (nothing was applied); in ``committing`` it is
``committed`` when its commit landed and ``failed`` otherwise.

Reading is lenient (D3), and so is settling. A journal can name a state the table has no
``reopened`` row for: one the table does not know (written by another table, or by hand), or
a state of another machine. Refusing it would refuse every later opening of the session too: the
record stays in the journal, so the owner could never settle it, and the session could never be
changed again. Such an operation cannot be replayed, but it can still be closed safely: it is
settled as if it had been left in ``committing``, the one phase that looks its commit up, so an
operation whose entry is in the file is ``committed``, never reported as not applied, and any
other ``failed``; nothing is applied either way. Its settlement carries a note saying so.

A journal is a side file beside its session file, found by name. If the session file was
replaced since (another session copied over it, a backup of another session restored), the
journal's half-done operations belong to a session that is no longer there. Each operation's
first record names its session (``sessionId``, the header's id): one recorded for another
session is settled by the same rows (its commit counts as landed only if its entry is in this
file, as a copy of the old file's entries would hold it), with a note naming both sessions, so
that it is not taken for this session's own. Records written before the id was recorded name
none and settle as before.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import MachineDef, Step, step
from orchestrator._store.journal import Journal
from orchestrator._store.journal_records import JournaledOperation

SETTLE_EVENT = "reopened"
"""The operation table's event for an operation found half-done when the session is reopened."""

STAND_IN_STATE = "committing"
"""Where an operation left in a state without a ``reopened`` row is settled from.

The one phase whose settling looks the commit up: an entry that landed is ``committed``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """How one half-done operation was closed on reopen.

    Attributes:
        operation_id: The operation.
        kind: Its kind.
        source: The state it was left in.
        dest: The final state it was settled to.
        note: Why it was settled unusually (its state has no ``reopened`` row), or that it was
            recorded for another session than the file's; ``None`` when neither.
    """

    operation_id: str
    kind: str | None
    source: str
    dest: str
    note: str | None = None


def settles_from(defn: MachineDef, state: str) -> str:
    """The state an operation left in ``state`` is settled from by the table's ``reopened`` rows.

    ``state`` itself when the table has a ``reopened`` row for it; otherwise (a state the table
    does not know, or one of another machine) :data:`STAND_IN_STATE`, so that its commit is
    looked up.
    """
    return state if defn.rows_for(state, SETTLE_EVENT) else STAND_IN_STATE


def settle_unfinished_operations(
    journal: Journal,
    entry_ids_in_session: Container[str],
    *,
    is_applied: Callable[[JournaledOperation], bool] | None = None,
    session_id: str | None = None,
) -> list[Settlement]:
    """Close every operation the journal shows half-done, without calling any model (D24).

    The operation table decides where each one goes, through its ``reopened`` rows: before the
    commit it is ``cancelled`` (nothing was applied); in ``committing`` it is ``committed`` when
    its commit landed and ``failed`` otherwise; a state it has no ``reopened`` row for is settled
    as ``committing`` is, with a note (on the settlement and in its record). The commit landed
    when the ``entryId`` recorded on reaching ``committing`` is in the session, or when
    ``is_applied`` says so (a prune rewrites entries instead of appending one, so the driver
    checks, e.g., for ``prunedAt``). One record per settled operation is appended, with
    ``data["settled"] = True`` (and its ``note``).

    Args:
        journal: The session's journal.
        entry_ids_in_session: The ids of the entries now in the session.
        is_applied: Optional check of whether an operation's change is in the session.
        session_id: The session's id (its header's), checked against the one each operation
            recorded (a mismatch adds a note); ``None`` or empty checks nothing.

    Returns:
        What was settled, in journal order.

    Raises:
        TransitionError: The table cannot settle :data:`STAND_IN_STATE` either (a custom table
            without a ``committing`` state or its ``reopened`` rows).
    """
    defn = journal.operation_machine
    settled = []
    for op in journal.open_operations():
        applied = (op.entry_id is not None and op.entry_id in entry_ids_in_session) or (
            is_applied is not None and is_applied(op)
        )
        taken, note = _settling_step(defn, op, applied)
        elsewhere = _recorded_for_another(op, session_id)
        if elsewhere is not None:
            note = f"{elsewhere}; {note}" if note is not None else elsewhere
        data: dict[str, object] = {"settled": True, "applied": applied}
        if note is not None:
            data["note"] = note
        journal.record(taken, operation_id=op.operation_id, kind=op.kind, data=data)
        settled.append(
            Settlement(
                operation_id=op.operation_id,
                kind=op.kind,
                source=op.state,
                dest=taken.dest,
                note=note,
            )
        )
    return settled


def _recorded_for_another(op: JournaledOperation, session_id: str | None) -> str | None:
    """A note when ``op`` was recorded for another session than ``session_id``, else ``None``."""
    recorded = op.data.get("sessionId")
    if not session_id or not isinstance(recorded, str) or recorded in ("", session_id):
        return None
    return f"it was recorded for session {recorded}; the file is now session {session_id}"


def _settling_step(
    defn: MachineDef, op: JournaledOperation, applied: bool
) -> tuple[Step, str | None]:
    """The ``reopened`` step that closes ``op``, and a note when it had to stand in for its state.

    The step keeps ``op``'s own last state as its source, so the journal reads as it happened.
    """
    origin = settles_from(defn, op.state)
    taken = step(defn, origin, SETTLE_EVENT, OperationFacts(entry_present=applied))
    if origin == op.state:
        return taken, None
    note = (
        f"its last state {op.state!r} is not one the {defn.name} table can settle, "
        f"so it was settled as one left in {origin}"
    )
    return replace(taken, source=op.state), note
