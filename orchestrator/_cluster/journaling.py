"""How an activity writes the machine steps the workflow handed it, before its effect performs.

The three table hosts (operation, turn, navigation) hand their steps to activities alike: the
lines not yet written, in order, and whether an earlier activity that carried some of them was
lost (``resend``). Each line is written once: on a resend the lines whose step number the
journal already holds for this run of the machine are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator._cluster.calls import JournalLine
from orchestrator._lifecycle.machine import Step
from orchestrator._store.journal import Journal
from orchestrator._store.journal_records import JournalRecord


def write_lines(
    journal: Journal,
    machine: str,
    lines: Sequence[JournalLine],
    *,
    resend: bool,
    mine: Callable[[JournalRecord], bool],
    data: Mapping[str, Any],
    line_data: bool = True,
    durable_last: bool = True,
    operation_id: str | None = None,
    kind: str | None = None,
) -> None:
    """Write ``lines`` to ``journal`` as steps of ``machine``, each once.

    Args:
        journal: The session's journal.
        machine: The machine that stepped.
        lines: The steps, in order.
        resend: Some lines may already be written: skip the step numbers ``mine`` finds.
        mine: Which records belong to this run of the machine.
        data: What every record carries besides the step's facts and number.
        line_data: Each line's own data goes in too (the turn table's lines carry none that
            one process journals).
        durable_last: The last line is written durably and the others not: its fsync (or a
            database's synchronous commit) makes them durable too, before the effect performs.
            Otherwise each record is as durable as the journal makes its machine's records.
        operation_id: The operation the records belong to.
        kind: The operation's kind.
    """
    written: set[Any] = set()
    if resend:
        written = {r.data.get("step") for r in journal.records() if mine(r)}
    todo = [line for line in lines if line.seq not in written]
    for index, line in enumerate(todo):
        step = Step(
            machine=machine,
            source=line.source,
            event=line.event,
            dest=line.dest,
            effects=tuple(line.effects),
        )
        own = line.data if line_data else {}
        journal.record(
            step,
            operation_id=operation_id,
            kind=kind,
            data={**own, "facts": line.facts, "step": line.seq, **data},
            durable=(index == len(todo) - 1) if durable_last else None,
        )
