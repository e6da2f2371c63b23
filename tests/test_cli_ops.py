"""compact, navigate and fork from the command line: offline, and through litellm's real HTTP
path against the local provider."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator._cli.main import main
from orchestrator._store.session import Session
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import EXAMPLE, either_part, model_args, run


def test_compact_offline_appends_an_entry_pi_can_read(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "compact", str(example))
    assert code == 0, err
    assert out.startswith("_Extractive summary generated offline (no model was called)._")
    assert "-- compacted:" in out
    assert "tokens before 66900" in out
    session = Session.open(example)
    entry = session.tree.entries[-1]
    assert entry["type"] == "compaction"
    assert entry["details"]["modifiedFiles"] == [
        "invoice/tax.py",
        "invoice/totals.py",
        "tests/test_tax_rounding.py",
    ]
    context = session.context()
    assert context.messages[0]["role"] == "compactionSummary"
    kept = session.tree.path()
    ids = [e["id"] for e in kept]
    first_kept = ids.index(entry["firstKeptEntryId"])
    assert context.entry_ids[1] == entry["firstKeptEntryId"] or first_kept < len(ids)
    assert session.problems == []
    code, out, _ = run(capsys, "check", str(example))
    assert code == 0


def test_compact_dry_run_and_json_write_nothing(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    code, out, _ = run(capsys, "compact", str(example), "--dry-run", "--json", "--focus", "VAT")
    assert code == 0
    report = json.loads(out)
    assert report["compacted"] is False
    assert report["reason"] is None
    assert report["summary"]
    assert report["tokensBefore"] == 66900
    assert report["tokensAfter"] < report["tokensBefore"]
    assert example.read_bytes() == before


def test_compact_twice_says_already_compacted(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "compact", str(example))[0] == 0
    code, out, _ = run(capsys, "compact", str(example))
    assert (code, out.strip()) == (0, "Already compacted")


def test_compact_through_litellm_and_the_local_provider(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replies = (
        Reply.summary(either_part("From the provider (history).")),
        Reply.summary(either_part("From the provider (prefix).")),
    )
    with LocalProvider(replies) as provider:
        code, out, err = run(
            capsys,
            "compact",
            str(example),
            *model_args(provider.url),
            "--context-window",
            "128000",
        )
        requests = provider.requests
    assert code == 0, err
    assert len(requests) == 2  # a split turn: history and turn prefix, one HTTP call each
    assert {r.body["max_tokens"] for r in requests} == {13107, 8192}
    assert "From the provider" in Session.open(example).tree.entries[-1]["summary"]


def test_provider_failure_is_one_line_and_the_file_is_unchanged(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    with LocalProvider((Reply.error(401, "invalid api key"),) * 4) as provider:
        code, out, err = run(
            capsys,
            "compact",
            str(example),
            *model_args(provider.url, "bad"),
        )
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("orchestrator compact: ")
    assert "invalid api key" in err
    assert example.read_bytes() == before


def test_navigate_with_summary_attaches_it_and_prints_the_editor_text(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    users = [e for e in lines if e["type"] == "message" and e["message"]["role"] == "user"]
    target = users[-1]  # "Keep Decimal. ..." on the active branch
    code, out, err = run(capsys, "navigate", str(example), "--to", target["id"], "--summarize")
    assert code == 0, err
    assert "-- editor text (edit and resend it):" in out
    assert "Keep Decimal." in out
    session = Session.open(example)
    summary = session.tree.entries[-1]
    assert summary["type"] == "branch_summary"
    assert summary["parentId"] == target["parentId"]
    assert summary["fromId"] == lines[-1]["id"]  # D17: the abandoned leaf
    assert session.leaf_id == summary["id"]


def test_navigate_without_summary_is_remembered_across_processes(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    assistant = next(
        e for e in lines if e["type"] == "message" and e["message"]["role"] == "assistant"
    )
    code, out, _ = run(capsys, "navigate", str(example), "--to", assistant["id"], "--json")
    assert code == 0
    assert json.loads(out)["newLeafId"] == assistant["id"]
    reopened = Session.open(example)
    assert reopened.context().entry_ids[-1] == assistant["id"]
    assert reopened.tree.entries[-1]["customType"] == "orchestrator/leaf"


@pytest.mark.parametrize("role", ["assistant", "user"])
def test_navigating_twice_to_the_same_entry_writes_one_marker(
    role: str, example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    target = next(e for e in lines if e["type"] == "message" and e["message"]["role"] == role)
    assert run(capsys, "navigate", str(example), "--to", target["id"])[0] == 0
    once = example.read_bytes()
    assert run(capsys, "navigate", str(example), "--to", target["id"])[0] == 0
    assert example.read_bytes() == once
    reopened = Session.open(example)
    markers = [e for e in reopened.tree.entries if e.get("customType") == "orchestrator/leaf"]
    assert len(markers) == 1
    expected = target["id"] if role == "assistant" else target["parentId"]
    assert reopened.leaf_id == markers[0]["id"]
    assert markers[0]["parentId"] == expected


def test_navigate_to_an_unknown_entry(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = example.read_bytes()
    code, _, err = run(capsys, "navigate", str(example), "--to", "nope")
    assert (code, err.strip()) == (1, f"orchestrator navigate: {example}: entry 'nope' not found")
    assert example.read_bytes() == before


def test_fork_writes_the_path_before_a_user_message(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    users = [e for e in lines if e["type"] == "message" and e["message"]["role"] == "user"]
    code, out, err = run(capsys, "fork", str(example), "--from", users[2]["id"], "--json")
    assert code == 0, err
    report = json.loads(out)
    forked = Session.open(report["sessionFile"])
    assert forked.header["parentSession"] == str(example.absolute())
    # The path's label is carried over as a fresh label entry at the end.
    assert forked.tree.entries[-1]["type"] == "label"
    assert forked.tree.labels == {users[1]["id"]: "tax investigation"}
    assert [e for e in forked.tree.entries if e["type"] == "label"] == [forked.tree.entries[-1]]
    assert report["editorText"].startswith("Now add a regression test")
    code, _, err = run(capsys, "fork", str(example), "--from", lines[-1]["id"])
    assert (code, err.strip()) == (
        1,
        f"orchestrator fork: Invalid entry ID for forking: {lines[-1]['id']} is a label "
        "entry; a fork starts before a user message",
    )


def test_compact_is_journaled_and_traced(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "spans"
    code, _, err = run(capsys, "compact", str(example), "--trace", f"jsonl:{traces}")
    assert code == 0, err
    code, out, _ = run(capsys, "journal", str(example), "--json")
    assert code == 0
    report = json.loads(out)
    [operation] = report["operations"]
    assert operation["kind"] == "compaction"
    assert operation["state"] == "committed"
    from orchestrator._telemetry.export import read_trace

    [trace] = list(traces.glob("*.jsonl"))
    names = [span["name"] for span in read_trace(trace)]
    assert "orchestrator.compaction" in names
    assert "orchestrator.turn" in names
    assert any(name.startswith("summarize ") for name in names)


@pytest.mark.parametrize("spec", ["zipkin", "bogus", "jsonl", "jsonl:", "otlp:x", "console:"])
@pytest.mark.parametrize("command", [("compact", "--dry-run"), ("navigate", "--to", "x")])
def test_bad_trace_spec_is_a_usage_error(
    spec: str, command: tuple[str, ...], example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was exit 1 without the usage, after the session was opened.
    before = example.read_bytes()
    trace_refused(command, example, spec, "use otlp, console or jsonl:FOLDER", capsys)
    assert example.read_bytes() == before


def trace_refused(
    command: tuple[str, ...],
    example: Path,
    spec: str,
    reason: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--trace spec`` is a usage error: exit 2, the command's usage, ``reason`` last."""
    with pytest.raises(SystemExit) as exc:
        main([command[0], str(example), *command[1:], "--trace", spec])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"usage: orchestrator {command[0]} ")
    assert err.rstrip().endswith(f"error: argument --trace: {spec!r}: {reason}")


def test_navigate_summarize_through_litellm_and_the_local_provider(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    users = [e for e in lines if e["type"] == "message" and e["message"]["role"] == "user"]
    with LocalProvider(
        (Reply.summary(either_part("Explored the parametrized test.")),)
    ) as provider:
        code, out, err = run(
            capsys,
            "navigate",
            str(example),
            "--to",
            users[-1]["id"],
            "--summarize",
            "--focus",
            "name the files",
            *model_args(provider.url),
            "--json",
        )
        [request] = provider.requests
    assert code == 0, err
    report = json.loads(out)
    assert "Explored the parametrized test." in report["summary"]
    assert request.body["max_tokens"] == 2048
    assert request.body["messages"][-1]["content"].endswith("Additional focus: name the files")


def test_navigate_summary_failure_changes_nothing(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    users = [e for e in lines if e["type"] == "message" and e["message"]["role"] == "user"]
    before = example.read_bytes()
    with LocalProvider((Reply.summary("   "),)) as provider:
        code, _, err = run(
            capsys,
            "navigate",
            str(example),
            "--to",
            users[-1]["id"],
            "--summarize",
            *model_args(provider.url),
        )
    assert code == 1
    assert err.strip() == "orchestrator navigate: Summarization failed: empty summary"
    assert example.read_bytes() == before


WORKER = ["worker", "--temporal", "127.0.0.1:1", "--database", "postgresql://127.0.0.1:1/x"]


def test_timeout_is_accepted_by_every_command_that_summarizes(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "compact", str(example), "--dry-run", "--timeout", "12.5")
    assert code == 0, err
    assert "would compact" in out
    from orchestrator._cli.main import _build_parser as build_parser

    for argv in (["navigate", "s.jsonl", "--to", "x"], ["serve"], ["tui", "s.jsonl"], WORKER):
        args = build_parser().parse_args([*argv, "--timeout", "12.5"])
        assert args.timeout == 12.5


def test_timeout_is_the_operations_deadline_and_caps_each_calls_limits() -> None:
    import argparse

    from orchestrator._cli.common import with_timeout
    from orchestrator._runtime.types import RuntimeSettings

    default = RuntimeSettings()
    assert with_timeout(default, argparse.Namespace(timeout=None)) == default
    long = with_timeout(default, argparse.Namespace(timeout=3600.0))
    assert (long.operation_deadline_s, long.model_idle_timeout_s, long.model_timeout_s) == (
        3600.0,
        60.0,
        120.0,
    )
    unlimited = RuntimeSettings(model_idle_timeout_s=None, model_timeout_s=None)
    capped = with_timeout(unlimited, argparse.Namespace(timeout=30.0))
    assert (capped.model_idle_timeout_s, capped.model_timeout_s) == (30.0, 30.0)
    short = with_timeout(default, argparse.Namespace(timeout=12.5))
    assert (short.operation_deadline_s, short.model_idle_timeout_s, short.model_timeout_s) == (
        12.5,
        12.5,
        12.5,
    )


def test_timeout_must_be_a_positive_number(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run(capsys, "compact", str(example), "--timeout", "-1")
    assert exc.value.code == 2
    assert "positive number of seconds" in capsys.readouterr().err


def test_the_tui_without_a_terminal_is_refused_and_holds_nothing(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It drew the interface to nobody and never ended, holding the session's lock.
    before = example.read_bytes()
    code, out, err = run(capsys, "tui", str(example))
    assert code == 1
    assert out == ""
    assert err.strip() == (
        "orchestrator tui: tui needs a terminal on standard input and output; use `tree`, "
        "`navigate` or `serve` from scripts"
    )
    assert example.read_bytes() == before
    assert sorted(p.name for p in example.parent.iterdir()) == [example.name]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    ("argv", "done"),
    [
        (("compact",), "the compaction was appended (entry "),
        (("compact", "--json"), "the compaction was appended (entry "),
        (("navigate", "--to", "7c3c1046"), "the leaf was moved to 7c3c1046"),
        (("fork", "--from", "ec48c90d", "--out", "F"), "the fork was written to F"),
    ],
)
def test_a_report_that_cannot_be_written_says_the_change_was_made(
    argv: tuple[str, ...], done: str, tmp_path: Path
) -> None:
    # compact S > /dev/full appended the compaction, then said only "No space left on device".
    session = tmp_path / "s.jsonl"
    session.write_bytes(EXAMPLE.read_bytes())
    fork = str(tmp_path / "f.jsonl")
    args = [fork if a == "F" else a for a in argv]
    with open("/dev/full", "w") as full:
        finished = subprocess.run(
            [sys.executable, "-m", "orchestrator", args[0], str(session), *args[1:]],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,  # this tree's orchestrator
            check=False,
        )
    assert finished.returncode == 1
    assert finished.stderr.count("\n") == 1
    assert finished.stderr.startswith(f"orchestrator {args[0]}: {done.replace('F', fork)}")
    assert finished.stderr.rstrip().endswith(
        ", but writing the report to standard output failed: No space left on device"
    )
    changed = session.read_bytes() != EXAMPLE.read_bytes() or Path(fork).exists()
    assert changed


def test_an_unchanged_session_reports_a_failed_write_as_it_is(tmp_path: Path) -> None:
    session = tmp_path / "s.jsonl"
    session.write_bytes(EXAMPLE.read_bytes())
    with open("/dev/full", "w") as full:
        finished = subprocess.run(
            [sys.executable, "-m", "orchestrator", "compact", str(session), "--dry-run"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
            check=False,
        )
    assert (finished.returncode, finished.stderr) == (
        1,
        "orchestrator compact: No space left on device\n",
    )
    assert session.read_bytes() == EXAMPLE.read_bytes()


@pytest.mark.parametrize("under", ["", "/traces"])
@pytest.mark.parametrize("command", [("compact", "--dry-run"), ("navigate", "--to", "x")])
def test_a_trace_folder_that_is_a_file_is_refused_at_start(
    under: str,
    command: tuple[str, ...],
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Every span was dropped without a word, exit 0.
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a folder")
    spec = f"jsonl:{blocker}{under}"
    reason = f"{blocker} is not a folder; the spans need a folder"
    trace_refused(command, example, spec, reason, capsys)
    assert blocker.read_text() == "not a folder"


def test_a_missing_trace_folder_is_created(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "new" / "traces"
    code, _, _ = run(capsys, "compact", str(example), "--dry-run", "--trace", f"jsonl:{traces}")
    assert code == 0
    assert list(traces.glob("*.jsonl"))
