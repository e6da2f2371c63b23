"""Opening a session as its owner: settle the operations a crash left half done (D24).

No model is called: an operation whose commit entry is in the file is marked committed, one
caught before its commit cancelled, any other failed (the operation table's ``reopened`` rows).
Each settlement is traced as a step of its operation and emitted as ``operation_settled``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from orchestrator._lifecycle.machine import Step
from orchestrator._runtime.ports import Ports
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session
from orchestrator._store.settle import Settlement, settle_unfinished_operations


class Opened(Protocol):
    """What :func:`open_runtime` builds: a runtime over its ports, owned, with settlements."""

    ports: Ports
    owner: str
    settlements: list[Settlement]


R = TypeVar("R", bound=Opened)


def open_runtime(
    build: Callable[..., R],
    path: str | os.PathLike[str],
    *,
    owner: str,
    random_hex: Callable[[], str] | None,
    **kwargs: Any,
) -> R:
    """Open a session file as ``owner``: its runtime and journal, settled, with its context built.

    The lock is taken before anything is read (D27), so settling runs with no other owner.

    Raises:
        SessionLockedError: another process owns the session.
    """
    options: dict[str, Any] = {"random_hex": random_hex} if random_hex is not None else {}
    if "clock_ms" in kwargs:
        options["clock"] = kwargs["clock_ms"]
    session = Session.open(Path(path), owner=owner, **options)
    journal: Journal | None = None
    try:
        journal = Journal.open(path, exclusive=True)  # we own the session from here on
        runtime = build(session, journal=journal, **kwargs)
        runtime.owner = owner
        runtime.settlements = settle_on_open(runtime.ports, journal)
        # The model's view, built (and measured: the runtime keeps it so) once now: every turn
        # and compaction starts from it, and a compaction then plans in O(kept entries) on the
        # event loop (issue 9).
        session.context()
        # Ready to write before the first turn: the journal (created if missing; removed at
        # close if still empty) and the store are opened here, where opening costs milliseconds
        # anyway. At a turn's start they would queue on the loop's one disk thread, behind
        # every other session's commit: 1,000 sessions compacting at once waited up to 1.3 s
        # there before their first record (issue 9).
        journal.open_file()
        if not session.ready_to_write:
            session.open_writer()
    except BaseException:
        if journal is not None:
            journal.close()  # removed if this opening created it
        session.close()
        raise
    return runtime


def settle_on_open(ports: Ports, journal: Journal) -> list[Settlement]:
    """Settle the journal's unfinished operations against the session, and announce each.

    Returns:
        The settlements, oldest operation first.
    """
    session = ports.session
    assert session is not None, "settling needs the session"
    settlements = settle_unfinished_operations(
        journal,
        session.tree.by_id,
        is_applied=lambda op: _prune_applied(session, op),
        session_id=session.session_id,
    )
    for settled in settlements:
        kind = settled.kind or "operation"
        with ports.tracer.operation_span(kind, settled.operation_id, "reopened"):
            ports.tracer.on_step(
                Step(
                    machine="operation",
                    source=settled.source,
                    event="reopened",
                    dest=settled.dest,
                    effects=(),
                )
            )
        ports.events.emit(
            "operation_settled",
            id=settled.operation_id,
            kind=settled.kind,
            source=settled.source,
            dest=settled.dest,
            note=settled.note,
        )
    return settlements


def _prune_applied(session: Session, operation: Any) -> bool:
    # A prune commits by rewriting its entries in place: it was applied when all of them are
    # marked pruned in the file.
    ids = operation.data.get("entryIds") if operation.kind == "prune" else None
    if not isinstance(ids, list) or not ids:
        return False
    return all(
        isinstance(session.tree.by_id.get(i, {}).get("message"), dict)
        and session.tree.by_id[i]["message"].get("prunedAt") is not None
        for i in ids
    )
