"""A journal written by someone else: unknown states, bad ids, hostile text (D3, D24)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from orchestrator._core.printable import printable
from orchestrator._lifecycle.machine import Step
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Dispatcher
from orchestrator._runtime.events import EventBus
from orchestrator._runtime.session import AgentSession
from orchestrator._store import owner
from orchestrator._store.journal import Journal, journal_path
from orchestrator._store.owner import Holder, OwnerLock, current_owner, lock_path
from orchestrator._store.settle import settle_unfinished_operations
from tests.cli_kit import run


def record(op_id: object = "op1", to: str = "bogus_state", **data: object) -> str:
    """One operation record as a line of the journal, as another program might write it."""
    value = {
        "time": "2026-12-04T00:00:00.000Z",
        "machine": "operation",
        "operationId": op_id,
        "kind": "compaction",
        "from": "preparing",
        "event": "e",
        "to": to,
        "effects": [],
        "data": data,
    }
    return json.dumps(value) + "\n"


def left_in(state: str, **data: object) -> Journal:
    journal = Journal.in_memory()
    step = Step(machine="operation", source="preparing", event="e", dest=state, effects=())
    journal.record(step, operation_id="op", kind="compaction", data=data)
    return journal


@pytest.mark.parametrize("state", ["mystery", "idle"])
def test_a_state_the_table_does_not_know_is_settled_as_a_commit_that_did_not_land(
    state: str,
) -> None:
    journal = left_in(state)
    settled = settle_unfinished_operations(journal, set())
    assert [(s.operation_id, s.source, s.dest) for s in settled] == [("op", state, "failed")]
    assert settled[0].note == (
        f"its last state {state!r} is not one the operation table can settle, "
        "so it was settled as one left in committing"
    )
    last = journal.records()[-1]
    assert (last.source, last.event, last.dest) == (state, "reopened", "failed")
    assert last.data == {"settled": True, "applied": False, "note": settled[0].note}
    assert journal.open_operations() == ()


def test_a_state_the_table_does_not_know_is_committed_when_its_entry_is_in_the_file() -> None:
    """Its commit may have landed: it is looked up as for committing, never called cancelled."""
    journal = left_in("mystery", entryId="e42")
    settled = settle_unfinished_operations(journal, {"e42"})
    assert [(s.source, s.dest) for s in settled] == [("mystery", "committed")]


def test_a_known_state_is_settled_by_its_own_row_without_a_note() -> None:
    settled = settle_unfinished_operations(left_in("summarizing"), set())
    assert [(s.dest, s.note) for s in settled] == [("cancelled", None)]


@pytest.mark.parametrize("state", ["bogus_state", "idle"])
def test_an_unknown_state_no_longer_locks_the_session_out(
    example: Path, capsys: pytest.CaptureFixture[str], state: str
) -> None:
    journal_path(example).write_text(record(to=state))
    code, out, _ = run(capsys, "journal", str(example))
    assert code == 0
    assert out.splitlines()[2] == (
        f"  => OPEN in {state}: not a state the operation table can settle; it will be settled "
        "as one left in committing (committed if its change is in the session, else failed) "
        "when the session is next opened"
    )
    code, _, err = run(capsys, "compact", str(example))
    assert code == 0, err
    assert (
        "note: operation op1 (compaction) left half-done by an earlier process was settled as "
        f"failed (its last state {state!r} is not one the operation table can settle, so it was "
        "settled as one left in committing)\n"
    ) in err
    code, out, err = run(capsys, "compact", str(example))  # settled once, for good
    assert (code, "note:" in err) == (0, False)
    assert "Already compacted" in out


def test_an_agent_session_opens_over_an_unknown_state(example: Path) -> None:
    journal_path(example).write_text(record())
    runtime = AgentSession.open(example, owner="test")
    try:
        assert [(s.source, s.dest) for s in runtime.settlements] == [("bogus_state", "failed")]
    finally:
        runtime.close()


UNKNOWN_STATE_NOTE = (
    "its last state 'bogus_state' is not one the operation table can settle, so it was settled "
    "as one left in committing"
)
SETTLED: list[dict[str, object]] = [
    {
        "id": "op1",
        "kind": "compaction",
        "source": "bogus_state",
        "dest": "failed",
        "note": UNKNOWN_STATE_NOTE,
    },
    {"id": "op2", "kind": "compaction", "source": "summarizing", "dest": "cancelled", "note": None},
]
"""How a journal left with op1 in a state no table knows and op2 summarizing is settled."""


def test_a_listener_given_to_open_hears_each_settlement_with_its_note(example: Path) -> None:
    """``operation_settled`` is emitted while opening: a bus passed to ``open`` hears it (a
    listener subscribed afterwards never could)."""
    journal_path(example).write_text(record(op_id="op1") + record(op_id="op2", to="summarizing"))
    bus = EventBus()
    heard: list[dict[str, object]] = []
    bus.subscribe(lambda event: heard.append(event.as_json()))
    runtime = AgentSession.open(example, owner="test", events=bus)
    try:
        assert runtime.events is bus
        settled = [e for e in heard if e["type"] == "operation_settled"]
        assert settled == [{"type": "operation_settled", **each} for each in SETTLED]
    finally:
        runtime.close()


def test_an_rpc_client_opening_the_session_learns_each_settlement_and_why(
    example: Path,
) -> None:
    journal_path(example).write_text(record(op_id="op1") + record(op_id="op2", to="summarizing"))
    hub = SessionHub(RuntimeOptions(root=example.parent))
    params = {"path": example.name}
    request = {"jsonrpc": "2.0", "id": 1, "method": "session.open", "params": params}
    reply = anyio.run(Dispatcher(hub.methods()).handle, request)
    assert isinstance(reply, dict)
    try:
        assert reply["result"]["settled"] == SETTLED
    finally:
        hub.close_all()


@pytest.mark.parametrize("op_id", ["", None])
def test_an_operation_step_without_an_id_is_not_a_record(
    example: Path, capsys: pytest.CaptureFixture[str], op_id: str | None
) -> None:
    path = journal_path(example)
    path.write_text(record(op_id=op_id, to="summarizing") + record(op_id="op2", to="summarizing"))
    read = Journal.open(example).read()
    assert [r.operation_id for r in read.records] == ["op2"]
    assert [(p.line, p.code) for p in read.problems] == [(1, "not_record")]
    code, out, err = run(capsys, "journal", str(example))
    assert code == 0
    assert "operation[]" not in out
    assert "turn and navigation" not in out  # a null id was listed with the turn's steps
    assert f"warning: {path}: line 1: not a journal record; skipped" in err
    code, _, err = run(capsys, "compact", str(example))
    assert code == 0, err
    assert "note: operation op2 (compaction)" in err
    assert "operation  (" not in err


def open_summary(example: Path) -> None:
    """The journal of a compaction in progress: left in summarizing, entry e9 planned."""
    journal_path(example).write_text(record(to="summarizing", entryId="e9"))


def test_an_open_operation_of_a_live_owner_is_in_progress(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_summary(example)
    lock = OwnerLock(example)
    lock.acquire("orchestrator compact")
    try:
        code, out, _ = run(capsys, "journal", str(example))
        assert code == 0
        assert out.splitlines()[2] == (
            f"  => OPEN in summarizing, entry e9 planned: in progress, by pid {os.getpid()} "
            "(orchestrator compact)"
        )
        code, out, _ = run(capsys, "journal", str(example), "--json")
        report = json.loads(out)
        assert report["owner"] == {"pid": os.getpid(), "name": "orchestrator compact"}
        assert report["operations"][0]["open"] is True
        assert lock.held
    finally:
        lock.release()
    code, out, _ = run(capsys, "journal", str(example), "--json")
    assert json.loads(out)["owner"] is None
    assert not lock_path(example).exists()  # looking created no lock file


def test_a_lock_file_left_by_a_dead_owner_is_no_owner(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed owner leaves its lock file, named after a live pid (ours), but not its lock."""
    open_summary(example)
    lock_path(example).write_text(f"{os.getpid()} orchestrator compact\n")
    code, out, _ = run(capsys, "journal", str(example))
    assert out.splitlines()[2] == (
        "  => OPEN in summarizing, entry e9 planned: it will be settled when the session is next "
        "opened"
    )
    assert current_owner(example) is None


def test_without_the_kernel_lock_table_a_live_pid_stands_in(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner, "_KERNEL_LOCKS", example.parent / "no-such-table")
    lock_path(example).write_text(f"{os.getpid()} orchestrator compact\n")
    assert current_owner(example) == Holder(os.getpid(), "orchestrator compact")
    lock_path(example).write_text("0 orchestrator compact\n")
    assert current_owner(example) is None
    lock_path(example).write_text("999999999999999999999 orchestrator compact\n")
    assert current_owner(example) is None


def test_a_hostile_lock_file_is_shown_escaped_in_one_line(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = OwnerLock(example)
    lock.acquire("orchestrator compact")
    try:
        lock_path(example).write_text("123 evil\nsecond line \x1b[31mRED\n")
        code, _, err = run(capsys, "compact", str(example))
        assert code == 1
        assert err == (
            f"orchestrator compact: {example}: session is being changed by pid 123 "
            "(evil\\nsecond line \\x1b[31mRED)\n"
        )
    finally:
        lock.release()


def test_hostile_journal_text_is_shown_escaped(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal_path(example).write_text(record(op_id="op\n1\x1b[2J", to="summarizing\x07"))
    code, out, _ = run(capsys, "journal", str(example))
    assert code == 0
    assert not {"\x1b", "\x07"} & set(out)
    assert out.splitlines()[:3] == [
        "operation op\\n1\\x1b[2J (compaction)",
        "  00:00:00.000 operation[op\\n1\\x1b[2J] preparing --e--> summarizing\\x07",
        "  => OPEN in summarizing\\x07: not a state the operation table can settle; it will be "
        "settled as one left in committing (committed if its change is in the session, else "
        "failed) when the session is next opened",
    ]
    code, _, err = run(capsys, "compact", str(example))
    assert code == 0, err
    assert (
        "note: operation op\\n1\\x1b[2J (compaction) left half-done by an earlier process was "
        "settled as failed (its last state 'summarizing\\x07' is not one the operation table "
        "can settle, so it was settled as one left in committing)\n"
    ) in err
    assert not {"\x1b", "\x07"} & set(err)


def test_printable_escapes_what_would_break_a_line_and_keeps_the_rest() -> None:
    assert printable("a\nb\x1b[31m\t\x7f\u2028\u200b\ud800") == (
        "a\\nb\\x1b[31m\\t\\x7f\\u2028\\u200b\\ud800"
    )
    assert printable("plain é 日本 \\n") == "plain é 日本 \\n"
