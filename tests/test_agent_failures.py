"""Which chat-model failures the turn table sees as model failures, and which propagate.

Only our model errors (a :class:`ModelError`, with the kind its route found) become an error
reply that the turn table's overflow, transient and fatal rows act on; a bug or a cancellation
in the model call propagates and ends the turn with its own error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from trio.testing import MockClock

import orchestrator._models.litellm as litellm_model
from orchestrator._core.errors import (
    Cancelled,
    ContextOverflowError,
    ModelError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._core.tokens import CompactionSettings
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._runtime.agent import ChatAgent
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.session import Session
from orchestrator.testing import FakeClock, Hang, ScriptedModel

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def runtime_for(model: ScriptedModel, clock: FakeClock) -> AgentSession:
    return AgentSession(
        Session.in_memory(),
        agent=ChatAgent(model=model),
        settings=RuntimeSettings(
            context_window=100_000,
            compaction=CompactionSettings(keep_recent_tokens=100, adaptive_keep=False),
            retry=RetryPolicy(max_retries=2, base_delay_ms=1000),
        ),
        sleep=clock.sleep,
    )


def turn_moves(runtime: AgentSession, seen: list[Any]) -> list[tuple[str, str, str]]:
    return [
        (e.payload["source"], e.payload["event"], e.payload["dest"])
        for e in seen
        if e.type == "transition" and e.payload["machine"] == "turn"
    ]


async def test_a_transient_model_error_is_retried_even_when_its_words_say_nothing() -> None:
    # The route found a 502 by its status; the text alone would read as fatal.
    clock = FakeClock()
    model = ScriptedModel(
        [TransientModelError("litellm.BadGatewayError: boom"), ModelResponse(text="ok")]
    )
    runtime = runtime_for(model, clock)
    seen: list[Any] = []
    runtime.events.subscribe(seen.append)
    await runtime.prompt("hello")
    assert ("running", "transient_error", "retrying") in turn_moves(runtime, seen)
    assert len(model.requests) == 2
    failed = runtime.session.tree.entries[1]["message"]
    assert failed["stopReason"] == "error"
    assert failed["errorKind"] == "transient"  # kept in the file, beside pi's errorMessage
    assert runtime.session.tree.entries[-1]["message"]["content"][0]["text"] == "ok"


async def test_an_overflow_model_error_takes_the_overflow_row_even_when_its_words_do_not() -> None:
    clock = FakeClock()
    model = ScriptedModel([ContextOverflowError("litellm.ContextWindowExceededError: boom")])
    runtime = runtime_for(model, clock)
    seen: list[Any] = []
    runtime.events.subscribe(seen.append)
    await runtime.prompt("hello")
    moves = turn_moves(runtime, seen)
    assert [m for m in moves if m[0] == "running"][0][1] == "overflow"


async def test_a_fatal_model_error_is_still_judged_by_its_words() -> None:
    # "fatal" is ModelError's default: a message that says overflow is still an overflow.
    clock = FakeClock()
    model = ScriptedModel([ModelError("prompt is too long: 210000 tokens > 200000 maximum")])
    runtime = runtime_for(model, clock)
    seen: list[Any] = []
    runtime.events.subscribe(seen.append)
    await runtime.prompt("hello")
    assert [m for m in turn_moves(runtime, seen) if m[0] == "running"][0][1] == "overflow"


@pytest.mark.parametrize(
    "error",
    [TypeError("complete() got an unexpected keyword"), Cancelled("stop"), KeyError("usage")],
    ids=["TypeError", "Cancelled", "KeyError"],
)
async def test_a_bug_or_a_cancel_in_the_model_call_propagates_and_writes_no_error_reply(
    error: Exception,
) -> None:
    clock = FakeClock()
    runtime = runtime_for(ScriptedModel([error]), clock)
    with pytest.raises(type(error)):
        await runtime.prompt("hello")
    roles = [e["message"]["role"] for e in runtime.session.tree.entries]
    assert roles == ["user"]  # no assistant message pretends the provider failed
    assert runtime.state == "idle"  # the turn settled: the session can be used again
    model = ScriptedModel([ModelResponse(text="fine")])
    runtime.agent = ChatAgent(model=model)
    await runtime.prompt("again")
    assert runtime.session.tree.entries[-1]["message"]["content"][0]["text"] == "fine"


REQUEST = ModelRequest(purpose="chat", system="s", messages=(), max_tokens=10)
TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
# Without tools the route streams; with them, the call is answered in one piece.
BOTH_CALLS = pytest.mark.parametrize(
    "request_", [REQUEST, dataclasses.replace(REQUEST, tools=(TOOL,))], ids=["streamed", "whole"]
)


@BOTH_CALLS
@pytest.mark.parametrize("bug", [TypeError("bad kwargs"), AttributeError("no such attribute")])
async def test_litellm_route_lets_a_bug_through(
    monkeypatch: pytest.MonkeyPatch, bug: Exception, request_: ModelRequest
) -> None:
    async def acompletion(**kwargs: Any) -> Any:
        raise bug

    monkeypatch.setattr(
        litellm_model, "_load_litellm", lambda: SimpleNamespace(acompletion=acompletion)
    )
    with pytest.raises(type(bug)):
        await LiteLLMModel("openai/x", context_window=1000).complete(request_)


@BOTH_CALLS
async def test_litellm_route_still_classifies_a_providers_exception(
    monkeypatch: pytest.MonkeyPatch, request_: ModelRequest
) -> None:
    class APIConnectionError(Exception):
        pass

    async def acompletion(**kwargs: Any) -> Any:
        raise APIConnectionError("peer went away")

    monkeypatch.setattr(
        litellm_model, "_load_litellm", lambda: SimpleNamespace(acompletion=acompletion)
    )
    with pytest.raises(ModelError) as caught:
        await LiteLLMModel("openai/x", context_window=1000).complete(request_)
    assert caught.value.kind == "transient"


@pytest.mark.parametrize(
    "anyio_backend",
    # trio's mock clock jumps ahead whenever every task waits: the timeout takes no real time.
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock-clock")],
)
async def test_a_chat_call_that_never_answers_times_out_and_the_turn_retries_it() -> None:
    model = ScriptedModel([Hang(), ModelResponse(text="late but fine")])
    runtime = AgentSession(
        Session.in_memory(),
        agent=ChatAgent(model=model, timeout_s=30),
        settings=RuntimeSettings(retry=RetryPolicy(max_retries=2, base_delay_ms=1000)),
    )
    seen: list[Any] = []
    runtime.events.subscribe(seen.append)
    await runtime.prompt("hello")
    failed = runtime.session.tree.entries[1]["message"]
    assert failed["stopReason"] == "error"
    assert failed["errorKind"] == "timeout"
    assert failed["errorMessage"] == "scripted/model: no answer after 30 s"
    assert ("running", "transient_error", "retrying") in turn_moves(runtime, seen)
    assert runtime.session.tree.entries[-1]["message"]["content"][0]["text"] == "late but fine"


def test_serve_and_tui_give_their_chat_agent_the_timeout(tmp_path: Any) -> None:
    import argparse
    import shutil

    from orchestrator._cli.serve import _options
    from orchestrator._cli.serve import register as register_serve
    from orchestrator._cli.tui import build_runtime
    from orchestrator._cli.tui import register as register_tui

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    register_serve(commands)
    register_tui(commands)
    options = _options(parser.parse_args(["serve", "--model", "openai/x", "--timeout", "7"]))
    assert options.agent_factory is not None
    agent = options.agent_factory()
    assert isinstance(agent, ChatAgent)
    assert agent.timeout_s == 7
    untimed = _options(parser.parse_args(["serve", "--model", "openai/x"]))
    assert untimed.agent_factory is not None
    assert untimed.agent_factory().timeout_s is None  # type: ignore[attr-defined]
    session = tmp_path / "s.jsonl"
    shutil.copy(Path(__file__).parent / "data" / "example-session.jsonl", session)
    args = parser.parse_args(
        ["tui", str(session), "--model", "openai/x", "--chat", "--timeout", "9"]
    )
    runtime = build_runtime(args)
    try:
        assert isinstance(runtime.agent, ChatAgent)
        assert runtime.agent.timeout_s == 9
    finally:
        runtime.close()
