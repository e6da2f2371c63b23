"""How a session's lines are kept as ``session_lines`` rows, and what such a row cannot hold.

:class:`~orchestrator._store.postgres.PostgresStore` stores each line as the exact text a pi file
holds; the id and type beside it are copies for queries only. Turning a line into its row, and
refusing an id PostgreSQL text cannot carry, needs no connection and no store, so it lives here,
apart from the store's transactions. So does the filter that keeps psycopg from reporting a
failed ``COPY`` of these rows twice.
"""

from __future__ import annotations

import json
import logging

import psycopg


def _not_a_second_report(record: logging.LogRecord) -> bool:
    """Drop psycopg's warning that ending a failed COPY failed too (the connection was lost).

    The failure that ended the copy is raised, and reported in its one line; the warning was a
    second line on stderr saying the same (``error ignored terminating <psycopg.Copy [BAD]>:
    the connection is lost``). Every other psycopg record passes.
    """
    return not (
        record.msg == "error ignored terminating %r: %s"
        and isinstance(record.args, tuple)
        and bool(record.args)
        and isinstance(record.args[0], psycopg.Copy)
    )


logging.getLogger("psycopg").addFilter(_not_a_second_report)


def line_row(
    session_id: str, seq: int, line: bytes
) -> tuple[str, int, str, str | None, str | None]:
    """A ``session_lines`` row for one serialized line (with or without its newline)."""
    text = line.removesuffix(b"\n").decode("utf-8")
    entry_id, entry_type = ids_of(text)
    if entry_type is not None and "\x00" in entry_type:
        entry_type = None  # a query column only; the line keeps it (escaped, as JSON does)
    return (session_id, seq, text, entry_id if entry_type != "session" else None, entry_type)


def ids_of(text: str) -> tuple[str | None, str | None]:
    """The id and type a line names (header included), when they are strings."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(value, dict):
        return None, None
    kind, entry_id = value.get("type"), value.get("id")
    return (
        entry_id if isinstance(entry_id, str) else None,
        kind if isinstance(kind, str) else None,
    )


def nul_id_refusal(where: str, entry_id: object) -> str | None:
    """Why an id cannot be stored: PostgreSQL text holds no NUL, and ids are text columns."""
    if isinstance(entry_id, str) and "\x00" in entry_id:
        return (
            f"{where}: the id {entry_id!r} holds a NUL character, which PostgreSQL text cannot "
            "store; nothing was written"
        )
    return None
