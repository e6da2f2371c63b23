"""Token counts that are numbers but not counts: a 401-digit integer, a negative (D3).

An integer beyond a double's range crashed every command that counts tokens with an
``OverflowError``; a negative count was shown as ``~-100000 tokens``. Both now count as 0, as a
string does, and ``check`` names them with their line. Nothing on disk changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.loading import read_session, rewrite_refusal
from orchestrator._core.tokens import (
    calculate_context_tokens,
    calculate_prompt_tokens,
    is_token_count,
)
from orchestrator._core.usage_check import usage_problems
from tests.cli_kit import EXAMPLE, run

HUGE = 10**400
CASES: dict[str, dict[str, Any]] = {
    "huge_input": {"input": HUGE, "output": 7, "totalTokens": 0},
    "huge_total": {"input": 5, "output": 7, "totalTokens": HUGE},
    "negative_total": {"input": 5, "output": 7, "totalTokens": -100000},
    "negative_input": {"input": -100000, "output": 0, "totalTokens": 0},
}
KEY = {
    "huge_input": "input",
    "huge_total": "totalTokens",
    "negative_total": "totalTokens",
    "negative_input": "input",
}
COMMANDS = [
    ["context"],
    ["context", "--json"],
    ["plan"],
    ["plan", "--json"],
    ["tree"],
    ["compact", "--dry-run"],
]


def with_usage(tmp_path: Path, case: str) -> Path:
    """The example with an assistant reply carrying the usage ``case`` appended under its leaf."""
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    entry = {
        "type": "message",
        "id": "0dd0dd01",
        "parentId": "935170bb",
        "timestamp": "2025-12-02T11:00:00.000Z",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "x"}],
            "usage": CASES[case],
            "stopReason": "stop",
        },
    }
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry, separators=(",", ":")) + "\n")
    return path


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_counts_a_bad_count_as_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: list[str]
) -> None:
    path = with_usage(tmp_path, case)
    before = path.read_bytes()
    code, out, err = run(capsys, command[0], str(path), *command[1:])  # raises on a traceback
    assert code == 0, err
    if "--json" in command:
        assert all(0 <= count < 10**9 for count in _token_counts(json.loads(out)))
    else:
        assert "~-" not in out
        assert "-100000" not in out
        assert str(HUGE) not in out
    assert "line 45: usage." in err  # the warning every command prints for a damaged file
    assert path.read_bytes() == before


def _token_counts(value: object) -> list[int]:
    # Every count the report gives (a key naming tokens), not the messages it quotes verbatim.
    if isinstance(value, list):
        return [count for item in value for count in _token_counts(item)]
    if not isinstance(value, dict):
        return []
    counts: list[int] = []
    for key, item in value.items():
        if "tokens" in key.lower() and type(item) is int:
            counts.append(item)
        elif key != "messages":
            counts.extend(_token_counts(item))
    return counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_names_a_bad_count_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = with_usage(tmp_path, case)
    before = path.read_bytes()
    code, out, _ = run(capsys, "check", str(path), "--json")
    assert code == 1
    (problem,) = json.loads(out)["problems"]
    assert (problem["line"], problem["code"]) == (45, "bad_usage")
    assert problem["message"].startswith(f"usage.{KEY[case]} of entry '0dd0dd01' is ")
    assert str(HUGE) not in problem["message"]
    assert path.read_bytes() == before


def test_context_counts_the_rest_of_the_usage() -> None:
    assert calculate_context_tokens({"input": HUGE, "output": 7, "totalTokens": 0}) == 7
    assert calculate_context_tokens({"input": 5, "output": 7, "totalTokens": HUGE}) == 12
    assert calculate_context_tokens({"input": 5, "output": 7, "totalTokens": -3}) == 12
    assert calculate_context_tokens({"input": -100000, "output": 2}) == 2
    assert calculate_prompt_tokens({"input": HUGE, "cacheRead": 3}) == 3
    assert calculate_prompt_tokens({"input": -5, "output": 4}) == 4
    # Each count in range, their sum not: as 1e308 + 1e308, counted as 0.
    assert calculate_prompt_tokens({"input": 10**308, "cacheRead": 10**308, "totalTokens": 1}) == 1


def test_a_token_count_is_a_finite_number_of_at_least_zero() -> None:
    assert is_token_count(0)
    assert is_token_count(3.5)
    assert is_token_count(10**308)
    for value in (-1, -0.5, HUGE, float("inf"), float("nan"), True, "3", None):
        assert not is_token_count(value)


def test_a_bad_count_does_not_stand_in_the_way_of_a_rewrite() -> None:
    # The entry loaded and is written back as it was: nothing a rewrite would erase.
    data = (
        b'{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/"}\n'
        b'{"type":"message","id":"a","parentId":null,"timestamp":"t",'
        b'"message":{"role":"assistant","content":[],"usage":{"input":-1}}}\n'
    )
    parsed = read_session(data)
    assert [p.code for p in parsed.result.problems] == ["bad_usage"]
    assert rewrite_refusal("f", parsed) is None


def test_only_numbers_that_are_not_counts_are_named() -> None:
    # A string, a boolean or null was tolerated silently before, and still is.
    usage = {"input": True, "output": "x", "cacheRead": 1.5, "cacheWrite": None, "totalTokens": -2}
    entry = {"type": "message", "id": "a", "message": {"role": "assistant", "usage": usage}}
    (problem,) = usage_problems([entry], [7])
    assert (problem.line, problem.code) == (7, "bad_usage")
    assert problem.message == (
        "usage.totalTokens of entry 'a' is -2, not a token count (negative); counted as 0"
    )
