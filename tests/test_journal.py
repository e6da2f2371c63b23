"""The lifecycle journal (D24): records, torn tails, open operations, settling on reopen."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.errors import SessionError
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._runtime.session import AgentSession
from orchestrator._store.journal import Journal, journal_path
from orchestrator._store.journal_records import (
    JournaledOperation,
    JournalRecord,
    operations,
    parse_journal,
)
from orchestrator._store.settle import settle_unfinished_operations


class Clock:
    """A fake epoch-ms clock that ticks 1 ms per reading."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


def drive(journal: Journal, op_id: str, kind: str, events: list[str], **data: object) -> Runner:
    """Run an operation machine through ``events``, journaling every step."""
    runner = Runner(load_machine("operation"))

    def observe(step: Step) -> None:
        journal.record(step, operation_id=op_id, kind=kind, data=data)

    runner.subscribe(observe)
    facts = OperationFacts(has_work=True)
    for event in events:
        runner.fire(event, facts)
    return runner


TO_COMMITTING = ["prepared", "hooks_done", "summary_ready"]


def test_journal_file_sits_beside_the_session_and_is_not_a_jsonl(tmp_path: Path) -> None:
    path = journal_path(tmp_path / "s.jsonl")
    assert path == tmp_path / "s.jsonl.journal"
    assert Journal.open(tmp_path / "s.jsonl").location == str(path)
    assert Journal.in_memory().location == "<memory>"
    assert not path.name.endswith(".jsonl")


def test_each_step_is_one_json_line_with_the_documented_keys(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    journal = Journal.open(session, clock=Clock())
    assert not journal.exists()
    assert journal.records() == ()
    drive(journal, "op-1", "compaction", [*TO_COMMITTING, "entry_appended"], entryId="e1")
    turn = Step(machine="turn", source="idle", event="prompt", dest="running", effects=("a",))
    journal.record(turn)
    lines = journal_path(session).read_text().splitlines()
    assert len(lines) == 5
    first = json.loads(lines[0])
    assert list(first) == [
        "time",
        "machine",
        "operationId",
        "kind",
        "from",
        "event",
        "to",
        "effects",
        "data",
    ]
    assert first == {
        "time": "2023-11-14T22:13:20.001Z",
        "machine": "operation",
        "operationId": "op-1",
        "kind": "compaction",
        "from": "preparing",
        "event": "prepared",
        "to": "consulting_hooks",
        "effects": ["run_hooks"],
        "data": {"entryId": "e1"},
    }
    last = json.loads(lines[-1])
    assert (last["machine"], last["operationId"], last["kind"]) == ("turn", None, None)
    records = journal.records()
    assert [r.dest for r in records] == [
        "consulting_hooks",
        "summarizing",
        "committing",
        "committed",
        "running",
    ]
    assert journal.open_operations() == ()


def same_bytes(folder: Path) -> bool:
    a, b = journal_path(folder / "a.jsonl"), journal_path(folder / "b.jsonl")
    return a.read_bytes() == b.read_bytes() != b""


def test_write_step_writes_the_line_record_writes_and_refuses_the_same(tmp_path: Path) -> None:
    # The drivers journal with write_step (no record object built); the file must not tell.
    step = Step(
        machine="operation",
        source="summarizing",
        event="summary_ready",
        dest="committing",
        effects=("append_entry", "rebuild_context"),
    )
    data = MappingProxyType({"entryId": "e1", "facts": {"more_parts": True}})
    written = Journal.open(tmp_path / "a.jsonl", clock=lambda: 7)
    recorded = Journal.open(tmp_path / "b.jsonl", clock=lambda: 7)
    written.write_step(step, operation_id="op", kind="compaction", data=data)
    record = recorded.record(step, operation_id="op", kind="compaction", data=data)
    assert same_bytes(tmp_path)
    assert written.records() == (record,)
    turn = Step(machine="turn", source="idle", event="prompt", dest="running", effects=())
    written.write_step(turn)
    recorded.record(turn)
    assert same_bytes(tmp_path)
    with pytest.raises(ValueError, match="operation id"):
        written.write_step(step)
    assert len(written.records()) == 2


def test_operation_step_without_an_id_is_refused() -> None:
    journal = Journal.in_memory()
    step = Step(
        machine="operation", source="preparing", event="prepared", dest="skipped", effects=()
    )
    with pytest.raises(ValueError, match="operation id"):
        journal.record(step)
    assert journal.records() == ()


def test_operation_records_are_fsynced_and_turn_records_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal = Journal.open(tmp_path / "s.jsonl")
    journal.record(Step(machine="turn", source="idle", event="prompt", dest="running", effects=()))
    assert synced == []
    drive(journal, "op", "prune", ["prepared"])
    assert len(synced) == 2  # the record, then (first durable record) the directory
    drive(journal, "op2", "prune", ["prepared", "hooks_done"])
    assert len(synced) == 4  # one fsync per operation record from now on


def test_torn_last_line_is_ignored_and_reported(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    journal = Journal.open(session, clock=Clock())
    drive(journal, "op-1", "compaction", ["prepared", "hooks_done"])
    with journal_path(session).open("ab") as file:
        file.write(b'{"time": "2023-11-14T22:1')
    read = journal.read()
    assert len(read.records) == 2
    assert [(p.line, p.code) for p in read.problems] == [(3, "torn_line")]
    # The next record lands on a line of its own; the torn bytes become a skipped middle line.
    ready = Runner(load_machine("operation"), state="summarizing").fire("summary_ready")
    journal.record(ready, operation_id="op-1", kind="compaction")
    read = journal.read()
    assert [r.dest for r in read.records] == ["consulting_hooks", "summarizing", "committing"]
    assert [(p.line, p.code) for p in read.problems] == [(3, "not_json")]


def test_damaged_lines_are_skipped_never_fatal() -> None:
    good: dict[str, object] = {
        "time": "t",
        "machine": "turn",
        "operationId": None,
        "kind": None,
        "from": "a",
        "event": "e",
        "to": "b",
        "effects": [],
        "data": {},
    }
    raw = b"\n".join(
        [
            json.dumps(good).encode(),
            b"[1, 2]",
            json.dumps({**good, "effects": [1]}).encode(),
            b"\xff\xfe",
            b"",
            json.dumps(good).encode(),  # complete but without its newline: still a record
        ]
    )
    read = parse_journal(raw)
    assert len(read.records) == 2
    assert [(p.line, p.code) for p in read.problems] == [
        (2, "not_record"),
        (3, "not_record"),
        (4, "not_json"),
    ]


record_values = st.fixed_dictionaries(
    {
        "time": st.text(max_size=5),
        "machine": st.sampled_from(["turn", "operation", "navigation"]),
        "operationId": st.none() | st.text(min_size=1, max_size=5),  # "" is no id
        "kind": st.none() | st.sampled_from(["compaction", "branch_summary", "prune"]),
        "from": st.text(max_size=5),
        "event": st.text(max_size=5),
        "to": st.text(max_size=5),
        "effects": st.lists(st.text(max_size=5), max_size=3),
        "data": st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3)),
    }
).filter(lambda v: v["machine"] != "operation" or v["operationId"] is not None)  # needs its id


@given(st.lists(record_values, max_size=5), st.binary(max_size=20))
def test_any_torn_tail_keeps_every_whole_record(
    values: list[dict[str, object]], tail: bytes
) -> None:
    lines = b"".join(json.dumps(v).encode() + b"\n" for v in values)
    read = parse_journal(lines + tail.replace(b"\n", b" "))
    assert [r.as_json() for r in read.records[: len(values)]] == values
    assert all(p.line == len(values) + 1 for p in read.problems)


def test_open_operations_report_last_state_and_merged_data() -> None:
    journal = Journal.in_memory(clock=Clock())
    drive(journal, "done", "compaction", [*TO_COMMITTING, "entry_appended"])
    drive(journal, "mid", "branch_summary", ["prepared", "hooks_done"], model="m1")
    drive(journal, "commit", "compaction", ["prepared", "hooks_done"])
    ready = Step(
        machine="operation",
        source="summarizing",
        event="summary_ready",
        dest="committing",
        effects=("append_entry",),
    )
    journal.record(ready, operation_id="commit", data={"entryId": "e9"})
    assert journal.records()[-1].kind is None  # merged kind comes from earlier records
    found = journal.open_operations()
    assert [(o.operation_id, o.kind, o.state) for o in found] == [
        ("mid", "branch_summary", "summarizing"),
        ("commit", "compaction", "committing"),
    ]
    assert found[0].data == {"model": "m1"}
    assert found[0].entry_id is None
    assert found[1].entry_id == "e9"
    assert len(found[1].records) == 3


def test_final_states_come_from_the_operation_table() -> None:
    table = load_machine("operation")
    text = (
        Path(table.source)
        .read_text()
        .replace(
            'final = ["committed", "cancelled", "failed", "skipped"]',
            'final = ["committed", "cancelled", "failed", "skipped"]\n# (same table)',
        )
    )
    from orchestrator._lifecycle.machine import MachineDef

    custom = MachineDef.parse(text)
    journal = Journal.in_memory(operation_machine=custom)
    assert journal.operation_machine is custom
    drive(journal, "x", "compaction", ["prepared"])
    assert [o.state for o in journal.open_operations()] == ["consulting_hooks"]


def test_settle_commits_when_the_planned_entry_is_in_the_session(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "s.jsonl", clock=Clock())
    drive(journal, "op", "compaction", TO_COMMITTING, entryId="e42")
    reopened = Journal.open(tmp_path / "s.jsonl", clock=Clock())
    settled = settle_unfinished_operations(reopened, {"e1", "e42"})
    assert [(s.operation_id, s.kind, s.source, s.dest) for s in settled] == [
        ("op", "compaction", "committing", "committed"),
    ]
    last = reopened.records()[-1]
    assert (last.event, last.dest, dict(last.data)) == (
        "reopened",
        "committed",
        {"settled": True, "applied": True},
    )
    assert reopened.open_operations() == ()
    assert settle_unfinished_operations(reopened, {"e42"}) == []  # settling twice does nothing


def test_settle_fails_a_commit_that_never_landed() -> None:
    journal = Journal.in_memory()
    drive(journal, "op", "compaction", TO_COMMITTING, entryId="e42")
    settled = settle_unfinished_operations(journal, set())
    assert [(s.source, s.dest) for s in settled] == [("committing", "failed")]


def test_settle_cancels_an_operation_caught_before_its_commit() -> None:
    journal = Journal.in_memory()
    drive(journal, "a", "branch_summary", ["prepared", "hooks_done"])
    drive(journal, "b", "compaction", ["prepared"])
    settled = settle_unfinished_operations(journal, {"whatever"})
    assert [(s.operation_id, s.source, s.dest) for s in settled] == [
        ("a", "summarizing", "cancelled"),
        ("b", "consulting_hooks", "cancelled"),
    ]


def test_settle_asks_the_driver_when_the_change_is_not_one_entry() -> None:
    journal = Journal.in_memory()
    drive(journal, "p1", "prune", TO_COMMITTING, entryIds=["x", "y"])
    drive(journal, "p2", "prune", TO_COMMITTING, entryIds=["z"])
    seen: list[JournaledOperation] = []

    def pruned(op: JournaledOperation) -> bool:
        seen.append(op)
        return bool(op.data["entryIds"] == ["x", "y"])

    settled = settle_unfinished_operations(journal, set(), is_applied=pruned)
    assert [(s.operation_id, s.dest) for s in settled] == [("p1", "committed"), ("p2", "failed")]
    assert [op.operation_id for op in seen] == ["p1", "p2"]


def test_record_round_trips_through_json() -> None:
    record = JournalRecord(
        time="t",
        machine="operation",
        operation_id="o",
        kind="prune",
        source="a",
        event="e",
        dest="b",
        effects=("x",),
        data={"k": 1},
    )
    assert JournalRecord.from_json(json.loads(json.dumps(record.as_json()))) == record
    assert JournalRecord.from_json({"time": "t"}) is None


def test_observer_records_each_step_with_its_data() -> None:
    journal = Journal.in_memory()
    runner = Runner(load_machine("operation"))
    planned = {"committing": {"entryId": "e5"}}
    runner.subscribe(
        journal.observer(operation_id="op", kind="compaction", data=lambda s: planned.get(s.dest))
    )
    for event in TO_COMMITTING:
        runner.fire(event, OperationFacts(has_work=True))
    turn = Runner(load_machine("turn"), observers=[journal.observer()])
    turn.fire("user_prompt")
    records = journal.records()
    assert [(r.operation_id, r.kind, dict(r.data)) for r in records] == [
        ("op", "compaction", {}),
        ("op", "compaction", {}),
        ("op", "compaction", {"entryId": "e5"}),
        (None, None, {}),
    ]
    (still_open,) = journal.open_operations()
    assert still_open.entry_id == "e5"


@pytest.mark.anyio
async def test_a_compaction_fsyncs_the_journal_where_settling_needs_it_off_the_loop(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: every step is written at once, but the journal is fsynced only on entering
    committing (before the commit is written), off the loop, and once more when the session
    closes (the final record waits for that, not for an fsync of its own)."""
    loop_thread = threading.get_ident()
    seen: list[tuple[str, bool, str | None, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        on_loop = threading.get_ident() == loop_thread
        last, committed = None, False
        if name.endswith(".journal"):
            operation = operations(Journal.open(example).records())[-1]
            last = operation.state
            committed = f'"id":"{operation.entry_id}"'.encode() in example.read_bytes()
        seen.append((Path(name).name, on_loop, last, committed))
        real(fd)

    opened: list[tuple[str, bool]] = []
    real_open = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_APPEND:  # opened for writing: the journal, the session file
            opened.append((Path(path).name, threading.get_ident() == loop_thread))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "open", open_)
    runtime = AgentSession.open(example, owner="test")
    opened_by_open, opened[:] = opened[:], []
    try:
        outcome = await runtime.compact()
        during = list(seen)
    finally:
        runtime.close()  # makes the last records durable
    assert outcome.status == "committed"
    records = [r for r in Journal.open(example).records() if r.machine == "operation"]
    assert len(records) >= 4  # every step is in the journal
    journal_syncs = [(last, done) for name, _, last, done in during if name.endswith(".journal")]
    # Durable before the commit is written: one, not one per step, and none at the end.
    assert journal_syncs == [("committing", False)]
    # The commit's own fsync follows, after the journal said which entry it writes.
    files = [name for name, _, _, _ in during if name.startswith("session.")]  # not the folder
    assert files == ["session.jsonl.journal", "session.jsonl"]
    assert [name for name, on_loop, _, _ in during if on_loop] == []  # the commit's too
    # The close makes the rest durable, with one fsync.
    closing = [(Path(name).name, last) for name, _, last, _ in seen[len(during) :]]
    assert closing == [("session.jsonl.journal", "committed")]
    # The journal is created, and the session file opened for appending, when the session is
    # opened (a caller's call, not a turn's): the compaction opens nothing.
    assert sorted(name for name, _ in opened_by_open) == ["session.jsonl", "session.jsonl.journal"]
    assert opened == []


@pytest.mark.anyio
async def test_planning_goes_to_a_worker_thread_only_to_build_the_context(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: with the live context a plan is O(kept), cheaper than the hop to a thread and
    back, so it runs on the loop; a context build (O(entries)) runs in a thread. Opening
    builds the context; moving the leaf makes the next plan build one."""
    from orchestrator._core.compaction_plan import plan_compaction

    loop_thread = threading.get_ident()
    planned_on_loop: list[bool] = []

    def plan(*args: Any, **kwargs: Any) -> object:
        planned_on_loop.append(threading.get_ident() == loop_thread)
        return plan_compaction(*args, **kwargs)

    monkeypatch.setattr("orchestrator._runtime.operation.jobs.plan_compaction", plan)
    runtime = AgentSession.open(example, owner="test")
    try:
        assert runtime.session.context_is_live  # built at open
        await runtime.compact(dry_run=True)  # the live context: planned on the loop
        leaf = runtime.session.leaf_id
        assert leaf is not None
        runtime.session.tree.branch(runtime.session.tree.get(leaf)["parentId"])
        assert not runtime.session.context_is_live
        await runtime.compact(dry_run=True)  # the context is built in a worker thread
        assert runtime.session.context_is_live
        await runtime.compact(dry_run=True)  # live again: on the loop
    finally:
        runtime.close()
    assert planned_on_loop == [True, False, True]


def open_journals() -> list[str]:
    """The journal files this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor, closed since
            continue
    return [name for name in names if name.endswith(".journal")]


@pytest.mark.anyio
async def test_the_runtime_opens_the_journal_with_the_session_and_removes_it_empty_at_close(
    example: Path,
) -> None:
    """Issue 9: a runtime's session is ready to write once opened (the journal created, the
    store open for appending); a journal nothing was recorded in does not outlive the session,
    and one with records stays."""
    path = journal_path(example)
    runtime = AgentSession.open(example, owner="test")
    assert path.exists()
    assert path.read_bytes() == b""
    assert runtime.ports.journal is not None
    assert runtime.ports.journal.is_open
    assert runtime.session.ready_to_write
    runtime.close()
    assert not path.exists()  # only opened: gone

    runtime = AgentSession.open(example, owner="test")
    try:
        assert (await runtime.compact()).status == "committed"
    finally:
        runtime.close()
    recorded = path.read_bytes()
    assert recorded.count(b"\n") >= 4
    AgentSession.open(example, owner="test").close()  # opened again, nothing recorded
    assert path.read_bytes() == recorded  # the records stay


def test_an_opening_that_fails_after_the_journal_was_created_leaves_no_journal(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: the store refusing to open for writing undoes the journal the opening made."""
    from orchestrator._store.session import Session

    def refuse(self: Session) -> None:
        raise SessionError(f"{example}: cannot open for writing")

    monkeypatch.setattr(Session, "open_writer", refuse)
    with pytest.raises(SessionError, match="cannot open for writing"):
        AgentSession.open(example, owner="test")
    assert not journal_path(example).exists()
    monkeypatch.undo()
    AgentSession.open(example, owner="test").close()  # the lock was given back


@pytest.mark.anyio
async def test_the_journal_file_stays_open_between_records_until_the_session_closes(
    example: Path,
) -> None:
    """Issue 9: a record is one write to the open file, not an open, write and close."""
    # Only this test's journal counts: a journal another test left to the garbage collector
    # (one held by a reference cycle) may still be open while this one runs.
    mine = str(journal_path(example))
    runtime = AgentSession.open(example, owner="test")
    try:
        await runtime.compact()
        assert [name for name in open_journals() if name == mine] == [mine]
    finally:
        runtime.close()
    assert mine not in open_journals()
    journal = Journal.open(example)
    journal.close()  # nothing written yet: nothing to close
    drive(journal, "op", "prune", ["prepared"])
    journal.close()
    journal.close()
    drive(journal, "op2", "prune", ["prepared"])  # opened again at the next record
    assert len(journal.records()) == len(Journal.open(example).records())
    journal.close()
    Journal.in_memory().close()


def test_a_journal_whose_sink_cannot_close_closes_as_a_no_op() -> None:
    class Sink:
        location = "<elsewhere>"

        def exists(self) -> bool:
            return False

        def read(self) -> bytes:
            return b""

        def append(self, line: bytes, *, durable: bool) -> None:
            pass

        def sync(self) -> None:
            pass

        is_open = True

        def open(self) -> None:
            pass

    journal = Journal(Sink())
    journal.open_file()  # nothing to open either
    assert journal.is_open
    journal.close()


def test_sync_of_a_journal_not_written_yet_does_nothing_and_refuses_what_is_no_file(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s.jsonl"
    Journal.open(session).sync()  # nothing journaled: nothing to sync, nothing created
    assert not journal_path(session).exists()
    os.mkfifo(journal_path(session))  # a pipe is refused at once, not waited on
    with pytest.raises(SessionError, match="not a regular file"):
        Journal.open(session).sync()
    journal_path(session).unlink()
    journal_path(session).symlink_to(tmp_path / "elsewhere")  # dangling: refused too
    with pytest.raises(SessionError):
        Journal.open(session).sync()


def test_an_owned_journal_checks_for_a_torn_line_once_per_opening(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: while the session is owned nobody else appends (D27), so a record is one
    write; after closing, others may write, and the first record looks at the end again."""
    path = journal_path(example)
    journal = Journal.open(example, exclusive=True)
    fstats: list[int] = []
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        fstats.append(fd)
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", fstat)
    drive(journal, "op", "compaction", ["prepared", "hooks_done"])
    assert len(fstats) == 2  # opening (a regular file?) and the first record: not the second
    journal.close()
    with path.open("ab") as torn:
        torn.write(b'{"torn":')  # a process killed mid-write, while nobody owned the session
    fstats.clear()
    drive(journal, "op2", "prune", ["prepared"])
    assert len(fstats) >= 1
    records = journal.records()
    assert [r.operation_id for r in records] == ["op", "op", "op2"]  # the torn line kept apart
    journal.close()


def test_syncing_an_open_journal_uses_its_descriptor(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: one fsync on the open descriptor, not an open, a check, an fsync and a close;
    a close waits for a sync running in another thread."""
    journal = Journal.open(example, exclusive=True)
    drive(journal, "op", "compaction", ["prepared"])
    opened: list[str] = []
    real_open = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    journal.sync()
    assert [name for name in opened if name.endswith(".journal")] == []
    journal.close()
    journal.sync()  # closed: the file is opened for the sync, as before the first record
    assert [name for name in opened if name.endswith(".journal")] == [str(journal.location)]


def test_closing_a_journal_waits_for_a_sync_in_another_thread(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal.open(example, exclusive=True)
    drive(journal, "op", "compaction", ["prepared"])
    syncing, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        syncing.set()
        release.wait(10)
        real_fsync(fd)  # still this journal's descriptor: the close has not run

    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncer = threading.Thread(target=journal.sync)
    syncer.start()
    assert syncing.wait(10)
    closer = threading.Thread(target=journal.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # waiting for the sync, not closing the descriptor under it
    release.set()
    syncer.join(10)
    closer.join(10)
    assert not closer.is_alive()


def test_a_record_line_is_strict_json_even_for_a_value_json_dumps_would_write_as_nan(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s.jsonl"
    journal = Journal.open(session, clock=Clock())
    step = Step(machine="turn", source="idle", event="user_prompt", dest="running", effects=())
    journal.record(step, data={"ratio": float("nan"), "big": 1e16, "text": "é\n\u2028"})

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    line = journal_path(session).read_bytes().split(b"\n")[0]  # U+2028 stays raw in the line
    record = json.loads(line, parse_constant=refuse)
    assert record["data"] == {"ratio": None, "big": 1e16, "text": "é\n\u2028"}
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate is refused, nothing written
        journal.record(step, data={"text": "\ud800"})
    assert journal_path(session).read_bytes().count(b"\n") == 1
