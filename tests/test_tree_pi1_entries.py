"""``tree`` (text, ``--json``, the TUI picker) shows pi 1.x's context edits and usage entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator._store.session import Session
from tests.cli_kit import run

PI = Path(__file__).parent / "data" / "pi"
EDITS = PI / "context-edits.jsonl"
USAGE = PI / "usage-and-roots.jsonl"


def rows(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, str]:
    """The printed rows by entry id, marker, branch connectors and indentation stripped."""
    code, out, err = run(capsys, "tree", str(path))
    assert code == 0, err
    found = {}
    for line in out.splitlines()[:-1]:
        entry_id, _, text = line[2:].lstrip(" │├└─").partition(" ")
        found[entry_id] = text
    return found


def nodes(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, dict[str, Any]]:
    code, out, err = run(capsys, "tree", str(path), "--json")
    assert code == 0, err
    return {node["id"]: node for node in json.loads(out)["nodes"]}


def test_edit_rows_say_what_they_omit_or_replace(capsys: pytest.CaptureFixture[str]) -> None:
    printed = rows(capsys, EDITS)
    assert printed["03a793a1"] == "context edit: omits 470c85a3"
    assert printed["96bd897a"] == "context edit: replaces fad09e9f: short user text"
    assert printed["72ee8d95"] == "context edit: replaces 368dd757: trimmed result"
    assert printed["9fec1194"] == "context edit: omits e9aabdc5"


def test_edited_targets_are_marked(capsys: pytest.CaptureFixture[str]) -> None:
    printed = rows(capsys, EDITS)
    # The active leaf is on the second branch: its edits are in effect.
    assert printed["e9aabdc5"].endswith("… (omitted by 9fec1194)")
    assert printed["bae43e73"].endswith("… (replaced by a8ac7837)")
    # Edited only on the other branch.
    assert printed["470c85a3"].endswith("… (edited off the active path by 03a793a1)")
    assert printed["989fb56e"].endswith(
        "… (edited off the active path by b7b1c641, 717a4740, 0c1cb651)"
    )
    assert printed["5a4c05b3"].endswith("read(…) …")  # not edited: no mark


def test_edit_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    found = nodes(capsys, EDITS)
    assert found["03a793a1"]["edit"] == {"targetId": "470c85a3", "action": "omit"}
    assert found["96bd897a"]["edit"] == {"targetId": "fad09e9f", "action": "replace"}
    assert found["96bd897a"]["text"] == "context edit: replaces fad09e9f: short user text"
    assert found["bae43e73"]["editedBy"] == ["aefaf5ed", "a8ac7837"]
    assert found["bae43e73"]["contextEdit"] == {"id": "a8ac7837", "action": "replace"}
    assert found["470c85a3"]["contextEdit"] is None
    assert found["470c85a3"]["editedBy"] == ["03a793a1"]
    plain = found["5a4c05b3"]
    assert (plain["edit"], plain["editedBy"], plain["contextEdit"], plain["usage"]) == (
        None,
        [],
        None,
        None,
    )
    # The fields that were there stay.
    assert set(plain) >= {"id", "parentId", "type", "role", "label", "depth", "text"}


def test_usage_rows_and_fields(capsys: pytest.CaptureFixture[str]) -> None:
    printed = rows(capsys, USAGE)
    assert printed["b0964ddc"] == (
        "usage cache_warm anthropic/claude-sonnet-4-5: 50000 tokens (50000 in, 0 out)"
    )
    assert (
        printed["f7560e71"] == "usage summary openai/gpt-5.1-codex: 2000 tokens (1500 in, 500 out)"
    )
    usage = nodes(capsys, USAGE)["f7560e71"]["usage"]
    assert usage == {
        "kind": "summary",
        "provider": "openai",
        "model": "gpt-5.1-codex",
        "input": 1500,
        "output": 500,
        "cacheRead": 0,
        "cacheWrite": 0,
        "totalTokens": 2000,
    }


def test_damaged_edit_and_usage_are_described_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.jsonl"
    lines = [
        {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"},
        {"type": "context_edit", "id": "e1", "parentId": None, "timestamp": "t", "targetId": 5},
        {"type": "usage", "id": "u1", "parentId": "e1", "timestamp": "t", "usage": "lots"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    printed = rows(capsys, path)
    assert printed["e1"] == "context edit"
    assert printed["u1"] == "usage ? ?/?: tokens unknown (0 in, 0 out)"


def test_tui_picker_rows_carry_the_mark() -> None:
    from orchestrator._tui.picker import picker_rows, row_content

    session = Session.open(EDITS)
    by_id = {row["id"]: row for row in picker_rows(session)}
    assert str(row_content(by_id["e9aabdc5"])).endswith("(omitted by 9fec1194)")
    assert "context edit: omits e9aabdc5" in str(row_content(by_id["9fec1194"]))
