"""Hostile session files (issue 8, item 7): each one line, the right exit code, the file untouched.

Every case here crashed with a traceback, was misreported, or was rewritten before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator._core.json_lines import MAX_DEPTH
from orchestrator._core.loading import parse_session_bytes, read_session
from orchestrator._store.jsonl import JsonlStore
from tests.cli_kit import EXAMPLE, run

HEADER = (
    b'{"type":"session","version":3,"id":"s1","timestamp":"2026-01-01T00:00:00.000Z","cwd":"/w"}\n'
)
ROOT = (
    b'{"type":"message","id":"a1b2c3d4","parentId":null,"timestamp":"2026-01-01T00:00:00.000Z",'
    b'"message":{"role":"user","content":"hi"}}\n'
)


def _reply(usage: bytes = b'{"input":1,"output":1}', extra: bytes = b"") -> bytes:
    return (
        b'{"type":"message","id":"e5f6a7b8","parentId":"a1b2c3d4",'
        b'"timestamp":"2026-01-01T00:00:01.000Z",' + extra + b'"message":{"role":"assistant",'
        b'"content":[{"type":"text","text":"ok"}],"usage":' + usage + b"}}\n"
    )


def _deep_reply(depth: int) -> bytes:
    nested = b"[" * depth + b"]" * depth
    return (
        b'{"type":"message","id":"e5f6a7b8","parentId":"a1b2c3d4",'
        b'"timestamp":"2026-01-01T00:00:01.000Z","message":{"role":"assistant","content":'
        b'[{"type":"toolCall","id":"c","name":"x","arguments":{"a":' + nested + b"}}]}}\n"
    )


def _header_version(version: int) -> bytes:
    return HEADER.replace(b'"version":3', b'"version":%d' % version)


_NOT_UTF8 = _reply(extra=b'"x":"caf\xe9",')
_NOT_UTF8_AT = _NOT_UTF8.index(0xE9) + 1

# (name, file bytes, the problem line as `check` prints it)
LINE_CASES = [
    (
        "invalid UTF-8",  # it said only "not valid JSON"
        HEADER + ROOT + _NOT_UTF8,
        f"line 3: not valid JSON: invalid UTF-8 at byte {_NOT_UTF8_AT} of the line (0xe9)",
    ),
    ("deep", HEADER + ROOT + _deep_reply(1000), "line 3: nested more than 200 levels deep"),
    (
        "infinite usage",
        HEADER + ROOT + _reply(b'{"input":1e400,"output":1}'),
        "line 3: the number 1e400 is beyond the range of a double",
    ),
    (
        "huge integer",
        HEADER + ROOT + _reply(extra=b'"x":' + b"7" * 4400 + b","),
        "line 3: the integer 777777777777...777777 (4400 characters) has more digits than can "
        "be read (4300 at most); skipped",
    ),
    (
        "version 1 over v3 entries",
        _header_version(1) + ROOT + _reply(),
        "line 1: the header says version 1, but the entries have ids and parents "
        "(version 2 or later); read as written, nothing migrated",
    ),
    (
        "future version",
        _header_version(99) + ROOT + _reply(),
        "line 1: the header says version 99, newer than this program reads (3)",
    ),
]


@pytest.mark.parametrize(("name", "data", "problem"), LINE_CASES, ids=[c[0] for c in LINE_CASES])
@pytest.mark.parametrize("command", ["check", "context", "plan", "tree", "compact"])
def test_each_break_is_one_line_and_the_file_is_untouched(
    name: str,
    data: bytes,
    problem: str,
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    code, out, err = run(capsys, command, str(path))
    # check's report is on stdout (``check S > report.txt``); the others warn on stderr.
    where = out if command == "check" else err
    assert problem in where
    assert "Traceback" not in err
    refused = command == "compact" and name in ("version 1 over v3 entries", "future version")
    if refused:
        # A header no write may follow: compact says so before planning or calling a model,
        # after the reading's warning (the second line names the refusal).
        warning, error = err.splitlines()
        assert problem in warning
        assert error.startswith("orchestrator compact: refusing to append to ")
        assert code == 1
    else:
        assert len([line for line in where.splitlines() if problem in line]) == 1
        # check fails on any problem; the others warn and go on with what loaded.
        assert code == (1 if command == "check" else 0)
    assert path.read_bytes() == data


def test_bom_says_why_it_is_not_a_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.jsonl"
    data = b"\xef\xbb\xbf" + HEADER + ROOT
    path.write_bytes(data)
    for command in ("check", "context", "compact"):
        code, out, err = run(capsys, command, str(path))
        assert code == 1
        # check also reports the problem on stdout, as for any damaged file.
        if command == "check":
            assert out.count("\n") == 1
            assert out.startswith(f"{path}: line 1: ")
            assert "byte order mark (BOM)" in out
        else:
            assert out == ""
        assert err.count("\n") == 1
        assert "byte order mark (BOM)" in err
        assert "remove the first 3 bytes" in err
    assert path.read_bytes() == data


@pytest.mark.parametrize("version", [1, 99])
def test_compaction_on_a_wrong_version_is_refused_and_writes_nothing(
    version: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = EXAMPLE.read_bytes().splitlines(keepends=True)
    data = _header_version(version).replace(b'"id":"s1"', b'"id":"x"') + b"".join(lines[1:])
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    code, out, err = run(capsys, "compact", str(path))
    assert code == 1
    assert f"refusing to append to {path}: its header is wrong: the header says version" in err
    assert "Traceback" not in err
    assert err.count("refusing") == 1
    assert path.read_bytes() == data


def test_version_1_over_v3_entries_keeps_ids_and_branches() -> None:
    branch = _reply().replace(b"e5f6a7b8", b"0badf00d")
    result = parse_session_bytes(_header_version(1) + ROOT + _reply() + branch)
    assert [e["id"] for e in result.entries] == ["a1b2c3d4", "e5f6a7b8", "0badf00d"]
    assert [e["parentId"] for e in result.entries] == [None, "a1b2c3d4", "a1b2c3d4"]
    assert result.migrated is False


def test_rewrite_of_a_wrong_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    data = _header_version(99) + ROOT
    path.write_bytes(data)
    with JsonlStore(path) as store:
        loaded = store.load()
        assert loaded.header is not None
        with pytest.raises(Exception, match="refusing to rewrite .*version 99"):
            store.rewrite(loaded.header, loaded.entries)
    assert path.read_bytes() == data


def test_nesting_up_to_the_limit_loads_and_flows_through_context_and_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The line itself, "message", "content", the block and "arguments" take 5 levels.
    fits = _deep_reply(MAX_DEPTH - 5)
    assert read_session(HEADER + ROOT + fits).result.problems == []
    over = read_session(HEADER + ROOT + _deep_reply(MAX_DEPTH - 4))
    assert [p.code for p in over.result.problems] == ["too_deep"]
    path = tmp_path / "s.jsonl"
    path.write_bytes(HEADER + ROOT + fits)
    for command in ("context", "plan", "tree"):
        code, out, err = run(capsys, command, str(path), "--json")
        assert (code, err) == (0, ""), command
        json.loads(out)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"x": "[" * (MAX_DEPTH * 3)}).encode()
    reply = _reply(extra=b'"note":' + text + b",")
    assert read_session(HEADER + ROOT + reply).result.problems == []


def test_a_big_integer_is_kept_exactly() -> None:
    digits = "9" * 4300
    result = parse_session_bytes(HEADER + ROOT + _reply(extra=f'"n":{digits},'.encode()))
    assert result.problems == []
    assert result.entries[-1]["n"] == int(digits)


def test_a_torn_deep_last_line_is_whole_not_torn() -> None:
    # A complete line without its newline is an ordinary (if unusable) line, not a crash.
    result = parse_session_bytes(HEADER + ROOT + _deep_reply(1000)[:-1])
    assert [p.code for p in result.problems] == ["too_deep"]
    assert result.torn_tail == b""
