"""Helpers for the Temporal tests (issue 10): the server, a session store, workers, histories.

``.ci/run`` starts ``temporal server start-dev`` on loopback and exports where it listens as
``ORCHESTRATOR_TEST_TEMPORAL``; without it a test skips locally, and fails when
``ORCHESTRATOR_REQUIRE_SERVICES=1`` (CI). Every test uses its own task queue, so tests (and
the workflows they leave) never meet.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cli_kit import EXAMPLE

TEMPORAL = "ORCHESTRATOR_TEST_TEMPORAL"
REQUIRE_SERVICES = "ORCHESTRATOR_REQUIRE_SERVICES"
HISTORIES = Path(__file__).parent / "data" / "temporal"
"""Recorded workflow histories the replay tests replay (refreshed by ORCHESTRATOR_RECORD=1)."""


def temporal_address() -> str:
    """Where the Temporal server listens, or skip (locally) / fail (CI)."""
    value = os.environ.get(TEMPORAL, "")
    if value:
        return value
    message = f"needs a Temporal server: set {TEMPORAL}=HOST:PORT (.ci/run starts one and sets it)"
    if os.environ.get(REQUIRE_SERVICES, "") == "1":
        pytest.fail(f"{REQUIRE_SERVICES}=1 but {message}")
    pytest.skip(message)


def example_id() -> str:
    """The shipped example session's id (its header's)."""
    header: dict[str, Any] = json.loads(EXAMPLE.read_text(encoding="utf-8").splitlines()[0])
    return str(header["id"])


def store_with_example(directory: Path) -> tuple[str, Path]:
    """A directory store holding the example session under a fresh id; returns (id, file).

    A fresh id is a fresh workflow id: a test never reaches a workflow another test left.
    """
    directory.mkdir(parents=True, exist_ok=True)
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    session_id = header["id"] = str(uuid.uuid4())
    target = directory / f"{session_id}.jsonl"
    target.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    return session_id, target


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


def journal_rows(path: Path) -> list[tuple[str, str, str, tuple[str, ...], dict[str, Any]]]:
    """The operation steps in a session's journal: (from, event, to, effects, facts)."""
    journal = Path(str(path) + ".journal")
    rows = []
    for line in journal.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["machine"] == "operation":
            data = record["data"]
            rows.append(
                (
                    record["from"],
                    record["event"],
                    record["to"],
                    tuple(record["effects"]),
                    data.get("facts", {}),
                )
            )
    return rows


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
