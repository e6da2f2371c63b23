"""Helpers for the Temporal tests (issue 10): the server, a session store, workers, histories.

``.ci/run`` starts ``temporal server start-dev`` on loopback and exports where it listens as
``ORCHESTRATOR_TEST_TEMPORAL``; without it a test skips locally, and fails when
``ORCHESTRATOR_REQUIRE_SERVICES=1`` (CI), as the PostgreSQL tests do (tests/services.py).
Every test uses its own task queue and session ids, so tests (and the workflows they leave)
never meet.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from orchestrator._store.locations import is_database_url
from tests.cli_kit import EXAMPLE
from tests.services import service_env

TEMPORAL = "ORCHESTRATOR_TEST_TEMPORAL"
HISTORIES = Path(__file__).parent / "data" / "temporal"
"""Recorded workflow histories the replay tests replay (refreshed by ORCHESTRATOR_RECORD=1)."""


@functools.cache
def deployment_for_tests() -> str:
    """The worker deployment the tests' versioned worker processes share, whatever their queue.

    One per build: a deployment per queue would reach the dev server's limit of 100 a namespace
    in a few runs, and one name for every build would refuse a new build as current while an
    earlier build's queues are still active (a run just before, or another checkout's).
    """
    from orchestrator._cluster.versioning import build_id

    return f"orchestrator-tests-{build_id().rsplit('-', 1)[1]}"


def temporal_address() -> str:
    """Where the Temporal server listens (``HOST:PORT``), or skip (locally) / fail (CI)."""
    return service_env(TEMPORAL, "a Temporal server")


class Database:
    """A shared store for a test: a directory of session files, or a PostgreSQL schema.

    Args:
        location: The directory, or the URL (``--database``).
    """

    def __init__(self, location: str) -> None:
        self.location = location

    def add_example(self) -> str:
        """Store the example session under a fresh id (a fresh workflow id); returns the id.

        A fresh id means a test never reaches a workflow another test left behind.
        """
        lines = EXAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
        header = json.loads(lines[0])
        session_id = header["id"] = str(uuid.uuid4())
        data = (json.dumps(header) + "\n" + "".join(lines[1:])).encode("utf-8")
        if is_database_url(self.location):
            from orchestrator._store.postgres import PostgresStore

            with PostgresStore(self.location) as store:
                store.import_bytes(data)
        else:
            Path(self.location).mkdir(parents=True, exist_ok=True)
            (Path(self.location) / f"{session_id}.jsonl").write_bytes(data)
        return session_id

    def entries(self, session_id: str) -> list[dict[str, Any]]:
        """The stored entries of the session."""
        from orchestrator._cluster.stores import cluster_store

        with contextlib.closing(cluster_store(self.location, session_id)) as store:
            return list(store.load().entries)

    def new_compactions(self, session_id: str) -> list[dict[str, Any]]:
        """The compaction entries added to the example session (it holds one already)."""
        known = {e["id"] for e in entries(EXAMPLE)}
        return [
            e
            for e in self.entries(session_id)
            if e["type"] == "compaction" and e["id"] not in known
        ]

    def operation_records(self, session_id: str) -> list[dict[str, Any]]:
        """The operation records of the session's journal, as JSON objects."""
        from orchestrator._cluster.stores import cluster_journal

        journal = cluster_journal(self.location, session_id)
        return [r.as_json() for r in journal.records() if r.machine == "operation"]

    def journal_rows(self, session_id: str) -> list[Row]:
        """The operation steps of the session's journal: (from, event, to, effects, facts)."""
        return [_row(r) for r in self.operation_records(session_id)]

    def turn_rows(self, session_id: str) -> list[Row]:
        """The turn steps of the session's journal: (from, event, to, effects, facts)."""
        from orchestrator._cluster.stores import cluster_journal

        journal = cluster_journal(self.location, session_id)
        return [_row(r.as_json()) for r in journal.records() if r.machine == "turn"]

    def new_entries(self, session_id: str) -> list[dict[str, Any]]:
        """The entries added to the example session, in order."""
        known = {e["id"] for e in entries(EXAMPLE)}
        return [e for e in self.entries(session_id) if e["id"] not in known]


def sans_operation_id(answer: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC answer (or its result or error) with its operation's id, which each server
    makes up, named ``<id>``: in the result, or in the error's ``data``."""
    out = dict(answer)
    for key in ("result", "error"):
        if isinstance(out.get(key), dict):
            out[key] = sans_operation_id(out[key])
    if isinstance(out.get("data"), dict):
        out["data"] = sans_operation_id(out["data"])
    if isinstance(out.get("operationId"), str):
        out["operationId"] = "<id>"
    return out


def example_id() -> str:
    """The shipped example session's id (its header's)."""
    header: dict[str, Any] = json.loads(EXAMPLE.read_text(encoding="utf-8").splitlines()[0])
    return str(header["id"])


def local_copy(directory: Path) -> Path:
    """A copy of the example session for the one-process host."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "local.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


def queue_name() -> str:
    """A task queue of one's own."""
    return f"test-{uuid.uuid4().hex[:10]}"


def entries(path: Path) -> list[dict[str, Any]]:
    """The entries of a session file (header excluded)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[1:] if line.strip()]


Row = tuple[str, str, str, tuple[str, ...], dict[str, Any]]


def _row(record: dict[str, Any]) -> Row:
    facts = record["data"].get("facts", {})
    return (record["from"], record["event"], record["to"], tuple(record["effects"]), facts)


def journal_rows(path: Path, machine: str = "operation") -> list[Row]:
    """The ``machine`` steps in a session file's journal: (from, event, to, effects, facts).

    Without the clean close one process journals when it closes the session (where its next
    opening starts reading): a cluster's session is never closed by a turn, so the hosts'
    lifecycles compare without it.
    """
    journal = Path(str(path) + ".journal")
    records = map(json.loads, journal.read_text(encoding="utf-8").splitlines())
    return [
        _row(r)
        for r in records
        if r["machine"] == machine and (r["event"], r["to"]) != ("close", "closed")
    ]


def shape(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What two hosts must agree on about an appended entry (ids and clocks differ)."""
    message = entry.get("message") or {}
    content = message.get("content") if entry["type"] == "message" else entry.get("content")
    return (entry["type"], message.get("role"), message.get("stopReason"), str(content)[:60])


@asynccontextmanager
async def connected() -> AsyncIterator[Any]:
    """A Temporal client for the test server."""
    from temporalio.client import Client

    yield await Client.connect(temporal_address())


def save_history(name: str, history_json: str) -> None:
    """Keep a scenario's history as a replay fixture when ``ORCHESTRATOR_RECORD=1``."""
    if os.environ.get("ORCHESTRATOR_RECORD", "") == "1":
        HISTORIES.mkdir(parents=True, exist_ok=True)
        (HISTORIES / f"{name}.json").write_text(history_json + "\n", encoding="utf-8")
