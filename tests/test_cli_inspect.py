"""The inspection commands: context, plan, tree, check (docs/sessions.md, "Inspection JSON")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator._cli.main import main
from tests.cli_kit import EXAMPLE, run


def test_context_json_has_the_stable_fields(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "context", str(example), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) >= {
        "leafId",
        "messages",
        "thinkingLevel",
        "model",
        "tokens",
        "messageTokens",
    }
    assert report["messages"][0]["role"] == "compactionSummary"
    assert report["model"] == {"provider": "anthropic", "modelId": "claude-opus-4-1"}
    assert report["thinkingLevel"] == "medium"
    assert len(report["messageTokens"]) == len(report["messages"])
    assert set(report["tokens"]) == {"tokens", "usageTokens", "trailingTokens", "lastUsageIndex"}
    roles = [m["role"] for m in report["messages"]]
    assert "branchSummary" in roles


def test_context_at_another_leaf(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()]
    first_user = next(
        e for e in lines[1:] if e.get("type") == "message" and e["message"]["role"] == "user"
    )
    code, out, _ = run(capsys, "context", str(example), "--leaf", first_user["id"], "--json")
    assert code == 0
    report = json.loads(out)
    assert report["leafId"] == first_user["id"]
    assert [m["role"] for m in report["messages"]] == ["user"]


def test_context_text_form(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "context", str(example))
    assert code == 0
    assert "[compactionSummary]" in out
    assert "messages, ~" in out


def test_unknown_leaf_is_one_line_error_exit_1(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "context", str(example), "--leaf", "nope1234", "--json")
    assert code == 1
    assert out == ""
    assert err.strip() == f"orchestrator context: {example}: entry 'nope1234' not found"


@pytest.mark.parametrize(
    ("argv", "entry"),
    [
        (("context", "S", "--leaf", ""), ""),  # it said "Entry  not found"
        (("plan", "S", "--leaf", "x y"), "x y"),
        (("plan", "S", "--from", "gone", "--to", "gone"), "gone"),
        (("navigate", "S", "--to", "nope"), "nope"),
        (("fork", "S", "--from", "nope"), "nope"),
    ],
)
def test_an_unknown_entry_names_the_session_and_quotes_the_id(
    argv: tuple[str, ...], entry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "s.jsonl"
    session.write_bytes(EXAMPLE.read_bytes())
    code, out, err = run(capsys, *[str(session) if a == "S" else a for a in argv])
    assert (code, out) == (1, "")
    assert err == f"orchestrator {argv[0]}: {session}: entry {entry!r} not found\n"
    assert session.read_bytes() == EXAMPLE.read_bytes()


def test_missing_file_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "context", str(tmp_path / "none.jsonl"))
    assert code == 1
    assert "no such session file" in err


def test_usage_error_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["context"])
    assert exc.value.code == 2


def test_plan_json_compaction_form(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", str(example), "--context-window", "80000", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) >= {
        "leafId",
        "keepRecentTokens",
        "effectiveKeepRecentTokens",
        "contextTokens",
        "threshold",
        "shouldCompact",
        "compaction",
        "reason",
    }
    assert report["threshold"] == 80000 - 16384
    assert report["shouldCompact"] is True
    plan = report["compaction"]
    assert set(plan) >= {
        "firstKeptEntryId",
        "isSplitTurn",
        "turnStartEntryId",
        "summarizeEntryIds",
        "turnPrefixEntryIds",
        "tokensBefore",
        "previousSummary",
        "readFiles",
        "modifiedFiles",
    }
    assert plan["previousSummary"].startswith("## Goal")
    assert "invoice/totals.py" in plan["modifiedFiles"]
    assert report["effectiveKeepRecentTokens"] < report["keepRecentTokens"]


def test_plan_without_window_and_without_adaptation(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", str(example), "--no-adaptive-keep", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["threshold"] is None
    assert report["shouldCompact"] is None
    assert report["effectiveKeepRecentTokens"] == report["keepRecentTokens"] == 20000


def test_plan_branch_form(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [json.loads(line) for line in example.read_text().splitlines()][1:]
    summary = next(e for e in lines if e["type"] == "branch_summary")
    old_leaf = summary["fromId"]
    code, out, err = run(
        capsys, "plan", str(example), "--from", old_leaf, "--to", summary["parentId"], "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["oldLeafId"] == old_leaf
    assert report["commonAncestorId"] == summary["parentId"]
    assert report["entryIds"][-1] == old_leaf
    assert "tests/test_tax_rounding.py" in report["modifiedFiles"]
    assert set(report) >= {"targetId", "summarizedEntryIds", "totalTokens", "readFiles"}


def test_tree_marks_leaf_labels_and_branches(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "tree", str(example))
    assert code == 0
    assert "[tax investigation]" in out
    assert "[fix complete]" in out
    assert sum(1 for line in out.splitlines() if line.startswith("*")) == 1
    code, out, _ = run(capsys, "tree", str(example), "--json")
    report = json.loads(out)
    assert report["leafId"] == report["nodes"][-1]["id"] or any(
        n["isLeaf"] for n in report["nodes"]
    )
    depths = {n["depth"] for n in report["nodes"]}
    assert depths == {0, 1}
    assert len(report["nodes"]) == len(example.read_text().splitlines()) - 1


def test_check_ok(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", str(example))
    assert code == 0
    assert "ok, 43 entries" in out


DAMAGES: dict[str, tuple[Callable[[list[str]], list[str]], int]] = {
    "not_json": (lambda lines: lines[:3] + ["{not json"] + lines[3:], 4),
    "no_id": (lambda lines: lines + ['{"type":"message","parentId":null}'], 45),
    "torn_line": (lambda lines: lines + ['{"type":"message","id":"ab'], 45),
    "duplicate_id": (lambda lines: lines + [lines[5]], 45),
    "unknown_parent": (
        lambda lines: (
            lines
            + [
                '{"type":"message","id":"0rphan00","parentId":"gone0000",'
                '"timestamp":"2026-01-01T00:00:00.000Z","message":{"role":"user",'
                '"content":"lost","timestamp":0}}'
            ]
        ),
        45,
    ),
    "cycle": (
        lambda lines: (
            lines
            + [
                '{"type":"custom","id":"cyc1e000","parentId":"cyc1e001",'
                '"timestamp":"2026-01-01T00:00:00.000Z","customType":"x"}',
                '{"type":"custom","id":"cyc1e001","parentId":"cyc1e000",'
                '"timestamp":"2026-01-01T00:00:01.000Z","customType":"x"}',
            ]
        ),
        45,
    ),
}


@pytest.mark.parametrize("code_name", sorted(DAMAGES))
def test_check_reports_damage_with_line_and_leaves_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], code_name: str
) -> None:
    damage, line_no = DAMAGES[code_name]
    lines = EXAMPLE.read_text().splitlines()
    path = tmp_path / "damaged.jsonl"
    text = "\n".join(damage(lines))
    data = (text if code_name == "torn_line" else text + "\n").encode()
    path.write_bytes(data)
    code, out, err = run(capsys, "check", str(path), "--json")
    assert code == 1
    report = json.loads(out)
    assert [(p["code"], p["line"]) for p in report["problems"]] == [(code_name, line_no)]
    assert path.read_bytes() == data
    code, out, err = run(capsys, "check", str(path))
    assert code == 1
    assert f"line {line_no}:" in out  # the report on stdout: check S > report.txt keeps it
    assert err == ""
    # The other commands still work on what loaded, with a warning.
    code, out, err = run(capsys, "context", str(path), "--json")
    assert code == 0
    assert f"warning: {path}: line {line_no}" in err
    assert path.read_bytes() == data


def test_check_not_a_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_bytes(b'{"hello": "world"}\n')
    code, out, err = run(capsys, "check", str(path))
    assert code == 1
    assert "not a session file" in err
    assert err.count("\n") == 1
    assert out == f"{path}: line 1: {NOT_A_HEADER}\n"
    assert path.read_bytes() == b'{"hello": "world"}\n'


NOT_A_HEADER = (
    'the first line is not a session header ({"type": "session", "id": ...}), '
    "so this is not a session file"
)


@pytest.mark.parametrize(
    ("data", "line", "message"),
    [
        (b"\xef\xbb\xbf" + EXAMPLE.read_bytes(), 1, "byte order mark (BOM)"),
        (b"garbage\n", 1, "not a session header"),
        (b"\n\n\n", 0, "no session header (nothing but blank lines)"),
    ],
    ids=["bom", "garbage", "blank"],
)
def test_check_json_reports_a_file_that_is_not_a_session(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    data: bytes,
    line: int,
    message: str,
) -> None:
    # The report is the contract's object, on stdout; the error line stays on stderr.
    path = tmp_path / "notes.jsonl"
    path.write_bytes(data)
    code, out, err = run(capsys, "check", str(path), "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert report["entries"] == 0
    [problem] = report["problems"]
    assert (problem["line"], problem["code"]) == (line, "not_session")
    assert message in problem["message"]
    assert err.count("\n") == 1
    assert err.startswith("orchestrator check: ")
    assert "not a session file" in err
    code, out, _ = run(capsys, "check", str(path))
    assert code == 1
    assert message in out
    assert path.read_bytes() == data


def _with_an_emoji(tmp_path: Path) -> Path:
    entries = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    last_user = next(
        e for e in reversed(entries) if e["type"] == "message" and e["message"]["role"] == "user"
    )
    last_user["message"]["content"] = "smile \U0001f600 caf\u00e9"
    path = tmp_path / "emoji.jsonl"
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries))
    return path


@pytest.mark.parametrize("encoding", ["latin-1", "ascii", "utf-8"])
def test_json_output_is_valid_whatever_stdout_encoding(tmp_path: Path, encoding: str) -> None:
    # With latin-1 the stream's error handler wrote \U0001f600, which is not JSON.
    path = _with_an_emoji(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "context", str(path), "--json"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": encoding},
        cwd=Path(__file__).parent.parent,  # this tree's orchestrator
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "smile \U0001f600 caf\u00e9" in [m.get("content") for m in report["messages"]]
    if encoding == "utf-8":  # unchanged: the characters as they are, nothing escaped
        assert "smile \U0001f600 caf\u00e9".encode() in done.stdout
    else:
        assert done.stdout.isascii()
        assert b"smile \\ud83d\\ude00 caf\\u00e9" in done.stdout
