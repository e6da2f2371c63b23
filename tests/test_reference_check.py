"""``check`` names compactions and context edits whose reference is not on their path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.loading import parse_session_bytes, read_session, rewrite_refusal
from tests.cli_kit import run

HEADER = {"type": "session", "version": 3, "id": "s1", "timestamp": "t", "cwd": "/"}


def user(entry_id: str, parent: str | None) -> dict[str, Any]:
    message = {"role": "user", "content": "hi", "timestamp": 1}
    return {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "t",
        "message": message,
    }


def compaction(entry_id: str, parent: str, kept: str) -> dict[str, Any]:
    return {
        "type": "compaction",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "t",
        "summary": "s",
        "firstKeptEntryId": kept,
        "tokensBefore": 1,
    }


def edit(entry_id: str, parent: str, target: str, replacement: Any = None) -> dict[str, Any]:
    return {
        "type": "context_edit",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "t",
        "targetId": target,
        "replacement": replacement,
    }


def data(*entries: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in (HEADER, *entries))


# Line 2 a1, 3 a2 (branch a); 4 b1 (branch b from a1); then the references.
TREE = (user("a1", None), user("a2", "a1"), user("b1", "a1"))


def codes(raw: bytes) -> list[tuple[int, str]]:
    return [(p.line, p.code) for p in parse_session_bytes(raw).problems]


def test_references_on_the_path_and_retain_none_are_fine() -> None:
    raw = data(
        *TREE,
        compaction("c1", "a2", "a1"),
        compaction("c2", "c1", "c2"),  # pi 1.x's retain-none: its own id
        edit("e1", "c2", "a2", {"content": "short"}),
        edit("e2", "e1", "c1"),
    )
    assert codes(raw) == []


def test_each_reference_off_the_path_is_named_with_its_line() -> None:
    raw = data(
        *TREE,
        compaction("c1", "a2", "b1"),  # line 5: another branch
        compaction("c2", "c1", "gone0001"),  # line 6: no such entry
        edit("e1", "c2", "b1"),  # line 7: another branch
        edit("e2", "e1", "zzz"),  # line 8: no such entry
        edit("e3", "a1", "a2"),  # line 9: its sibling, another branch
        edit("e4", "b1", "e5"),  # line 10: after it
        user("e5", "e4"),
    )
    problems = parse_session_bytes(raw).problems
    assert [(p.line, p.code) for p in problems] == [
        (5, "kept_off_path"),
        (6, "kept_off_path"),
        (7, "edit_target_off_path"),
        (8, "edit_target_off_path"),
        (9, "edit_target_off_path"),
        (10, "edit_target_off_path"),
    ]
    messages = [p.message for p in problems]
    assert messages[0] == (
        "compaction 'c1' keeps from 'b1', which is not on its path (it is on another branch); "
        "its context keeps nothing from before it"
    )
    assert "(no entry has that id)" in messages[1]
    assert messages[2] == (
        "context edit 'e1' targets 'b1', which is not on its path (it is on another branch); "
        "it changes nothing"
    )
    assert messages[5] == (
        "context edit 'e4' targets 'e5', which is not on its path (it comes after it); "
        "pi edits earlier entries"
    )


def test_a_compaction_keeping_from_after_itself_is_named() -> None:
    raw = data(user("a1", None), compaction("c1", "a1", "a3"), user("a3", "c1"))
    assert codes(raw) == [(3, "kept_off_path")]


def test_references_in_a_parent_cycle_are_left_to_cycle() -> None:
    raw = data(user("a1", None), edit("e1", "e2", "nope"), edit("e2", "e1", "a1"))
    assert {code for _, code in codes(raw)} == {"cycle"}


def test_a_rewrite_is_not_refused_for_them() -> None:
    raw = data(*TREE, compaction("c1", "a2", "b1"))
    assert rewrite_refusal("s.jsonl", read_session(raw)) is None


def test_check_prints_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(data(*TREE, edit("e1", "b1", "a2")))
    code, out, _ = run(capsys, "check", str(path), "--json")
    assert code == 1
    report = json.loads(out)
    assert report["problems"] == [
        {
            "line": 5,
            "code": "edit_target_off_path",
            "message": "context edit 'e1' targets 'a2', which is not on its path "
            "(it is on another branch); it changes nothing",
        }
    ]
