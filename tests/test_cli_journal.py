"""The ``orchestrator journal`` command: readable history, JSON form, open operations, errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from orchestrator._cli.journal import register, transition_line
from orchestrator._core.errors import SessionError
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._store.journal import Journal, journal_path
from orchestrator._store.journal_records import JournalRecord
from orchestrator._store.settle import settle_unfinished_operations

START = 1_700_000_000_000  # 2023-11-14T22:13:20.000Z


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="orchestrator")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["journal", *argv])
    code = args.handler(args)
    out, err = capsys.readouterr()
    return int(code), out, err


def operation(journal: Journal, op_id: str, kind: str, events: list[str], **data: object) -> None:
    runner = Runner(load_machine("operation"))

    def observe(step: Step) -> None:
        journal.record(step, operation_id=op_id, kind=kind, data=data)

    runner.subscribe(observe)
    for event in events:
        runner.fire(event, OperationFacts(has_work=True))


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """A journal with turn steps, a committed compaction, a settled prune and an open summary."""
    ticks = iter(range(START, START + 100_000, 250))
    path = tmp_path / "s.jsonl"
    journal = Journal.open(path, clock=lambda: next(ticks))
    turn = Step(
        machine="turn",
        source="idle",
        event="user_prompt",
        dest="running",
        effects=("start_turn", "call_agent"),
    )
    journal.record(turn)
    operation(
        journal,
        "op-1",
        "compaction",
        ["prepared", "hooks_done", "summary_ready", "entry_appended"],
        entryId="e1",
    )
    operation(journal, "op-2", "prune", ["prepared"])
    settle_unfinished_operations(journal, {"e1"})
    operation(
        journal, "op-3", "branch_summary", ["prepared", "hooks_done", "summary_ready"], entryId="e9"
    )
    journal.record(Step(machine="navigation", source="idle", event="x", dest="y", effects=()))
    return path


def test_text_history_is_grouped_by_operation_with_outcomes(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, str(session))
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[:5] == [
        "turn and navigation",
        "  22:13:20.000 turn idle --user_prompt--> running  (start_turn, call_agent)",
        "  22:13:22.500 navigation idle --x--> y",
        # Runs that stop short of rest, with no owner alive: their process ended there.
        "  -- turn left in running: its process ended there",
        "  -- navigation left in y: its process ended there",
    ]
    lines = lines[:3] + lines[5:]
    assert lines[3:9] == [
        "operation op-1 (compaction)",
        "  22:13:20.250 operation[op-1] preparing --prepared--> consulting_hooks  (run_hooks)",
        "  22:13:20.500 operation[op-1] consulting_hooks --hooks_done--> summarizing  (call_model)",
        "  22:13:20.750 operation[op-1] summarizing --summary_ready--> committing  (append_entry)",
        "  22:13:21.000 operation[op-1] committing --entry_appended--> committed"
        "  (rebuild_context, emit_result)",
        "  => committed",
    ]
    assert lines[9:13] == [
        "operation op-2 (prune)",
        "  22:13:21.250 operation[op-2] preparing --prepared--> consulting_hooks  (run_hooks)",
        "  22:13:21.500 operation[op-2] consulting_hooks --reopened--> cancelled",
        "  => cancelled (settled on reopen)",
    ]
    assert lines[13] == "operation op-3 (branch_summary)"
    assert lines[-2] == (
        "  => OPEN in committing, entry e9 planned: "
        "it will be settled when the session is next opened"
    )
    assert lines[-1] == "-- 11 transitions, 3 operations (1 open)"


def test_one_operation_and_the_journal_path_itself(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, str(journal_path(session)), "--operation", "op-2")
    assert code == 0
    assert out.splitlines()[0] == "operation op-2 (prune)"
    assert "turn and navigation" not in out
    assert "transitions," not in out


def test_json_form(session: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(session), "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"journal", "records", "operations", "problems", "owner"}
    assert report["journal"] == str(journal_path(session))
    assert len(report["records"]) == 11
    assert report["records"][0]["machine"] == "turn"
    assert [
        (o["operationId"], o["kind"], o["state"], o["open"], o["settled"], o["records"])
        for o in report["operations"]
    ] == [
        ("op-1", "compaction", "committed", False, False, 4),
        ("op-2", "prune", "cancelled", False, True, 2),
        ("op-3", "branch_summary", "committing", True, False, 3),
    ]
    assert report["operations"][2]["data"] == {"entryId": "e9"}
    assert report["problems"] == []


def test_json_form_of_one_operation(session: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, str(session), "--json", "--operation", "op-3")
    report = json.loads(out)
    assert {r["operationId"] for r in report["records"]} == {"op-3"}
    assert [o["operationId"] for o in report["operations"]] == ["op-3"]


def test_torn_tail_is_a_warning_not_a_failure(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with journal_path(session).open("ab") as file:
        file.write(b'{"time": "20')
    code, out, err = run(capsys, str(session), "--json")
    assert code == 0
    assert (
        err == f"warning: {journal_path(session)}: line 12: the last line is torn "
        "(a crash mid-write); ignored\n"
    )
    assert json.loads(out)["problems"] == [
        {
            "line": 12,
            "code": "torn_line",
            "message": "the last line is torn (a crash mid-write); ignored",
        },
    ]


def test_a_session_without_a_journal_has_an_empty_one(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Opening and closing a session leaves no journal: that is no error, in either form."""
    code, out, err = run(capsys, str(example), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "journal": f"{example}.journal",
        "records": [],
        "operations": [],
        "problems": [],
        "owner": None,
    }
    code, out, err = run(capsys, str(example))
    assert (code, err) == (0, "")
    assert out == f"-- no journal at {example}.journal: nothing was journaled\n"
    assert not journal_path(example).exists()  # looking made none


def test_a_missing_session_is_still_an_error(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["journal", str(tmp_path / "none.jsonl"), "--json"])
    with pytest.raises(SessionError, match="none.jsonl: no such session file"):
        args.handler(args)


def test_unknown_operation_is_an_error(session: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["journal", str(session), "--operation", "nope"])
    with pytest.raises(SessionError, match="operation nope is not in"):
        args.handler(args)


def test_transition_line_keeps_an_unusual_time_as_is() -> None:
    record = JournalRecord(time="yesterday", machine="turn", source="a", event="e", dest="b")
    assert transition_line(record) == "yesterday turn a --e--> b"


def test_unknown_kind_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = Journal.open(tmp_path / "s.jsonl")
    journal.record(
        Step(machine="operation", source="preparing", event="prepared", dest="skipped", effects=()),
        operation_id="op",
    )
    _, out, _ = run(capsys, str(tmp_path / "s.jsonl"))
    assert out.splitlines()[0] == "operation op (unknown kind)"


def test_the_summary_line_counts_in_the_singular_for_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text("")
    journal = Journal.open(path)
    operation(journal, "op-1", "compaction", ["prepared"])
    code, out, _ = run(capsys, str(path))
    assert code == 0
    assert out.splitlines()[-1] == "-- 1 transition, 1 operation (1 open)"


def test_a_run_a_killed_process_left_mid_way_is_marked_where_the_next_begins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A navigation killed while summarizing, then the next navigation: the records showed the
    # first stopping in `summarizing` and the second starting from `idle`, unmarked.
    ticks = iter(range(START, START + 100_000, 250))
    path = tmp_path / "s.jsonl"
    journal = Journal.open(path, clock=lambda: next(ticks))
    for source, event, dest in [
        ("idle", "navigate", "collecting"),
        ("collecting", "collected", "consulting_hooks"),
        ("consulting_hooks", "hooks_done", "summarizing"),
        ("idle", "navigate", "collecting"),
        ("collecting", "collected", "consulting_hooks"),
        ("consulting_hooks", "hooks_done", "switching_leaf"),
        ("switching_leaf", "switched", "done"),
    ]:
        journal.record(
            Step(machine="navigation", source=source, event=event, dest=dest, effects=())
        )
    code, out, _ = run(capsys, str(path))
    assert code == 0
    lines = out.splitlines()
    marker = "  -- navigation left in summarizing: its process ended there"
    assert lines.index(marker) == 4  # after the third record, before the next run's first
    assert lines.count(marker) == 1
    assert not any("left in done" in line for line in lines)
