"""A missing or rejected key is fatal at once: no retry sends the same (absent) key again.

With no API key, ``--model openai/...`` waited through three retries (24 s): litellm reports the
missing key as a 500 ``InternalServerError``. Every route here points at 127.0.0.1 (the local
provider); nothing reaches the internet, and the OpenAI client refuses before any request.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import ModelError
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._models.remote import RemoteSummaryModel
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator.testing import FakeClock, LocalProvider, Reply
from tests.cli_kit import run


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)


def _compact(example: Path, model: object) -> tuple[ModelError, FakeClock]:
    clock = FakeClock()

    async def go() -> ModelError:
        runtime = AgentSession.open(
            example,
            owner="test",
            summarizer=SummaryRoutes(candidates=(model,), sleep=clock.sleep),  # type: ignore[arg-type]
            sleep=clock.sleep,
        )
        try:
            with pytest.raises(ModelError) as failed:
                await runtime.compact()
        finally:
            runtime.close()
            if isinstance(model, RemoteSummaryModel):
                await model.aclose()  # its connections, before the provider stops
        return failed.value

    return anyio.run(go), clock


def test_no_key_is_fatal_without_a_retry(example: Path, no_key: None) -> None:
    before = example.read_bytes()
    with LocalProvider() as provider:
        model = LiteLLMModel("openai/test-model", api_base=provider.url + "/v1")
        error, clock = _compact(example, model)
        assert provider.requests == ()  # refused before any request
    assert error.kind == "fatal"
    assert "Missing credentials" in str(error)
    assert clock.sleeps == []  # it waited 2 + 4 + 8 s (and more) before
    assert example.read_bytes() == before


def test_the_command_line_gives_up_at_once(
    example: Path, no_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalProvider() as provider:
        route = ["--model", "openai/m", "--api-base", provider.url + "/v1"]
        code, _, err = run(capsys, "compact", str(example), *route)
    assert code == 1
    assert "Missing credentials" in err
    assert "did not finish within" not in err  # no retries running into the deadline


@pytest.mark.parametrize("route", ["litellm", "remote"])
@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_key_is_fatal_on_both_routes(example: Path, status: int, route: str) -> None:
    replies = tuple(Reply.error(status, "Incorrect API key provided") for _ in range(6))
    with LocalProvider(replies) as provider:
        model = (
            LiteLLMModel("openai/m", api_base=provider.url + "/v1", api_key="wrong-key")
            if route == "litellm"
            else RemoteSummaryModel(provider.url + "/summary")
        )
        error, clock = _compact(example, model)
        bodies = [request.raw for request in provider.requests]
    assert (error.kind, clock.sleeps) == ("fatal", [])
    # At most one attempt for each of the example's two parts (history, prefix): the first
    # rejection cancels the operation, sometimes before the other part was sent at all.
    assert 1 <= len(bodies) <= 2
    assert len(set(bodies)) == len(bodies)  # no part asked twice: no retry
