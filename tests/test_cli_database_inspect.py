"""Inspection commands on a session stored in PostgreSQL: ``--database URL`` with its id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator._lifecycle.machine import Step
from orchestrator._store.journal import Journal
from orchestrator._store.postgres_journal import postgres_journal
from tests.cli_kit import EXAMPLE, run

SESSION_ID = str(json.loads(EXAMPLE.read_bytes().split(b"\n", 1)[0])["id"])


@pytest.fixture
def stored(capsys: pytest.CaptureFixture[str], pg_url: str) -> str:
    """``pg_url`` holding the example session (imported as pi wrote it)."""
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    return pg_url


@pytest.mark.parametrize(
    "command",
    [("context", "--json"), ("context",), ("tree", "--json"), ("tree",), ("check", "--json")],
    ids=" ".join,
)
def test_a_stored_session_reads_as_its_file_does(
    capsys: pytest.CaptureFixture[str], stored: str, command: tuple[str, ...]
) -> None:
    name, *rest = command
    from_file = run(capsys, name, str(EXAMPLE), *rest)
    from_database = run(capsys, name, SESSION_ID, "--database", stored, *rest)
    assert from_database == from_file
    assert from_file[0] == 0


def test_check_names_the_session_id(capsys: pytest.CaptureFixture[str], stored: str) -> None:
    code, out, err = run(capsys, "check", SESSION_ID, "--database", stored)
    assert (code, err) == (0, "")
    assert out.startswith(f"{SESSION_ID}: ok, ")


def test_context_at_a_leaf_of_a_stored_session(
    capsys: pytest.CaptureFixture[str], stored: str
) -> None:
    argv = ("context", "--leaf", "8a8042be", "--json")
    assert run(capsys, argv[0], SESSION_ID, "--database", stored, *argv[1:]) == run(
        capsys, argv[0], str(EXAMPLE), *argv[1:]
    )


def _steps(journal: Journal) -> None:
    journal.record(Step(machine="turn", source="idle", event="prompt", dest="running", effects=()))
    journal.record(
        Step(machine="operation", source="idle", event="start", dest="planning", effects=()),
        operation_id="op-1",
        kind="compaction",
        data={"entryId": "e1"},
    )


def test_the_journal_of_a_stored_session_reads_as_a_file_journal(
    capsys: pytest.CaptureFixture[str], stored: str, tmp_path: Path
) -> None:
    path = tmp_path / "example.jsonl"
    path.write_bytes(EXAMPLE.read_bytes())
    _steps(Journal.open(path, clock=lambda: 0))
    _steps(postgres_journal(stored, SESSION_ID, clock=lambda: 0))
    from_file = run(capsys, "journal", str(path))
    from_database = run(capsys, "journal", SESSION_ID, "--database", stored)
    assert from_database == from_file
    assert "OPEN in planning" in from_file[1]
    code, out, _ = run(capsys, "journal", SESSION_ID, "--database", stored, "--json")
    assert code == 0
    assert [op["operationId"] for op in json.loads(out)["operations"]] == ["op-1"]


def test_a_stored_session_without_a_journal_says_so(
    capsys: pytest.CaptureFixture[str], stored: str
) -> None:
    code, out, err = run(capsys, "journal", SESSION_ID, "--database", stored)
    assert (code, err) == (0, "")
    assert out.startswith("-- no journal at ")
    assert out.endswith(": nothing was journaled\n")
    code, out, err = run(capsys, "journal", SESSION_ID, "--database", stored, "--json")
    assert (code, err) == (0, "")
    assert (json.loads(out)["records"], json.loads(out)["operations"]) == ([], [])


@pytest.mark.parametrize("command", ["context", "tree", "check", "journal"])
def test_an_unknown_session_id_is_one_line(
    capsys: pytest.CaptureFixture[str], pg_url: str, command: str
) -> None:
    code, out, err = run(capsys, command, "no-such-id", "--database", pg_url)
    assert (code, out) == (1, "")
    assert err.startswith(f"orchestrator {command}: ")
    assert "no such session in the database" in err
    assert "orchestrator:orchestrator@" not in err  # no password in what is printed
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["context", "tree", "check", "journal"])
def test_a_database_option_that_is_no_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: str, tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(capsys, command, SESSION_ID, "--database", str(tmp_path / "db.sqlite"))
    assert exited.value.code == 2
    assert "is not a PostgreSQL URL" in capsys.readouterr().err
