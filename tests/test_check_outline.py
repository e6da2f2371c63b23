"""``check`` reads a file in outline: the same problems and entries as a full load (issue 37).

An outline keeps of each entry its id, parent, type and references; the message, summary and
details are decoded (so every line is checked whole) and let go. These tests hold the outline
to the full load, damaged file by damaged file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator._cli.main import main
from orchestrator._core.errors import NotASessionError
from orchestrator._core.reading import OUTLINE_KEYS
from orchestrator._store.jsonl import JsonlStore, read_outline
from orchestrator._store.reports import check_file
from orchestrator._store.session import Session
from tests.test_damaged_files import CASES, HEADER, ROOT


def _line(entry: dict[str, object]) -> bytes:
    return json.dumps(entry).encode() + b"\n"


def _message(entry_id: str, parent: str | None, **message: object) -> bytes:
    message.setdefault("role", "assistant")
    message.setdefault("content", [{"type": "text", "text": "ok"}])
    entry: dict[str, object] = {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "message": message,
    }
    return _line(entry)


_USAGE = {"input": 1, "output": -5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 10**400}

# Damage hidden in what an outline lets go: the line must still be checked whole.
HIDDEN = {
    "bad_number_in_content": HEADER + ROOT + b'{"type":"message","id":"b1","parentId":"a1b2c3d4",'
    b'"message":{"role":"toolResult","content":[{"type":"text","n":1e400}]}}\n',
    "long_integer_in_details": HEADER
    + ROOT
    + b'{"type":"custom","id":"b2","parentId":"a1b2c3d4","details":{"n":'
    + b"9" * 5000
    + b"}}\n",
    "too_deep_in_arguments": HEADER
    + ROOT
    + b'{"type":"message","id":"b3","parentId":"a1b2c3d4","message":{"role":"assistant",'
    + b'"content":[{"type":"toolCall","arguments":'
    + b"[" * 300
    + b"]" * 300
    + b"}]}}\n",
    "invalid_utf8_in_text": HEADER + ROOT + b'{"type":"message","id":"b4","parentId":"a1b2c3d4",'
    b'"message":{"role":"user","content":"caf\xe9"}}\n',
    "lone_surrogate_in_text": HEADER + ROOT + b'{"type":"message","id":"b5","parentId":"a1b2c3d4",'
    b'"message":{"role":"user","content":"\\ud800"}}\n',
    "bad_usage": HEADER + ROOT + _message("b6", "a1b2c3d4", usage=_USAGE),
    "kept_off_path": HEADER
    + ROOT
    + _message("b7", None)
    + _line(
        {
            "type": "compaction",
            "id": "c1",
            "parentId": "a1b2c3d4",
            "summary": "s" * 100,
            "firstKeptEntryId": "b7",
            "tokensBefore": 5,
        }
    ),
    "edit_target_off_path": HEADER
    + ROOT
    + _line({"type": "context_edit", "id": "e1", "parentId": "a1b2c3d4", "targetId": "zz"}),
    "no_parent_field": HEADER + ROOT + b'{"type":"custom","id":"b8"}\n',
    "version_2": HEADER.replace(b'"version":3', b'"version":2') + ROOT,
    "version_1": b'{"type":"session","id":"s1","timestamp":"2026-01-01T00:00:00.000Z"}\n'
    + b'{"type":"message","message":{"role":"user","content":"hi"}}\n',
    "version_1_over_ids": HEADER.replace(b'"version":3', b'"version":1') + ROOT,
    "version_newer": HEADER.replace(b'"version":3', b'"version":9') + ROOT,
    "blank_lines_only": b"\n\n",
}

FILES = {case.code: case.data for case in CASES} | HIDDEN


@pytest.mark.parametrize("name", sorted(FILES))
def test_outline_finds_what_a_full_load_finds(name: str, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(FILES[name])
    full = JsonlStore(path).load()
    outline = read_outline(path)
    assert outline.problems == full.problems
    assert outline.header == full.header
    assert outline.migrated == full.migrated
    assert len(outline.entries) == len(full.entries)
    if not full.migrated:  # a migration draws new ids
        assert [entry["id"] for entry in outline.entries] == [e["id"] for e in full.entries]
    assert outline.torn_tail == full.torn_tail
    assert outline.tail == full.tail
    assert path.read_bytes() == FILES[name]  # read, never written


def test_outline_entries_keep_only_their_place_and_references(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(HIDDEN["kept_off_path"])
    outline = read_outline(path)
    assert outline.entries[-1] == {
        "type": "compaction",
        "id": "c1",
        "parentId": "a1b2c3d4",
        "firstKeptEntryId": "b7",
    }
    assert all(set(entry) <= OUTLINE_KEYS for entry in outline.entries)
    assert outline.index is not None
    assert outline.index.by_id["c1"] is outline.entries[-1]


def test_a_file_that_migrates_is_read_whole(tmp_path: Path) -> None:
    # Migration rewrites what the entries hold: the outline is for current files only.
    path = tmp_path / "s.jsonl"
    path.write_bytes(HIDDEN["version_2"])
    assert read_outline(path).entries == JsonlStore(path).load().entries


@pytest.mark.parametrize("name", sorted(FILES))
def test_check_file_agrees_with_opening_the_session(name: str, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(FILES[name])
    try:
        session = Session.open(path)
    except NotASessionError as exc:
        expected = (str(exc), exc.problems)
        with pytest.raises(NotASessionError) as raised:
            check_file(str(path))
        assert (str(raised.value), raised.value.problems) == expected
        return
    problems, tree = check_file(str(path))
    assert problems == session.problems
    assert tree is not None
    assert len(tree) == len(session.tree)
    if not FILES[name].startswith(b'{"type":"session","id"'):  # v1: new ids
        assert tree.leaf_id == session.tree.leaf_id


def test_check_of_an_empty_file_and_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert check_file(str(empty)) == ([], None)
    assert main(["check", "--json", str(empty)]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "entries": 0, "problems": []}
    assert main(["check", str(tmp_path / "missing.jsonl")]) != 0
    assert not (tmp_path / "missing.jsonl").exists()


def test_check_reports_hidden_damage_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(HIDDEN["bad_number_in_content"])
    assert main(["check", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["entries"] == 1
    assert [(p["line"], p["code"]) for p in report["problems"]] == [(3, "bad_number")]
