"""A session created over RPC and closed unwritten leaves nothing; an earlier journal is kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator._core.model import ModelRequest
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator.testing import FunctionModel
from tests.cli_kit import EXAMPLE
from tests.runtime_kit import HubClient as Client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def operations(journal: Path) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    return [(r["operationId"], r["to"]) for r in records if r["machine"] == "operation"]


async def test_a_new_session_closed_unwritten_leaves_nothing_behind(tmp_path: Path) -> None:
    # Its journal held the records of a compaction with nothing to compact, beside no file.
    client = Client(SessionHub(RuntimeOptions(root=tmp_path)))
    opened = await client.call("session.open", path="new.jsonl", create=True)
    skipped = await client.call("session.compress", session_id=opened["session_id"])
    assert skipped["compacted"] is False
    assert (tmp_path / "new.jsonl.journal").stat().st_size > 0  # it holds records now
    await client.call("session.close", session_id=opened["session_id"])
    assert list(tmp_path.iterdir()) == []


async def test_a_journal_there_before_a_new_session_is_kept(tmp_path: Path) -> None:
    # A session another program removed while a compaction ran: the journal of what ran stays
    # (its history is a real session's), and a new session made at the same path later neither
    # settles those operations again nor removes them when it closes unwritten.
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)

    async def remove_the_session(request: ModelRequest) -> str:
        path.unlink(missing_ok=True)
        return "## Goal\nSummarized."

    summarizer = SummaryRoutes(candidates=(FunctionModel(remove_the_session),))
    client = Client(SessionHub(RuntimeOptions(root=tmp_path, summarizer=summarizer)))
    opened = await client.call("session.open", path="s.jsonl")
    conflict = await client.error("session.compress", session_id=opened["session_id"])
    assert conflict["code"] == -32007, conflict
    await client.call("session.close", session_id=opened["session_id"])
    journal = tmp_path / "s.jsonl.journal"
    before = journal.read_bytes()
    [old] = [o for o, s in operations(journal) if s == "conflict"]  # the compaction that ran
    assert not path.exists()

    again = await client.call("session.open", path="s.jsonl", create=True)
    assert again["session_id"] != opened["session_id"]
    assert (again["entries"], again["settled"]) == (0, [])  # nothing of the old one settled
    await client.call("session.compress", session_id=again["session_id"])  # skipped: records
    await client.call("session.close", session_id=again["session_id"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl.journal"]
    after = journal.read_bytes()
    assert after.startswith(before)  # kept whole, the new session's records after it
    assert [s for o, s in operations(journal) if o == old][-1] == "conflict"
