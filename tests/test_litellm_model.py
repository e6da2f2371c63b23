import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

import orchestrator._models.litellm as litellm_model
from orchestrator._core.errors import (
    ContextOverflowError,
    EmptyReplyError,
    FatalModelError,
    ModelTimeoutError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest, ToolCall, Usage
from orchestrator._models.litellm import LiteLLMModel, response_from_litellm
from orchestrator.testing import LocalProvider, Reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # litellm's acompletion runs on asyncio only.
    return "asyncio"


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as running:
        yield running


def model_for(provider: LocalProvider) -> LiteLLMModel:
    return LiteLLMModel("openai/test-model", api_base=provider.url + "/v1", api_key="test")


REQUEST = ModelRequest(
    purpose="history",
    system="You summarise.",
    messages=({"role": "user", "content": "the conversation"},),
    max_tokens=321,
    reasoning="high",
)


async def test_success_maps_text_stop_reason_and_usage(provider: LocalProvider) -> None:
    provider.push(
        Reply.summary("the summary", prompt_tokens=100, completion_tokens=7, cached_tokens=40)
    )
    response = await model_for(provider).complete(REQUEST)
    assert response.text == "the summary"
    assert response.stop_reason == "stop"
    assert response.usage == Usage(input=60, output=7, cache_read=40, total=107)
    assert response.model == "test-model"
    assert response.provider == "openai"
    (sent,) = provider.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer test"
    assert sent.body["messages"] == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "the conversation"},
    ]
    assert sent.body["max_tokens"] == 321
    # Reasoning is only sent to routes that support it.
    assert "reasoning_effort" not in sent.body
    assert "tools" not in sent.body


def test_arguments_pass_reasoning_tools_and_no_retries() -> None:
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    request = ModelRequest(
        purpose="chat",
        system="",
        messages=({"role": "user", "content": "hi"},),
        max_tokens=5,
        reasoning="high",
        tools=(tool,),
    )
    kwargs = LiteLLMModel("anthropic/claude", reasoning_supported=True, timeout=9).arguments(
        request
    )
    assert kwargs == {
        "model": "anthropic/claude",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "timeout": 9,
        "max_retries": 0,
        "num_retries": 0,
        "reasoning_effort": "high",
        "tools": [tool],
    }
    model = LiteLLMModel("anthropic/claude", context_window=200_000)
    assert (model.name, model.context_window) == ("anthropic/claude", 200_000)


async def test_rate_limit_is_transient_with_retry_after(provider: LocalProvider) -> None:
    provider.push(Reply.rate_limited(retry_after=7))
    with pytest.raises(TransientModelError) as caught:
        await model_for(provider).complete(REQUEST)
    error = caught.value
    assert (error.kind, error.retry_after, error.status) == ("transient", 7.0, 429)
    assert type(error.__cause__).__name__ == "RateLimitError"
    assert len(provider.requests) == 1  # litellm made exactly one attempt


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_transient(provider: LocalProvider, status: int) -> None:
    provider.push(Reply.error(status, "upstream trouble"))
    with pytest.raises(TransientModelError) as caught:
        await model_for(provider).complete(REQUEST)
    assert (caught.value.kind, caught.value.status) == ("transient", status)
    assert len(provider.requests) == 1


@pytest.mark.parametrize(
    "reply", [Reply.overflow_openai(), Reply.overflow_anthropic(), Reply.overflow_llamacpp()]
)
async def test_overflow_wordings(provider: LocalProvider, reply: Reply) -> None:
    provider.push(reply)
    with pytest.raises(ContextOverflowError) as caught:
        await model_for(provider).complete(REQUEST)
    assert caught.value.kind == "overflow"
    assert len(provider.requests) == 1


async def test_other_client_errors_are_fatal(provider: LocalProvider) -> None:
    provider.push(Reply.error(401, "Incorrect API key provided"))
    with pytest.raises(FatalModelError) as caught:
        await model_for(provider).complete(REQUEST)
    assert (caught.value.kind, caught.value.status) == ("fatal", 401)


async def test_length_and_empty_are_reported_not_judged(provider: LocalProvider) -> None:
    provider.push(Reply.summary("half a sum", finish_reason="length"), Reply.summary(""))
    model = model_for(provider)
    truncated = await model.complete(REQUEST)
    assert (truncated.text, truncated.stop_reason) == ("half a sum", "length")
    empty = await model.complete(REQUEST)
    assert (empty.text, empty.stop_reason) == ("", "stop")


async def test_malformed_body_is_a_model_error(provider: LocalProvider) -> None:
    provider.push(Reply.malformed())
    with pytest.raises(TransientModelError) as caught:
        await model_for(provider).complete(REQUEST)
    # litellm reports an unparsable body as a 500: worth one more try.
    assert caught.value.kind == "transient"
    assert len(provider.requests) == 1


async def test_refused_connection_is_transient() -> None:
    with LocalProvider() as stopped:
        model = model_for(stopped)
    with pytest.raises(TransientModelError) as caught:
        await model.complete(REQUEST)
    assert caught.value.kind == "transient"


async def test_tool_calls(provider: LocalProvider) -> None:
    body = json.loads(json.dumps(Reply.summary("").body))
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}
    ]
    provider.push(Reply(body=body))
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    chat = dataclasses.replace(REQUEST, purpose="chat", tools=(tool,))
    response = await model_for(provider).complete(chat)
    assert response.stop_reason == "toolUse"
    assert response.tool_calls == (ToolCall(id="call_1", name="read", arguments={"p": 1}),)
    # A chat turn (a request with tools) is answered in one piece, its tool calls whole.
    assert "stream" not in provider.requests[0].body


async def test_hang_is_cancelled_by_the_callers_scope(provider: LocalProvider) -> None:
    provider.push(Reply.hang())
    finished = False
    # The bound is only a safety net: the scope is cancelled as soon as the server holds the call.
    with anyio.move_on_after(30) as safety, anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                nonlocal finished
                await model_for(provider).complete(REQUEST)
                finished = True

            tg.start_soon(call)
            while not provider.requests:
                await anyio.wait_all_tasks_blocked()
                await anyio.lowlevel.checkpoint()
            scope.cancel()
    assert scope.cancelled_caught
    assert not safety.cancelled_caught
    assert not finished
    assert len(provider.requests) == 1
    provider.release()


def test_response_mapping_edge_cases() -> None:
    message = SimpleNamespace(
        content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, "junk"],
        reasoning_content="thought",
        tool_calls=[
            SimpleNamespace(id="1", function=SimpleNamespace(name="f", arguments="not json")),
            SimpleNamespace(id="2", function=SimpleNamespace(name="g", arguments="[1]")),
            SimpleNamespace(id="3", function=SimpleNamespace(name="h", arguments=None)),
        ],
    )
    raw = SimpleNamespace(
        choices=[SimpleNamespace(message=message, finish_reason="content_filter")],
        usage=SimpleNamespace(
            prompt_tokens=50, completion_tokens=3, cache_creation_input_tokens=20
        ),
        model=None,
    )
    response = response_from_litellm(raw, fallback_model="fallback")
    assert response.text == "a\nb"
    assert response.stop_reason == "error"
    assert response.thinking == "thought"
    assert response.model == "fallback"
    assert response.provider == ""
    assert response.usage == Usage(input=30, output=3, cache_write=20)
    assert [c.arguments for c in response.tool_calls] == [{"_raw": "not json"}, {"_value": [1]}, {}]
    bare = SimpleNamespace(
        choices=[SimpleNamespace(message=SimpleNamespace(content=None), finish_reason="odd")]
    )
    assert response_from_litellm(bare) == response_from_litellm(bare, fallback_model="")
    assert response_from_litellm(bare).text == ""
    assert response_from_litellm(bare).stop_reason == "stop"
    assert response_from_litellm(bare).usage == Usage()


def test_loading_litellm_pins_the_local_cost_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    monkeypatch.setattr(litellm_model, "_litellm", None)
    module = litellm_model._load_litellm()
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert module.suppress_debug_info is True
    assert litellm_model._load_litellm() is module


@pytest.mark.slow
def test_loading_litellm_reads_no_dotenv_file_from_the_working_directory(
    tmp_path: Path,
) -> None:
    # litellm's import loads ./.env into os.environ in its default mode; ours must not.
    folder = tmp_path
    (folder / ".env").write_text("ORCHESTRATOR_SURPRISE=from-dotenv\n")
    code = (
        "import os, orchestrator._models.litellm as m; m._load_litellm(); "
        "print(os.environ.get('ORCHESTRATOR_SURPRISE'), os.environ.get('LITELLM_MODE'))"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("LITELLM_MODE", "ORCHESTRATOR_SURPRISE")
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=folder,
        env=env,
    )
    assert out.stdout.split() == ["None", "None"]


@pytest.mark.slow
def test_importing_the_package_does_not_import_litellm() -> None:
    code = (
        "import sys, orchestrator, orchestrator._models.litellm, orchestrator.testing, "
        "orchestrator._runtime.operation.retry, orchestrator._models.remote; "
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_window_and_reasoning_come_from_litellms_bundled_map_when_not_given() -> None:
    from orchestrator._core.model import ModelRequest
    from orchestrator._models.litellm import LiteLLMModel

    known = LiteLLMModel("openai/gpt-4o-mini", context_window=None, reasoning_supported=None)
    assert known.context_window == 128000
    request = ModelRequest(
        purpose="history", system="s", messages=(), max_tokens=10, reasoning="high"
    )
    assert "reasoning_effort" not in known.arguments(request)
    thinker = LiteLLMModel("openai/o3-mini", reasoning_supported=None)
    assert thinker.arguments(request)["reasoning_effort"] == "high"
    unknown = LiteLLMModel(
        "nobody/never-heard-of-it", context_window=None, reasoning_supported=None
    )
    assert unknown.context_window == 0
    assert "reasoning_effort" not in unknown.arguments(request)


def test_an_answer_without_a_choice_is_an_empty_failure_not_an_index_error() -> None:
    # A provider answering {"choices": []} made the route raise IndexError out of prompt().
    for raw in (
        SimpleNamespace(choices=[], model="m"),
        SimpleNamespace(choices=None, model="m"),
        SimpleNamespace(choices=[SimpleNamespace(message=None, finish_reason="stop")], model=""),
    ):
        with pytest.raises(EmptyReplyError, match="answered with no message") as caught:
            response_from_litellm(raw, fallback_model="fallback")
        assert caught.value.kind == "empty"


def quiet_after(seconds: float) -> ModelRequest:
    """``REQUEST`` with an idle timeout (the runtime sets it from its settings)."""
    return dataclasses.replace(REQUEST, idle_timeout_s=seconds)


async def test_a_summary_streams_and_its_text_stop_reason_and_usage_survive(
    provider: LocalProvider,
) -> None:
    provider.push(Reply.stream("the streamed summary", prompt_tokens=100, completion_tokens=7))
    response = await model_for(provider).complete(REQUEST)
    assert response.text == "the streamed summary"
    assert response.stop_reason == "stop"
    assert response.usage == Usage(input=100, output=7, total=107)
    assert (response.model, response.provider) == ("test-model", "openai")
    (sent,) = provider.requests
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}


async def test_a_stream_cut_by_the_length_limit_says_length(provider: LocalProvider) -> None:
    provider.push(Reply.stream("cut off in the mid", finish_reason="length"))
    response = await model_for(provider).complete(REQUEST)
    assert (response.text, response.stop_reason) == ("cut off in the mid", "length")


async def test_a_stream_that_keeps_coming_outlasts_its_idle_timeout(
    provider: LocalProvider,
) -> None:
    # 80 chunks 20 ms apart: 1.6 s in all, longer than the 1 s of silence allowed.
    text = " ".join(f"w{n}" for n in range(80))
    provider.push(Reply.stream(text, chunk_delay=0.02))
    response = await model_for(provider).complete(quiet_after(1.0))
    assert response.text == text


@pytest.mark.parametrize(
    "reply", [Reply.hang(), Reply.stream("a b c d", stall_after=3)], ids=["silent", "stalled"]
)
async def test_a_provider_that_goes_silent_fails_at_the_idle_timeout(
    provider: LocalProvider, reply: Reply
) -> None:
    provider.push(reply)
    silent = r"openai/test-model: nothing received for 0\.3 s"
    with pytest.raises(ModelTimeoutError, match=silent) as c:
        await model_for(provider).complete(quiet_after(0.3))
    assert c.value.kind == "timeout"
    assert len(provider.requests) == 1
    provider.release()
