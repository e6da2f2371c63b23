"""The ``journal`` command: a session's lifecycle journal, readably (D24).

One line per transition, ``HH:MM:SS.mmm machine[op-id] from --event--> to  (effects)``, grouped:
first the session's turn and navigation steps, then each operation in the order it started, with
a closing line giving its outcome. An operation left open is marked: in progress while a live
process owns the session (its lock file names it), else left by a process that died mid-way,
with the note that it is settled the next time the session is opened. Times are UTC, as recorded.
A session with no journal (never changed) shows an empty one: that is no error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator._cli.common import print_json, require_file
from orchestrator._cli.database import add_database_option, stored_journal
from orchestrator._core.errors import SessionError
from orchestrator._core.printable import printable
from orchestrator._lifecycle.machine import MachineDef, load_machine
from orchestrator._store.journal import JOURNAL_SUFFIX, Journal
from orchestrator._store.journal_records import (
    JournaledOperation,
    JournalRead,
    JournalRecord,
    operations,
)
from orchestrator._store.owner import Holder, current_owner
from orchestrator._store.settle import settles_from


def register(commands: Any) -> None:
    """Add the ``journal`` command to the parser."""
    journal = commands.add_parser("journal", help="show a session's lifecycle journal")
    journal.add_argument(
        "session", help="the session file (or its .journal file), or its id with --database"
    )
    journal.add_argument("--operation", metavar="ID", help="show one operation only")
    journal.add_argument("--json", action="store_true", help="print records as JSON")
    add_database_option(journal)
    journal.set_defaults(handler=_journal)


def _journal(args: argparse.Namespace) -> int:
    journal = _open(args)
    owner = _owner(args)
    read = journal.read()
    for problem in read.problems:
        print(f"warning: {journal.location}: {problem}", file=sys.stderr)
    ops = operations(read.records)
    if args.operation is not None:
        ops = [op for op in ops if op.operation_id == args.operation]
        if not ops:
            raise SessionError(f"operation {args.operation} is not in {journal.location}")
    final = journal.operation_machine.final
    if args.json:
        whole = args.operation is None
        print_json(journal_report(journal.location, read, ops, final, whole=whole, owner=owner))
        return 0
    if args.operation is None:
        _print_session_steps(read.records, owner)
    for op in ops:
        _print_operation(op, journal.operation_machine, owner)
    if args.operation is None and not journal.exists():
        # A session never changed has none (opening and closing it leaves none): not an error.
        print(f"-- no journal at {journal.location}: nothing was journaled")
    elif args.operation is None:
        still_open = sum(op.state not in final for op in ops)
        transitions, count = _count(len(read.records), "transition"), _count(len(ops), "operation")
        print(f"-- {transitions}, {count} ({still_open} open)")
    return 0


def _open(args: argparse.Namespace) -> Journal:
    """The session's journal, which need not exist; the session must.

    Raises:
        SessionError: No such session file, or no such session in the database.
    """
    if args.database is not None:
        # The session must be there; its journal is in the same database (issue 10).
        return stored_journal(args)
    session = _session_path(args)
    journal = Journal.open(session)
    if not journal.exists():
        # A journal needs its session: a mistyped session path is the likelier mistake.
        require_file(session)
    return journal


def _session_path(args: argparse.Namespace) -> str:
    session = str(args.session)
    return session[: -len(JOURNAL_SUFFIX)] if session.endswith(JOURNAL_SUFFIX) else session


def _owner(args: argparse.Namespace) -> Holder | None:
    """Who is changing the session file now, from its lock (read, never taken; D27).

    An open operation is then that owner's, in progress, not one a dead process left. A stored
    session's lock is in its database: not looked up (``None``).
    """
    return None if args.database is not None else current_owner(_session_path(args))


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def journal_report(
    location: str,
    read: JournalRead,
    ops: list[JournaledOperation],
    final: frozenset[str],
    *,
    whole: bool = True,
    owner: Holder | None = None,
) -> dict[str, Any]:
    """The ``orchestrator journal --json`` object.

    Args:
        location: The journal's path.
        read: What reading it found.
        ops: The operations to show.
        final: The operation machine's final states.
        whole: Show every record; otherwise only those of ``ops``.
        owner: Who owns the session now (its open operations are in progress), if anyone.

    Returns:
        ``{"journal", "records", "operations", "problems", "owner"}``; each operation has
        ``operationId, kind, state, open, settled, records, data``; ``owner`` is
        ``{"pid", "name"}`` or ``null``.
    """
    records = read.records if whole else tuple(r for op in ops for r in op.records)
    return {
        "journal": location,
        "records": [r.as_json() for r in records],
        "operations": [
            {
                "operationId": op.operation_id,
                "kind": op.kind,
                "state": op.state,
                "open": op.state not in final,
                "settled": bool(op.records[-1].data.get("settled")),
                "records": len(op.records),
                "data": dict(op.data),
            }
            for op in ops
        ],
        "problems": [{"line": p.line, "code": p.code, "message": p.message} for p in read.problems],
        "owner": None if owner is None else {"pid": owner.pid, "name": owner.name},
    }


def _print_session_steps(records: tuple[JournalRecord, ...], owner: Holder | None) -> None:
    """The turn and navigation steps, each run left mid-way marked.

    A turn or a navigation writes nothing of its own that settling must close (its compaction
    or summary is an operation, settled on reopen), but a run whose process ended mid-way
    shows as records that stop short of rest: the next run's records start again from rest.
    Marked here, so that reading the journal does not suggest a run that never ended went on.
    """
    steps = [r for r in records if r.operation_id is None]
    if not steps:
        return
    print("turn and navigation")
    last: dict[str, JournalRecord] = {}
    for record in steps:
        before = last.get(record.machine)
        if before is not None and record.source != before.dest and not _at_rest(before):
            print(
                f"  -- {printable(before.machine)} left in {printable(before.dest)}: "
                "its process ended there"
            )
        print("  " + transition_line(record))
        last[record.machine] = record
    for record in last.values():
        if not _at_rest(record):
            doing = f"in progress, by {owner}" if owner else "its process ended there"
            print(f"  -- {printable(record.machine)} left in {printable(record.dest)}: {doing}")


def _at_rest(record: JournalRecord) -> bool:
    """Whether the machine stood at rest after ``record`` (its initial or a final state)."""
    if record.machine not in ("turn", "navigation"):
        return True  # not a table this program knows: nothing to say about it
    table = load_machine(record.machine)
    return record.dest == table.initial or record.dest in table.final


def _print_operation(op: JournaledOperation, table: MachineDef, owner: Holder | None) -> None:
    print(f"operation {printable(op.operation_id)} ({printable(op.kind or 'unknown kind')})")
    for record in op.records:
        print("  " + transition_line(record))
    state = printable(op.state)
    if op.state in table.final:
        settled = " (settled on reopen)" if op.records[-1].data.get("settled") else ""
        print(f"  => {state}{settled}")
    else:
        planned = f", entry {printable(op.entry_id)} planned" if op.entry_id else ""
        doing = f"in progress, by {owner}" if owner else _settling(op, table)
        print(f"  => OPEN in {state}{planned}: {doing}")


def _settling(op: JournaledOperation, table: MachineDef) -> str:
    """What opening the session will do with an open operation, as settling will do it."""
    origin = settles_from(table, op.state)
    if origin == op.state:
        return "it will be settled when the session is next opened"
    # It cannot be replayed; settling looks its commit up as it does for this state.
    return (
        f"not a state the {table.name} table can settle; it will be settled as one left in "
        f"{origin} (committed if its change is in the session, else failed) when the session is "
        "next opened"
    )


def transition_line(record: JournalRecord) -> str:
    """One transition as ``HH:MM:SS.mmm machine[op-id] from --event--> to  (effects)``.

    Every part is the journal's text, which anyone could have written: control characters are
    shown escaped, so the transition stays one line and cannot drive the terminal.

    Returns:
        The line, without the effects part when the step asked for none.
    """
    clock = record.time[11:23] if len(record.time) >= 23 and record.time[10] == "T" else record.time
    machine = f"{record.machine}[{record.operation_id}]" if record.operation_id else record.machine
    effects = f"  ({', '.join(record.effects)})" if record.effects else ""
    return printable(
        f"{clock} {machine} {record.source} --{record.event}--> {record.dest}{effects}"
    )
