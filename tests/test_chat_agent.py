"""The shipped chat agent: tools, failures, and a whole session through litellm and the local
provider."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import pytest

from orchestrator._core.errors import TransientModelError
from orchestrator._core.model import ModelResponse, ToolCall
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._runtime.agent import AgentInput, ChatAgent, ToolSpec
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session
from orchestrator.testing import LocalProvider, Reply, ScriptedModel, summary_text

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def read_file(args: Mapping[str, Any]) -> str:
    return f"contents of {args['path']}"


async def broken(args: Mapping[str, Any]) -> str:
    raise FileNotFoundError(args["path"])


READ = ToolSpec(
    name="read",
    description="Read a file",
    run=read_file,
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
BROKEN = ToolSpec(
    name="broken", description="Always fails", run=broken, parameters={"type": "object"}
)


def turn(messages: list[dict[str, Any]]) -> AgentInput:
    return AgentInput(messages=messages, model=None, thinking_level="off", now_ms=lambda: 7)


async def collect(agent: ChatAgent, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m async for m in agent.run(turn(messages))]


async def test_tool_calls_run_and_the_loop_ends_on_a_plain_reply() -> None:
    model = ScriptedModel(
        [
            ModelResponse(
                text="Let me look.",
                stop_reason="toolUse",
                tool_calls=(
                    ToolCall(id="c1", name="read", arguments={"path": "a.py"}),
                    ToolCall(id="c2", name="broken", arguments={"path": "b.py"}),
                    ToolCall(id="c3", name="missing", arguments={}),
                ),
            ),
            ModelResponse(text="All done."),
        ]
    )
    agent = ChatAgent(model=model, tools=[READ, BROKEN])
    out = await collect(agent, [{"role": "user", "content": "go", "timestamp": 1}])
    assert [m["role"] for m in out] == [
        "assistant",
        "toolResult",
        "toolResult",
        "toolResult",
        "assistant",
    ]
    assert out[1]["content"][0]["text"] == "contents of a.py"
    assert out[1]["isError"] is False
    assert out[2]["content"][0]["text"] == "FileNotFoundError: b.py"
    assert out[2]["isError"] is True
    assert out[3]["content"][0]["text"] == "Tool missing not found"
    assert out[0]["content"][1] == {
        "type": "toolCall",
        "id": "c1",
        "name": "read",
        "arguments": {"path": "a.py"},
    }
    second = model.requests[1].messages
    assert second[1]["tool_calls"][0]["function"]["name"] == "read"
    assert [m["role"] for m in second[2:5]] == ["tool", "tool", "tool"]
    assert model.requests[0].tools[0]["function"]["name"] == "read"


async def test_a_provider_failure_becomes_an_error_reply() -> None:
    agent = ChatAgent(model=ScriptedModel([TransientModelError("503 overloaded")]))
    [reply] = await collect(agent, [{"role": "user", "content": "go", "timestamp": 1}])
    assert reply["stopReason"] == "error"
    assert reply["errorMessage"] == "503 overloaded"


def completion(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    prompt_tokens: int = 50,
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return Reply(
        body={
            "id": "chatcmpl-local",
            "object": "chat.completion",
            "created": 0,
            "model": "test-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 5,
                "total_tokens": prompt_tokens + 5,
            },
        }
    )


async def test_a_whole_turn_through_litellm_and_the_local_provider(tmp_path: Any) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": json.dumps({"path": "src/app.py"})},
    }
    replies = (
        completion(None, [call], finish="tool_calls"),
        completion("The app reads config twice."),
    )
    with LocalProvider(replies) as provider:
        model = LiteLLMModel("openai/test-model", api_base=provider.url + "/v1", api_key="test")
        runtime = AgentSession(
            Session.open(tmp_path / "s.jsonl"), agent=ChatAgent(model=model, tools=[READ])
        )
        result = await runtime.prompt("Why is startup slow?")
        requests = provider.requests
    assert result.reply is not None
    assert result.reply["content"] == [{"type": "text", "text": "The app reads config twice."}]
    roles = [e["message"]["role"] for e in runtime.session.tree.entries]
    assert roles == ["user", "assistant", "toolResult", "assistant"]
    assert runtime.session.tree.entries[1]["message"]["stopReason"] == "toolUse"
    assert runtime.session.tree.entries[-1]["message"]["usage"]["totalTokens"] == 55
    tool_message = requests[1].body["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "contents of src/app.py",
    }
    runtime.close()
    assert Session.open(tmp_path / "s.jsonl").problems == []


async def test_summaries_use_the_current_model_route_by_default() -> None:
    model = ScriptedModel(
        [
            ModelResponse(text="first answer " + "a" * 800),
            ModelResponse(text="second answer " + "b" * 800),
            ModelResponse(text=summary_text("Summarized by the chat model.")),
            ModelResponse(text=summary_text("And its turn prefix.", purpose="turn_prefix")),
        ]
    )
    runtime = AgentSession(Session.in_memory(), agent=ChatAgent(model=model))
    await runtime.prompt("question one " + "q" * 800)
    await runtime.prompt("question two " + "r" * 800)
    from orchestrator._core.tokens import CompactionSettings
    from orchestrator._runtime.types import RuntimeSettings

    runtime.settings = RuntimeSettings(
        compaction=CompactionSettings(keep_recent_tokens=100, adaptive_keep=False)
    )
    outcome = await runtime.compact()
    assert outcome.status == "committed"
    purposes = [r.purpose for r in model.requests]
    assert purposes[:2] == ["chat", "chat"]
    assert "history" in purposes[2:]
    assert "chat" not in purposes[2:]
    assert runtime.summarizer.candidates[0].name == model.name


@pytest.mark.parametrize("stop", ["stop", "length"])
async def test_tool_calls_run_whatever_the_stop_reason_says(stop: str) -> None:
    # A reply with tool calls and the default stop reason used to end the turn with the call
    # unanswered; a turn must never end on a dangling call.
    call = ToolCall(id="c1", name="read", arguments={"path": "a.py"})
    model = ScriptedModel(
        [
            ModelResponse(text="Reading.", stop_reason=stop, tool_calls=(call,)),
            ModelResponse(text="Done."),
        ]
    )
    agent = ChatAgent(model=model, tools=[READ])
    out = await collect(agent, [{"role": "user", "content": "go", "timestamp": 1}])
    assert [m["role"] for m in out] == ["assistant", "toolResult", "assistant"]
    assert out[1]["toolCallId"] == "c1"
    assert out[1]["content"][0]["text"] == "contents of a.py"
    assert out[0]["stopReason"] == ("toolUse" if stop == "stop" else "length")
    assert len(model.requests) == 2


def test_every_warning_filter_litellm_installs_is_in_force_in_every_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # litellm installs warning filters for the process when first imported; pytest undoes
    # them after the test that imported it. Unless the test configuration holds them too, the
    # result of a litellm call depends on which test imported litellm first (a test of
    # test_tui.py before this module made the whole turn above end in an empty error reply).
    from orchestrator._models.litellm import _load_litellm

    in_force = list(warnings.filters)  # before litellm, if not yet imported, adds its own
    _load_litellm()
    from litellm._process_defaults import apply_process_defaults

    monkeypatch.setenv("LITELLM_MODE", "PRODUCTION")  # no .env loading, only the filters
    with warnings.catch_warnings():
        warnings.resetwarnings()
        apply_process_defaults()
        installed = list(warnings.filters)
    assert installed, "litellm installs no warning filter any more: drop them from pyproject"
    for action, message, category, module, lineno in installed:
        assert message is not None
        covered = [
            f
            for f in in_force
            if f[0] == action and f[1] is not None and f[1].pattern == message.pattern
        ]
        assert covered, f"add 'ignore:{message.pattern}' to filterwarnings in pyproject.toml"
        assert (covered[0][2], covered[0][3], covered[0][4]) == (category, module, lineno)


@pytest.mark.parametrize(
    ("returned", "text"),
    [(None, ""), ({"lines": 3, "é": [1]}, '{"lines": 3, "é": [1]}'), (42, "42"), ("ok", "ok")],
)
async def test_a_tool_that_returns_no_text_is_given_as_text_to_the_file_and_the_model(
    returned: object, text: str
) -> None:
    # A tool returning None wrote "text": null into the session while the model read "None".
    async def odd(args: Mapping[str, Any]) -> Any:
        return returned

    model = ScriptedModel(
        [
            ModelResponse(
                text="",
                stop_reason="toolUse",
                tool_calls=(ToolCall(id="c1", name="odd", arguments={}),),
            ),
            ModelResponse(text="done"),
        ]
    )
    tool = ToolSpec(name="odd", description="odd", run=odd, parameters={"type": "object"})
    out = await collect(
        ChatAgent(model=model, tools=[tool]), [{"role": "user", "content": "go", "timestamp": 1}]
    )
    assert out[1]["content"] == [{"type": "text", "text": text}]
    assert out[1]["isError"] is False
    assert model.requests[1].messages[2]["content"] == text


async def test_the_sessions_system_messages_are_the_prompt() -> None:
    # pi 1.x keeps the prompt in the session: its system messages, replayed (sections patched by
    # name), are what the model is given; they are never sent as conversation.
    model = ScriptedModel([ModelResponse(text="ok")])
    agent = ChatAgent(model=model, system="the agent's own prompt")
    history = [
        {"role": "system", "content": "Base.", "sections": {"a": "A1", "b": "B"}, "timestamp": 1},
        {"role": "user", "content": "go", "timestamp": 2},
        {"role": "system", "content": "", "sections": {"a": "A2", "b": None}, "timestamp": 3},
    ]
    await collect(agent, history)
    request = model.requests[0]
    assert request.system == "Base.\n\nA2"
    assert [m["role"] for m in request.messages] == ["user"]
    plain = ScriptedModel([ModelResponse(text="ok")])
    await collect(ChatAgent(model=plain, system="own"), [{"role": "user", "content": "go"}])
    assert plain.requests[0].system == "own"
