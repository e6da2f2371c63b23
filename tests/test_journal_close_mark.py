"""Opening reads the journal from the last clean close on, not its whole history (issue 9).

Every opening settles what the journal shows half-done; it parsed every record the session
ever had (100,000 records: 1.3 s per opening). A clean close (every operation finished) is
journaled, and no operation before it can be open, so opening reads only what follows it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._lifecycle.machine import Step
from orchestrator._runtime.session import AgentSession
from orchestrator._store.files import read_side_file_tail
from orchestrator._store.journal import Journal, journal_path
from orchestrator._store.journal_records import after_last_close, unsettled_part
from tests.cli_kit import EXAMPLE

CLOSE = Step(
    machine="turn", source="idle", event="close", dest="closed", effects=("close_session",)
)


def op_step(source: str, dest: str) -> Step:
    return Step(machine="operation", source=source, event="e", dest=dest, effects=())


def compacted_and_closed(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path, owner="test")
    anyio.run(runtime.compact)
    runtime.close()
    return path


def test_a_clean_close_is_the_journals_last_record(tmp_path: Path) -> None:
    path = compacted_and_closed(tmp_path)
    last = Journal.open(path).records()[-1]
    assert (last.machine, last.event, last.dest) == ("turn", "close", "closed")
    raw = journal_path(path).read_bytes()
    assert unsettled_part(raw) == b""  # the next opening has nothing to read


def test_opening_settles_what_follows_the_last_close_and_reads_nothing_before(
    tmp_path: Path,
) -> None:
    path = compacted_and_closed(tmp_path)
    journal = Journal.open(path)
    history = journal_path(path).read_bytes()
    # A later run, killed mid-compaction: its operation is after the close.
    journal.record(op_step("preparing", "summarizing"), operation_id="late", kind="compaction")
    raw = journal_path(path).read_bytes()
    assert unsettled_part(raw) == raw[len(history) :]
    assert [op.operation_id for op in journal.open_operations()] == ["late"]
    runtime = AgentSession.open(path, owner="test")
    try:
        assert [(s.operation_id, s.dest) for s in runtime.settlements] == [("late", "cancelled")]
    finally:
        runtime.close()
    assert unsettled_part(journal_path(path).read_bytes()) == b""


def test_only_a_whole_close_record_is_a_mark(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "s.jsonl")
    journal.record(op_step("preparing", "summarizing"), operation_id="early", kind="compaction")
    path = journal_path(tmp_path / "s.jsonl")
    with path.open("a", encoding="utf-8") as out:
        # The mark's bytes inside a string are escaped; outside a record they mark nothing;
        # a torn last line is no mark either.
        out.write(json.dumps({"note": '"event":"close","to":"closed"'}) + "\n")
        out.write('{"event":"close","to":"closed"}\n')
    journal.record(op_step("preparing", "summarizing"), operation_id="later", kind="compaction")
    with path.open("a", encoding="utf-8") as out:
        out.write('{"time":"x","machine":"turn","operationId":null,"kind":null,"from":"idle",')
        out.write('"event":"close","to":"closed"')
    raw = path.read_bytes()
    assert unsettled_part(raw) == raw
    assert [op.operation_id for op in journal.open_operations()] == ["early", "later"]


def test_a_close_is_marked_only_after_records_with_none_left_open(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "s.jsonl")
    assert not journal.may_mark_close()  # nothing written: opening and closing leaves no file
    journal.record(op_step("preparing", "summarizing"), operation_id="op", kind="compaction")
    assert not journal.may_mark_close()  # an operation of this run is not finished
    journal.record(op_step("summarizing", "cancelled"), operation_id="op", kind="compaction")
    assert journal.may_mark_close()


def test_an_owner_that_ends_with_an_operation_open_writes_no_mark(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path, owner="test")
    assert runtime.journal is not None
    # As if the final record of an operation had failed to be written.
    runtime.journal.record(op_step("preparing", "summarizing"), operation_id="x", kind="prune")
    runtime.close()
    last = Journal.open(path).records()[-1]
    assert (last.operation_id, last.dest) == ("x", "summarizing")
    reopened = AgentSession.open(path, owner="test")
    try:
        assert [(s.operation_id, s.dest) for s in reopened.settlements] == [("x", "cancelled")]
    finally:
        reopened.close()


def test_a_close_that_cannot_be_journaled_still_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path, owner="test")
    anyio.run(runtime.compact)
    journal = runtime.journal
    assert journal is not None

    def full_disk(step: Step, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal, "write_step", full_disk)
    runtime.close()  # the mark only spares the next opening a read: closing goes on
    assert runtime.closed
    assert "the close was not journaled" in caplog.text
    again = AgentSession.open(path, owner="test")  # the lock was released
    again.close()


_CLOSE_LINE = (
    b'{"time":"2026-12-04T00:00:00.000Z","machine":"turn","operationId":null,"kind":null,'
    b'"from":"idle","event":"close","to":"closed","effects":["close_session"],"data":{}}\n'
)
_PIECES = [
    _CLOSE_LINE,
    b'{"time":"t","machine":"operation","operationId":"op","kind":"compaction","from":"a",'
    b'"event":"e","to":"b","effects":[],"data":{}}\n',
    b'{"note":"\\"event\\":\\"close\\",\\"to\\":\\"closed\\""}\n',  # the mark, escaped
    b'{"event":"close","to":"closed"}\n',  # the mark's bytes, not a record
    b"not json at all\n",
    b'{"time":"x","machine":"turn","operationId":null,"kind":null,"from":"idle",'
    b'"event":"close","to":"closed"',  # a torn close record, no newline
    b"\n",
]


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(range(len(_PIECES))), max_size=12),
    first=st.integers(min_value=1, max_value=300),
)
def test_reading_from_the_end_finds_what_reading_it_whole_finds(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[int], first: int
) -> None:
    raw = b"".join(_PIECES[n] for n in pieces)
    path = tmp_path_factory.mktemp("tail") / "s.jsonl.journal"
    path.write_bytes(raw)
    tail = read_side_file_tail(path, "read the journal", after_last_close, first=first)
    assert tail == unsettled_part(raw)


def test_opening_reads_the_journal_from_its_end_not_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It read the whole file at every opening (and held it), then looked for the last close.
    path = tmp_path / "s.jsonl"
    history = _PIECES[1] * 40_000 + _CLOSE_LINE  # about 5 MB of finished runs
    late = b'{"time":"t","machine":"operation","operationId":"late","kind":"compaction",'
    late += b'"from":"preparing","event":"e","to":"summarizing","effects":[],"data":{}}\n'
    journal_path(path).write_bytes(history + late)
    assert len(history) > 4_000_000
    read: list[int] = []
    real_pread, real_read = os.pread, os.read

    def pread(fd: int, length: int, offset: int) -> bytes:
        data = real_pread(fd, length, offset)
        read.append(len(data))
        return data

    def whole(fd: int, length: int) -> bytes:
        data = real_read(fd, length)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "read", whole)
    operations = Journal.open(path).open_operations()
    monkeypatch.setattr(os, "pread", real_pread)
    monkeypatch.setattr(os, "read", real_read)
    assert [op.operation_id for op in operations] == ["late"]
    assert sum(read) <= 1 << 16  # the last 64 KB, where the close record is
