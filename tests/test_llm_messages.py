import json
from typing import Any

from orchestrator._core.messages import (
    NO_RESULT,
    PRUNED_FALLBACK,
    TOOL_IMAGES_LEAD,
    bash_execution_text,
    convert_to_llm,
    to_llm_messages,
)
from orchestrator._core.prompts import render

Message = dict[str, Any]

IMAGE: Message = {"type": "image", "data": "QUJD", "mimeType": "image/jpeg"}


def call(call_id: str, name: str = "read", **arguments: Any) -> Message:
    return {"type": "toolCall", "id": call_id, "name": name, "arguments": arguments}


def assistant(*blocks: Message, stop: str = "toolUse") -> Message:
    return {"role": "assistant", "content": list(blocks), "stopReason": stop}


def result(call_id: str, *blocks: object, **extra: Any) -> Message:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "read",
        "content": list(blocks),
        "isError": False,
        **extra,
    }


def text(value: str) -> Message:
    return {"type": "text", "text": value}


def bash(**fields: Any) -> Message:
    base: Message = {"role": "bashExecution", "command": "ls", "output": "a\nb", "exitCode": 0}
    return {**base, "cancelled": False, "truncated": False, **fields}


def test_bash_text_matches_pi() -> None:
    assert bash_execution_text(bash()) == "Ran `ls`\n```\na\nb\n```"
    assert bash_execution_text(bash(output="")) == "Ran `ls`\n(no output)"
    assert bash_execution_text(bash(exitCode=1)).endswith("```\n\nCommand exited with code 1")
    cancelled = bash_execution_text(bash(exitCode=1, cancelled=True))
    assert cancelled.endswith("\n\n(command cancelled)")
    assert "exited" not in cancelled
    assert bash_execution_text(bash(exitCode=None)) == "Ran `ls`\n```\na\nb\n```"
    full = bash_execution_text(bash(truncated=True, fullOutputPath="/tmp/out.txt"))
    assert full.endswith("\n\n[Output truncated. Full output: /tmp/out.txt]")
    assert "Output truncated" not in bash_execution_text(bash(truncated=True))


def test_to_llm_messages_maps_every_role() -> None:
    messages = [
        {"role": "user", "content": "hi", "timestamp": 1},
        bash(timestamp=2),
        bash(excludeFromContext=True),
        {"role": "custom", "customType": "t", "content": "note", "display": True, "timestamp": 3},
        {"role": "compactionSummary", "summary": "C", "tokensBefore": 1, "timestamp": 4},
        {"role": "branchSummary", "summary": "B", "fromId": "x", "timestamp": 5},
        {"role": "somethingNew", "content": "?"},
    ]
    out = to_llm_messages(messages)
    assert [m["role"] for m in out] == ["user"] * 5
    assert out[0] is messages[0]
    assert out[1]["content"] == [text("Ran `ls`\n```\na\nb\n```")]
    assert out[2] == {"role": "user", "content": [text("note")], "timestamp": 3}
    assert out[3]["content"] == [text(render("compaction_context", summary="C"))]
    assert out[4]["content"] == [text(render("branch_context", summary="B"))]
    assert [m["timestamp"] for m in out] == [1, 2, 3, 4, 5]


def test_pruned_result_keeps_only_its_text() -> None:
    pruned = result("c", text("[Output truncated - 50 tokens]"), IMAGE, prunedAt=9)
    (out,) = to_llm_messages([pruned])
    assert out["content"] == [text("[Output truncated - 50 tokens]")]
    assert pruned["content"][1] == IMAGE  # the input is left alone
    (empty,) = to_llm_messages([result("c", prunedAt=9)])
    assert empty["content"] == [text(PRUNED_FALLBACK)]


def test_chat_conversion_of_a_tool_turn() -> None:
    messages = [
        {"role": "user", "content": "read it"},
        assistant(
            {"type": "thinking", "thinking": "secret"},
            text("Sure. "),
            text("Reading."),
            call("c1", path="é.py", limit=2),
        ),
        result("c1", text("line1"), text("line2")),
        assistant(text("Done."), stop="stop"),
    ]
    assert convert_to_llm(messages) == [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": "Sure. Reading.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"é.py","limit":2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "line1\nline2"},
        {"role": "assistant", "content": "Done."},
    ]


def test_tool_call_only_reply_has_null_content_and_json_arguments() -> None:
    out = convert_to_llm([assistant(call("c1", path="a")), result("c1", text("x"))])
    assert out[0]["content"] is None
    assert json.loads(out[0]["tool_calls"][0]["function"]["arguments"]) == {"path": "a"}


def test_user_images_become_image_url_parts() -> None:
    message = {"role": "user", "content": [text("look"), IMAGE]}
    (out,) = convert_to_llm([message])
    assert out["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
    ]


def test_tool_images_follow_the_tool_messages_in_a_user_message() -> None:
    messages = [
        assistant(call("c1"), call("c2")),
        result("c1", IMAGE),
        result("c2", text("ok")),
        {"role": "user", "content": "next"},
    ]
    out = convert_to_llm(messages)
    assert [m["role"] for m in out] == ["assistant", "tool", "tool", "user", "user"]
    assert out[1]["content"] == "(see attached image)"
    assert out[3]["content"][0] == {"type": "text", "text": TOOL_IMAGES_LEAD}
    assert out[3]["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert out[4] == {"role": "user", "content": "next"}


def test_missing_results_get_a_placeholder_and_orphans_are_dropped() -> None:
    messages = [
        result("ghost", text("orphan")),
        assistant(call("c1"), call("c2")),
        result("c2", text("two")),
        {"role": "user", "content": "go on"},
        assistant(call("c3")),
    ]
    out = convert_to_llm(messages)
    assert out == [
        out[0],
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "tool", "tool_call_id": "c1", "content": NO_RESULT},
        {"role": "user", "content": "go on"},
        out[4],
        {"role": "tool", "tool_call_id": "c3", "content": NO_RESULT},
    ]
    assert out[0]["role"] == "assistant"
    assert out[4]["role"] == "assistant"


def test_failed_and_aborted_replies_are_left_out_with_their_results() -> None:
    messages = [
        {"role": "user", "content": "q"},
        assistant(call("c1"), stop="error"),
        result("c1", text("late")),
        assistant(text("partial"), stop="aborted"),
        assistant(stop="stop"),
    ]
    assert convert_to_llm(messages) == [{"role": "user", "content": "q"}]


def test_summaries_and_bash_reach_the_chat_model_as_user_text() -> None:
    out = convert_to_llm(
        [{"role": "compactionSummary", "summary": "S", "tokensBefore": 3}, bash(exitCode=3)]
    )
    assert out[0]["content"] == [
        {"type": "text", "text": render("compaction_context", summary="S")}
    ]
    assert out[1]["content"][0]["text"].endswith("Command exited with code 3")


def test_odd_content_shapes_are_tolerated() -> None:
    messages: list[Message] = [
        {"role": "custom", "customType": "t", "content": None},
        {"role": "user", "content": [text("a"), {"type": "audio"}, "junk"]},
        assistant(text("x"), stop="stop"),
        {"role": "assistant", "content": "string reply", "stopReason": "stop"},
        {"role": "assistant", "content": None, "stopReason": "stop"},
        {"role": "custom", "customType": "t", "content": [text("blocks")]},
    ]
    out = convert_to_llm(messages)
    assert out == [
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": "string reply"},
        {"role": "user", "content": [{"type": "text", "text": "blocks"}]},
    ]
    (tool,) = convert_to_llm([assistant(call("c1")), result("c1", "junk")])[1:]
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": ""}
