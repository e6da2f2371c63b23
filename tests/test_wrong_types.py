"""A field pi writes with one JSON type, holding another, is tolerated, never a traceback (D3).

A damaged or hand-made file can hold a number where pi writes a text, an object where it writes
a summary, a string or an overflowing number where it writes a token count. Such an entry is
read as written (D2) and counted as pi's JavaScript mostly would: a text that is not a string
is empty, a count that is not a finite number is 0. Every command runs on such a file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.entries import text_of
from orchestrator._core.tokens import (
    calculate_context_tokens,
    calculate_prompt_tokens,
    estimate_tokens,
)
from tests.cli_kit import EXAMPLE, run

STAMP = "2025-12-02T11:00:00.000Z"
ODD: dict[str, dict[str, Any]] = {
    "text_is_a_number": {
        "type": "message",
        "message": {"role": "user", "content": [{"type": "text", "text": 5}], "timestamp": 1},
    },
    "text_is_null": {
        "type": "message",
        "message": {"role": "user", "content": [{"type": "text", "text": None}], "timestamp": 1},
    },
    "assistant_text_is_a_number": {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": 12345}],
            "stopReason": "stop",
        },
    },
    "assistant_text_is_null": {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": None}],
            "stopReason": "stop",
        },
    },
    "bash_command_is_a_number": {
        "type": "message",
        "message": {"role": "bashExecution", "command": 7, "output": "x", "exitCode": 0},
    },
    "branch_summary_is_null": {"type": "branch_summary", "fromId": "f519f70a", "summary": None},
    "summary_is_an_object": {
        "type": "compaction",
        "summary": {"a": 1},
        "firstKeptEntryId": "f519f70a",
        "tokensBefore": 10,
    },
    "usage_holds_strings": {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "x"}],
            "usage": {"input": "x", "totalTokens": None},
            "stopReason": "stop",
        },
    },
    "usage_overflows": {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "x"}],
            "usage": {"input": 1e308, "output": 0, "cacheRead": 1e308, "cacheWrite": 0},
            "stopReason": "stop",
        },
    },
    "tool_call_of_odd_types": {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [{"type": "toolCall", "id": 5, "name": 7, "arguments": "str"}],
            "stopReason": "toolUse",
        },
    },
}
COMMANDS = [
    ["context"],
    ["context", "--json"],
    ["tree"],
    ["tree", "--json"],
    ["plan"],
    ["check"],
    ["compact", "--dry-run"],
    ["compact"],
    ["navigate", "--to", "cc623a9b", "--summarize"],
]


def with_odd_entry(tmp_path: Path, case: str) -> Path:
    """A copy of the example with the odd entry ``case`` appended under its leaf."""
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    entry = {"id": "0dd0dd01", "parentId": "935170bb", "timestamp": STAMP, **ODD[case]}
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry, separators=(",", ":")) + "\n")
    return path


@pytest.mark.parametrize("case", sorted(ODD))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_runs_on_a_field_of_the_wrong_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: list[str]
) -> None:
    path = with_odd_entry(tmp_path, case)
    before = path.read_bytes()
    code, _, err = run(capsys, command[0], str(path), *command[1:])  # raises on a traceback
    assert code == 0, err
    if command[0] in ("context", "tree", "plan", "check") or "--dry-run" in command:
        assert path.read_bytes() == before
    else:
        assert path.read_bytes().startswith(before)  # only appended to


@pytest.mark.parametrize(
    "case",
    ["assistant_text_is_a_number", "summary_is_an_object", "branch_summary_is_null"],
)
def test_a_text_of_the_wrong_type_previews_as_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    # `tree` crashed on the number (a join of non-strings) and showed the object's Python repr.
    path = with_odd_entry(tmp_path, case)
    code, out, err = run(capsys, "tree", str(path), "--json")
    assert code == 0, err
    row = next(r for r in json.loads(out)["nodes"] if r["id"] == "0dd0dd01")
    assert row["text"] in ("assistant: ", "compaction: ", "branch summary: ")
    for shown in ("12345", "{'a': 1}", "None"):
        assert shown not in row["text"]


def test_texts_and_counts_of_the_wrong_type_count_as_empty_and_zero() -> None:
    assert text_of([{"type": "text", "text": 5}, {"type": "text", "text": "ok"}]) == "ok"
    assert estimate_tokens({"role": "user", "content": [{"type": "text", "text": None}]}) == 0
    assert estimate_tokens({"role": "compactionSummary", "summary": {"a": 1}}) == 0
    assert calculate_context_tokens({"input": "x", "output": 3, "totalTokens": None}) == 3
    assert calculate_context_tokens({"input": True, "output": 2}) == 2
    assert calculate_prompt_tokens({"input": 1e308, "cacheRead": 1e308, "totalTokens": 7}) == 7
    assert calculate_prompt_tokens({"input": float("nan"), "output": 4}) == 4
