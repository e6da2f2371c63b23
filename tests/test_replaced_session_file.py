"""A journal outlives a session file replaced beside it: its half-done operation says whose it was.

The journal is a side file found by name. A process killed mid-compaction leaves an operation
open in it; if another session's file then takes the path (copied over it, a backup restored),
the next opening settles that operation against a file it never belonged to. It is settled by
the same rules (nothing is applied), but with a note naming both sessions, so it is not taken for
the new session's own. Each operation's first record names its session for that.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator import AgentSession, SummaryRoutes
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._store.journal import Journal
from orchestrator._store.settle import Settlement, settle_unfinished_operations
from orchestrator.testing import ScriptedModel
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def header_id(path: Path) -> str:
    with path.open(encoding="utf-8") as lines:
        return str(json.loads(next(lines))["id"])


def left_open(path: Path, session_id: str | None, events: list[str], **data: object) -> None:
    """Journal an operation of ``session_id`` through ``events`` and leave it open (a kill).

    ``None`` names no session, as journals written before sessions were named.
    """
    journal = Journal.open(path)
    runner = Runner(load_machine("operation"))
    first = [True]

    def observe(step: Step) -> None:
        # The first record names the session, as the runtime writes it.
        named = {"sessionId": session_id, **data} if first[0] and session_id else dict(data)
        first[0] = False
        journal.record(step, operation_id="op-old", kind="compaction", data=named)

    runner.subscribe(observe)
    for event in events:
        runner.fire(event, OperationFacts(has_work=True))
    journal.close()


def settled_on_opening(path: Path) -> list[Settlement]:
    """Open the session as its owner (settling its journal) and close it: what was settled."""
    runtime = AgentSession.open(path)
    runtime.close()
    return runtime.settlements


def another_session(path: Path) -> str:
    """Put another session's file at ``path`` (EXAMPLE under a new id); return that id."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["id"] = "replacement-session"
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    return "replacement-session"


def replaced_while_open(tmp_path: Path, events: list[str], **data: object) -> tuple[Path, str]:
    """A session file whose operation was left open (``events`` taken), then another session's
    file put in its place; returns the path and the old session's id."""
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    old = header_id(path)
    left_open(path, old, events, **data)
    another_session(path)
    return path, old


async def test_an_operation_records_the_session_it_belongs_to(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    routes = SummaryRoutes(candidates=(ScriptedModel(["## Goal\nok"] * 4),))
    runtime = AgentSession.open(path, summarizer=routes)
    try:
        assert (await runtime.compact()).status == "committed"
    finally:
        runtime.close()
    records = [r for r in Journal.open(path).records() if r.machine == "operation"]
    assert records[0].data["sessionId"] == header_id(path)
    assert all("sessionId" not in r.data for r in records[1:])  # once per operation


async def test_a_half_done_operation_of_a_replaced_file_is_settled_with_a_note(
    tmp_path: Path,
) -> None:
    # Killed while the model answered.
    path, old = replaced_while_open(tmp_path, ["prepared", "hooks_done"])
    new = header_id(path)
    before = path.read_bytes()
    (settled,) = settled_on_opening(path)
    assert (settled.operation_id, settled.source, settled.dest) == (
        "op-old",
        "summarizing",
        "cancelled",
    )
    assert settled.note == f"it was recorded for session {old}; the file is now session {new}"
    assert path.read_bytes() == before  # nothing applied to the file now there
    (record,) = [r for r in Journal.open(path).records() if r.data.get("settled")]
    assert record.data["note"] == settled.note
    assert settled_on_opening(path) == []  # settled once


async def test_its_commit_counts_only_if_its_entry_is_in_the_file_now_there(
    tmp_path: Path,
) -> None:
    # Killed in committing, its entry planned as one the replacement happens to hold (a copy of
    # the old file's entries under a new id would): committed, with the note; one it does not
    # hold: failed, with the note.
    present = json.loads(EXAMPLE.read_text(encoding="utf-8").splitlines()[-1])["id"]
    committing = ["prepared", "hooks_done", "summary_ready"]
    path, old = replaced_while_open(tmp_path, committing, entryId=present)
    assert [(s.dest, s.note is not None) for s in settled_on_opening(path)] == [("committed", True)]

    left_open(path, old, committing, entryId="not-there")
    assert [(s.dest, s.note is not None) for s in settled_on_opening(path)] == [("failed", True)]


async def test_the_same_session_reopened_settles_without_a_note(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    left_open(path, header_id(path), ["prepared", "hooks_done"])
    assert [(s.dest, s.note) for s in settled_on_opening(path)] == [("cancelled", None)]


async def test_a_journal_written_before_sessions_were_named_settles_as_before(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    left_open(path, None, ["prepared"])
    another_session(path)
    assert [(s.dest, s.note) for s in settled_on_opening(path)] == [("cancelled", None)]


def test_an_empty_session_id_names_nobody() -> None:
    # A record naming "" (a hand-edited journal, a session written without a header) is no other
    # session: it settles without a note; a real other id gets one.
    for recorded, noted in (("", False), ("someone-else", True)):
        journal = Journal.in_memory()
        step = Step(
            machine="operation", source="preparing", event="e", dest="summarizing", effects=()
        )
        journal.record(step, operation_id="op", kind="compaction", data={"sessionId": recorded})
        (settled,) = settle_unfinished_operations(journal, set(), session_id="this-session")
        assert (settled.dest, settled.note is not None) == ("cancelled", noted)
