"""Summaries stream: liveness is an idle timeout, and the operation's deadline is generous.

A local model needed 1 m 46 s for the example session, and a large one streams for minutes:
with a 30 s cut per call and 45 s per operation both failed. Here a real litellm route talks to
the local provider, with every time limit of the default settings scaled down by ``SCALE`` (one
second of a real provider is ``SCALE`` seconds here), so the tests take seconds. The limits are
the library's own; no test bounds its own wall-clock time.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelRequest
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.routes import RouteSettings, build_summarizer
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import EXAMPLE, either_part

pytestmark = pytest.mark.anyio

SCALE = 0.02
"""Seconds here per second of a real provider."""

OLD_DEADLINE_S = 45.0
"""The operation deadline before summaries streamed: no summary could take longer."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # litellm runs on asyncio only


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as running:
        yield running


def scaled() -> RuntimeSettings:
    """The default settings, each time limit scaled down by ``SCALE``."""
    default = RuntimeSettings()
    assert default.model_idle_timeout_s == 60.0
    assert default.operation_deadline_s == 900.0
    return RuntimeSettings(
        model_idle_timeout_s=default.model_idle_timeout_s * SCALE,
        model_timeout_s=(default.model_timeout_s or 0) * SCALE,
        operation_deadline_s=default.operation_deadline_s * SCALE,
    )


async def warmed(provider: LocalProvider) -> int:
    """Make one call first; returns how many requests the provider has had.

    litellm imports the rest of itself at its first call (0.3 to 0.6 s here, more on a busy
    machine): the scaled idle timeout (1.2 s) must measure the provider, not that.
    """
    provider.push(Reply.stream("warm"))
    request = ModelRequest(purpose="history", system="", messages=(), max_tokens=5)
    model = LiteLLMModel("openai/test-model", api_base=provider.url + "/v1", api_key="test")
    await model.complete(request)
    return len(provider.requests)


def runtime_for(path: Path, provider: LocalProvider) -> AgentSession:
    retry = RetryPolicy()  # its waits scaled too
    routes = RouteSettings(
        models=("openai/test-model",),
        api_base=provider.url + "/v1",
        api_key="test",
        offline_fallback=False,
        retry=RetryPolicy(
            base_delay_ms=int(retry.base_delay_ms * SCALE),
            switch_after_ms=int(retry.switch_after_ms * SCALE),
            max_delay_ms=int(retry.max_delay_ms * SCALE),
        ),
    )
    return AgentSession.open(path, summarizer=build_summarizer(routes), settings=scaled())


@pytest.fixture
def example(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    return path


async def test_a_summary_streamed_for_longer_than_the_old_deadline_is_committed(
    example: Path, provider: LocalProvider
) -> None:
    # One token per (scaled) second, for longer than the old 45 s deadline: the bytes keep
    # coming, so the idle timeout never passes, and the deadline is far off.
    text = either_part("Streamed slowly.")
    chunks = len(Reply.stream(text).events or ())
    assert chunks > OLD_DEADLINE_S
    slow = Reply.stream(text, chunk_delay=SCALE, prompt_tokens=900, completion_tokens=300)
    warm = await warmed(provider)
    provider.push(slow, slow)  # a split turn asks twice
    runtime = runtime_for(example, provider)
    try:
        outcome = await runtime.compact()
    finally:
        runtime.close()
    assert outcome.status == "committed"
    entry = outcome.entry
    assert entry is not None
    assert "Streamed slowly." in entry["summary"]
    calls = provider.requests[warm:]
    # The usage the stream's last chunk carried is recorded on the entry.
    assert entry["usage"]["input"] == 900 * len(calls)
    assert entry["usage"]["output"] == 300 * len(calls)
    assert all(request.body["stream"] is True for request in calls)


@pytest.mark.parametrize(
    ("replies", "kind", "message"),
    [
        ((Reply.hang(),) * 8, "timeout", "nothing received for 1.2 s"),
        ((Reply.stream(either_part("Cut."), finish_reason="length"),) * 8, "truncated", "trunc"),
    ],
    ids=["silent", "truncated"],
)
async def test_a_silent_or_truncated_stream_fails_and_changes_nothing(
    example: Path, provider: LocalProvider, replies: tuple[Reply, ...], kind: str, message: str
) -> None:
    await warmed(provider)
    provider.push(*replies)
    before = example.read_bytes()
    runtime = runtime_for(example, provider)
    try:
        with pytest.raises(ModelError, match=message) as caught:
            await runtime.compact()
    finally:
        runtime.close()
        provider.release()
    assert caught.value.kind == kind
    assert example.read_bytes() == before


def test_the_temporal_twin_lets_a_model_call_run_until_the_deadline() -> None:
    # Its call_model activity heartbeats every second (heartbeat.py) and was cut at the model
    # timeout plus 30 s; a streamed summary may now take most of the deadline.
    from orchestrator._cluster.calls import Policy
    from orchestrator._cluster.operation.flow import LONG_CALL, model_call_limit

    deadline = RuntimeSettings().operation_deadline_s
    assert model_call_limit(Policy(timeout_s=120.0, deadline_s=deadline)) == timedelta(seconds=930)
    assert model_call_limit(Policy(timeout_s=120.0)) == LONG_CALL
