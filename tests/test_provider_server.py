import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from orchestrator._models.provider_server import MAX_DELAY, LocalProvider, Reply


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as running:
        yield running


def post(url: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_answers_in_order_and_records_requests(provider: LocalProvider) -> None:
    provider.push(Reply.summary("one", cached_tokens=2), Reply.remote("two", shortSummary="s"))
    status, _, raw = post(provider.url + "/v1/chat/completions", b'{"model": "m"}')
    assert status == 200
    body = json.loads(raw)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "one"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    status, _, raw = post(provider.url + "/summary", b"not json")
    assert (status, json.loads(raw)) == (200, {"summary": "two", "shortSummary": "s"})
    first, second = provider.requests
    assert (first.path, first.body, first.raw) == (
        "/v1/chat/completions",
        {"model": "m"},
        b'{"model": "m"}',
    )
    assert (second.path, second.body, second.raw) == ("/summary", None, b"not json")
    assert first.headers["content-type"] == "application/json"


def test_empty_queue_answers_a_fatal_400(provider: LocalProvider) -> None:
    status, _, raw = post(provider.url + "/v1/chat/completions", b"{}")
    assert status == 400
    assert json.loads(raw)["error"]["message"] == "LocalProvider has no scripted reply left"


def test_error_replies(provider: LocalProvider) -> None:
    provider.push(
        Reply.rate_limited(retry_after=2.5),
        Reply.rate_limited(),
        Reply.error(503, "busy", retry_after_ms="700"),
        Reply.overflow_openai(),
        Reply.overflow_anthropic(),
        Reply.overflow_llamacpp(),
        Reply.malformed(),
    )
    url = provider.url + "/v1/chat/completions"
    status, headers, _ = post(url, b"{}")
    assert (status, headers["retry-after"]) == (429, "2.5")
    status, headers, _ = post(url, b"{}")
    assert status == 429
    assert "retry-after" not in {k.lower() for k in headers}
    status, headers, _ = post(url, b"{}")
    assert (status, headers["retry-after-ms"]) == (503, "700")
    status, _, raw = post(url, b"{}")
    error = json.loads(raw)["error"]
    assert (status, error["code"]) == (400, "context_length_exceeded")
    assert error["message"].startswith("This model's maximum context length is 8192 tokens.")
    assert "prompt is too long: 210000 tokens > 200000 maximum" in post(url, b"{}")[2].decode()
    assert b"exceeds the available context size" in post(url, b"{}")[2]
    status, _, raw = post(url, b"{}")
    assert (status, raw) == (200, b"{this is not json")


def test_url_needs_a_running_server() -> None:
    provider = LocalProvider()
    with pytest.raises(RuntimeError, match="not running"):
        _ = provider.url
    provider.stop()  # stopping a provider that never started is harmless


def test_delay_is_clamped() -> None:
    assert Reply.summary("x", delay=10_000).delay == MAX_DELAY
    assert Reply.summary("x", delay=-1).delay == 0.0


@pytest.mark.anyio
async def test_hang_holds_until_released(provider: LocalProvider) -> None:
    provider.push(Reply.hang())
    result: list[httpx.Response] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            result.append(await client.post(provider.url + "/v1/chat/completions", json={}))

        tg.start_soon(call)
        while not provider.requests:
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        assert result == []
        provider.release()
    assert result[0].json()["choices"][0]["message"]["content"] == "released"


@pytest.mark.anyio
async def test_delay_ends_early_when_the_provider_stops() -> None:
    provider = LocalProvider((Reply.summary("slow", delay=MAX_DELAY),)).start()
    result: list[httpx.Response] = []
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:

        async def call() -> None:
            result.append(await client.post(provider.url + "/v1/chat/completions", json={}))

        tg.start_soon(call)
        while not provider.requests:
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
        assert result == []
        provider.stop()
    assert result[0].json()["choices"][0]["message"]["content"] == "slow"
