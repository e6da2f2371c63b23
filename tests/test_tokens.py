"""Token estimates and the trigger (D5, D6)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from orchestrator._core.tokens import (
    CompactionSettings,
    calculate_context_tokens,
    compaction_threshold,
    estimate_context_tokens,
    estimate_tokens,
    should_compact,
)


def test_calculate_context_tokens_sums_parts_when_total_missing() -> None:
    assert (
        calculate_context_tokens(
            {"input": 1000, "output": 500, "cacheRead": 200, "cacheWrite": 100}
        )
        == 1800
    )
    assert calculate_context_tokens({"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}) == 0
    assert calculate_context_tokens({"totalTokens": 0, "input": 3, "output": 4}) == 7
    assert calculate_context_tokens({"totalTokens": 42, "input": 3}) == 42


def test_estimate_user_counts_images_as_4800_chars() -> None:
    # pi 1.x (0.76.0): an image in a user message counts too; pi 0.73 counted none.
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "x" * 9}, {"type": "image", "data": "..."}],
    }
    assert estimate_tokens(message) == 1203


def test_estimate_system_message_counts_content_sections_and_tools() -> None:
    # pi 1.x: content, every section still present, and JSON.stringify(toolsAdded).
    tools = [{"name": "read", "description": "Read a file", "parameters": {}}]
    message = {
        "role": "system",
        "content": "x" * 10,
        "sections": {"preamble": "y" * 7, "gone": None},
        "toolsAdded": tools,
    }
    tool_chars = len('[{"name":"read","description":"Read a file","parameters":{}}]')
    assert estimate_tokens(message) == -(-(10 + 7 + tool_chars) // 4)
    assert estimate_tokens({"role": "system", "content": ""}) == 0


def test_estimate_tool_result_counts_images_as_4800_chars() -> None:
    message = {
        "role": "toolResult",
        "content": [{"type": "text", "text": "abcd"}, {"type": "image", "data": ""}],
    }
    assert estimate_tokens(message) == math.ceil((4 + 4800) / 4)


def test_estimate_assistant_counts_text_thinking_and_calls() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "text", "text": "ok"},
            {"type": "toolCall", "id": "c1", "name": "read", "arguments": {"path": "a.py"}},
        ],
    }
    # 3 + 2 + len("read") + len('{"path":"a.py"}')
    assert estimate_tokens(message) == math.ceil((3 + 2 + 4 + 15) / 4)


def test_estimate_bash_and_summaries() -> None:
    assert estimate_tokens({"role": "bashExecution", "command": "ls", "output": "a\nb"}) == 2
    assert estimate_tokens({"role": "compactionSummary", "summary": "s" * 8}) == 2
    assert estimate_tokens({"role": "branchSummary", "summary": "s" * 9}) == 3
    assert estimate_tokens({"role": "somethingElse", "content": "xxxx"}) == 0


def test_d6_custom_messages_are_counted() -> None:
    assert estimate_tokens({"role": "custom", "content": "x" * 40}) == 10


def test_estimate_context_anchors_on_last_valid_usage() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "x" * 400},
        {"role": "assistant", "content": [], "stopReason": "stop", "usage": {"totalTokens": 1000}},
        {"role": "user", "content": "y" * 40},
        {"role": "assistant", "content": [], "stopReason": "aborted", "usage": {"totalTokens": 9}},
    ]
    tokens = estimate_context_tokens(messages)
    assert tokens.last_usage_index == 1
    assert tokens.usage_tokens == 1000
    assert tokens.trailing_tokens == 10
    assert tokens.tokens == 1010


def test_estimate_context_without_usage_estimates_everything() -> None:
    tokens = estimate_context_tokens([{"role": "user", "content": "x" * 40}])
    assert (tokens.tokens, tokens.last_usage_index) == (10, None)


def test_d5_threshold_is_strict() -> None:
    settings = CompactionSettings(reserve_tokens=10000)
    assert should_compact(95000, 100000, settings)
    assert not should_compact(89000, 100000, settings)
    assert not should_compact(90000, 100000, settings)
    assert should_compact(90001, 100000, settings)


def test_d5_disabled_turns_trigger_off() -> None:
    assert not should_compact(10**9, 100000, CompactionSettings(enabled=False))
    assert not should_compact(10, 0, CompactionSettings())


@pytest.mark.parametrize(
    ("settings", "threshold"),
    [
        (CompactionSettings(threshold_percent=90), 90000),
        (CompactionSettings(threshold_percent=150), 99000),
        (CompactionSettings(threshold_tokens=50000), 50000),
        (CompactionSettings(threshold_tokens=10**7), 99999),
        (CompactionSettings(threshold_tokens=-1, threshold_percent=-1), 100000 - 16384),
    ],
)
def test_optional_thresholds(settings: CompactionSettings, threshold: int) -> None:
    assert compaction_threshold(100000, settings) == threshold
