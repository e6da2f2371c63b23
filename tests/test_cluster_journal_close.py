"""A cluster activity gives its journal's file descriptor back when it has written its lines.

The journal keeps its file open between records (one write each); a worker opens one journal
per activity, so an activity that left it to the garbage collector (an exception's traceback
can keep it in a cycle for a while) would pile up descriptors on a busy worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.calls import JournalLine, Op, TurnCall  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.stores import WorkerStores  # noqa: E402
from orchestrator._cluster.turn.activities import TurnActivities  # noqa: E402
from orchestrator._models.offline import OfflineSummarizer  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store.journal import Journal  # noqa: E402
from tests.cluster_kit import Database  # noqa: E402
from tests.test_journal import open_journals  # noqa: E402


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[Journal]:
    """Every journal the worker opens, held here so that only an explicit close frees its file."""
    held: list[Journal] = []
    opened = WorkerStores.journal

    def journal(self: WorkerStores, session_id: str) -> Journal:
        held.append(opened(self, session_id))
        return held[-1]

    monkeypatch.setattr(WorkerStores, "journal", journal)
    return held


def lines() -> list[JournalLine]:
    return [
        JournalLine(seq=0, source="idle", event="start", dest="running", effects=[]),
        JournalLine(seq=1, source="running", event="done", dest="idle", effects=[]),
    ]


def test_a_turn_activity_closes_the_journal_it_wrote(tmp_path: Path, kept: list[Any]) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    stores = WorkerStores(database.location)
    try:
        call = TurnCall(session_id=session_id, run_id="r1", journal=lines())
        TurnActivities(stores, RuntimeSettings()).write_journal(call)
    finally:
        stores.close()
    assert kept, "the activity opened no journal"
    assert [r.dest for r in kept[0].records()] == ["running", "idle"]
    assert [name for name in open_journals() if name.startswith(str(tmp_path))] == []


def test_an_operation_activity_closes_the_journal_it_wrote(tmp_path: Path, kept: list[Any]) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    activities = SessionActivities(
        database.location, SummaryRoutes(candidates=(OfflineSummarizer(),))
    )
    op = Op(session_id=session_id, operation_id="op1")
    try:
        activities._write_journal(op, lines(), resend=False)
    finally:
        activities.close()
    assert kept, "the activity opened no journal"
    assert len(kept[0].records()) == 2
    assert [name for name in open_journals() if name.startswith(str(tmp_path))] == []
