import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.js_json import js_json
from orchestrator._core.serialize import (
    TOOL_RESULT_MAX_CHARS,
    format_tool_call,
    serialize_conversation,
    truncate_for_summary,
)
from orchestrator._core.tokens import estimate_tokens, json_length


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool_result(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "bash",
        "content": [{"type": "text", "text": text}],
        "isError": False,
        **extra,
    }


def test_long_tool_result_is_cut_with_pi_marker() -> None:
    text = serialize_conversation([tool_result("x" * 5000)])
    assert text == "[Tool result]: " + "x" * 2000 + "\n\n[... 3000 more characters truncated]"


def test_short_tool_result_is_exact() -> None:
    body = "y" * 1500
    assert serialize_conversation([tool_result(body)]) == "[Tool result]: " + body


def test_tool_result_at_the_limit_is_not_cut() -> None:
    body = "z" * TOOL_RESULT_MAX_CHARS
    assert serialize_conversation([tool_result(body)]) == "[Tool result]: " + body


def test_user_and_assistant_text_are_never_cut() -> None:
    long = "u" * 10_000
    assistant = {"role": "assistant", "content": [{"type": "text", "text": long}]}
    text = serialize_conversation([user(long), assistant])
    assert text == f"[User]: {long}\n\n[Assistant]: {long}"
    assert "truncated" not in text


def test_assistant_parts_in_pi_order_and_format() -> None:
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "first"},
            {"type": "toolCall", "id": "a", "name": "read", "arguments": {"path": "src/é.py"}},
            {"type": "thinking", "thinking": "hmm"},
            {"type": "thinking", "thinking": "ok"},
            {"type": "text", "text": "second"},
            {
                "type": "toolCall",
                "id": "b",
                "name": "edit",
                "arguments": {"z": 1.0, "a": [1, None, True], "o": {"k": "v"}},
            },
        ],
    }
    # pi 1.2 and later leave thinking out.
    assert serialize_conversation([assistant]) == (
        "[Assistant]: first\nsecond\n\n"
        '[Assistant tool calls]: read(path="src/é.py"); '
        'edit(z=1, a=[1,null,true], o={"k":"v"})'
    )


def test_user_blocks_join_without_separator_and_drop_images() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "b"},
        ],
    }
    assert serialize_conversation([message]) == "[User]: ab"


def test_empty_messages_produce_nothing() -> None:
    empty_assistant = {"role": "assistant", "content": []}
    assert serialize_conversation([user(""), empty_assistant, tool_result("")]) == ""


def test_other_roles_go_through_convert_to_llm_as_user_text() -> None:
    bash = {
        "role": "bashExecution",
        "command": "make",
        "output": "boom",
        "exitCode": 2,
        "cancelled": False,
        "truncated": False,
    }
    hidden = {**bash, "excludeFromContext": True}
    custom = {"role": "custom", "customType": "note", "content": "remember", "display": True}
    summary = {"role": "compactionSummary", "summary": "S", "tokensBefore": 10}
    text = serialize_conversation([bash, hidden, custom, summary])
    parts = text.split("\n\n[User]: ")
    assert parts[0] == "[User]: Ran `make`\n```\nboom\n```\n\nCommand exited with code 2"
    assert parts[1] == "remember"
    assert parts[2].endswith("<summary>\nS\n</summary>")
    assert len(parts) == 3


def test_pruned_tool_result_shows_its_notice() -> None:
    pruned = tool_result("[Output truncated - 900 tokens]", prunedAt=5, prunedContent=["x"])
    assert serialize_conversation([pruned]) == "[Tool result]: [Output truncated - 900 tokens]"


def test_truncate_counts_the_removed_characters() -> None:
    assert truncate_for_summary("abcdef", 2) == "ab\n\n[... 4 more characters truncated]"


def test_js_json_numbers_match_javascript() -> None:
    cases = {
        1.0: "1",
        -0.0: "0",
        0.1: "0.1",
        1e-5: "0.00001",
        1e-6: "0.000001",
        1e-7: "1e-7",
        1e16: "10000000000000000",
        1e21: "1e+21",
        1.5e300: "1.5e+300",
        float("nan"): "null",
        float("inf"): "null",
    }
    for value, expected in cases.items():
        assert js_json(value) == expected, value


def test_js_json_writes_integers_beyond_2_to_the_53_as_the_double_javascript_reads() -> None:
    # JSON.parse reads every number as a double; the stored integer stays exact (D2).
    assert js_json(2**53) == "9007199254740992"
    assert js_json(12345678901234567890) == "12345678901234567000"
    assert js_json(123456789012345678901234567890) == "1.2345678901234568e+29"
    assert js_json(-(10**400)) == "null"  # -Infinity
    assert (
        format_tool_call("bash", {"w": 123456789012345678901234567890})
        == "bash(w=1.2345678901234568e+29)"
    )


@pytest.mark.parametrize(
    ("value", "units"),
    # JSON.stringify({t: value}).length in node, for the value as the file holds it.
    [(1.0, 7), (100.0, 9), (1e20, 27), (-0.0, 7), (1e-7, 10), (123456789012345678901234567890, 28)],
)
def test_estimates_measure_tool_arguments_as_javascript_writes_them(
    value: object, units: int
) -> None:
    # Python's layout (1.0, 1e+20, 30 digits) made estimates, cut points and tokensBefore differ
    # from pi's on the same file (D26).
    assert json_length({"t": value}) == units
    message = {
        "role": "assistant",
        "content": [{"type": "toolCall", "id": "c", "name": "bash", "arguments": {"t": 1.0}}],
    }
    assert estimate_tokens(message) == 3  # pi's: ceil(("bash" + '{"t":1}').length / 4)


def test_js_json_keeps_non_ascii_and_escapes_controls() -> None:
    assert js_json('é\n"\x01') == '"é\\n\\"\\u0001"'


@given(
    st.recursive(
        # Integers JavaScript holds exactly; beyond 2^53 see the test above.
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=10,
    )
)
def test_js_json_is_compact_json(value: object) -> None:
    text = js_json(value)
    assert json.loads(text) == value
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_format_tool_call_keeps_key_order() -> None:
    assert format_tool_call("f", {"b": 1, "a": "x"}) == 'f(b=1, a="x")'
    assert format_tool_call("g", {}) == "g()"


def test_malformed_content_is_tolerated() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": None},
        {"role": "assistant", "content": "plain string reply"},
        {
            "role": "assistant",
            "content": ["junk", {"type": "image"}, {"type": "toolCall", "name": "f"}],
        },
        {"role": "assistant", "content": None},
        {"role": "toolResult", "toolCallId": "c", "content": ["junk", {"type": "text"}]},
    ]
    assert serialize_conversation(messages) == (
        "[Assistant]: plain string reply\n\n[Assistant tool calls]: f()"
    )


def test_js_json_prints_other_values_as_strings() -> None:
    assert js_json({1: (1.5, {2})}) == '{"1":[1.5,"{2}"]}'
