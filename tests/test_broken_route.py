"""A summary route that returns something other than a response is a broken route (fatal).

It used to be read as "no answer after 30 s" (a timeout, retried), and with no timeout set the
library's own message failed to format (``TypeError``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._runtime.operation.summarize import Part, SummaryRoutes
from orchestrator._runtime.outcomes import answer_of, attempt_summary
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.journal_records import operations
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Returns:
    """A route whose ``complete`` returns ``value`` at once, whatever it is."""

    name = "broken/route"
    context_window = 100_000

    def __init__(self, value: Any) -> None:
        self.value = value

    async def complete(self, request: ModelRequest) -> Any:
        del request
        return self.value


def part() -> Part:
    def build(budget: Any, texts: Any) -> ModelRequest:
        del budget, texts
        return ModelRequest(purpose="history", system="s", messages=(), max_tokens=10)

    return Part(purpose="history", routes=(), build=build)


@pytest.mark.parametrize("timeout_s", [30.0, None])
@pytest.mark.parametrize(("value", "kind"), [(None, "NoneType"), ("text", "str"), ({}, "dict")])
async def test_a_route_that_returns_no_response_fails_fatally_at_once(
    timeout_s: float | None, value: Any, kind: str
) -> None:
    attempt = await attempt_summary(part(), Returns(value), 0, {}, timeout_s)
    report, text = attempt.report, attempt.text
    assert report.outcome == "fatal"
    assert report.error == f"broken/route: returned {kind}, not a ModelResponse"
    assert text == ""


async def test_a_response_passes() -> None:
    response = ModelResponse(text="## Goal\nok", stop_reason="stop")
    request = ModelRequest(purpose="history", system="s", messages=(), max_tokens=10)
    assert await answer_of(Returns(response), request) is response


class Raises:
    """A route whose ``complete`` raises something that is not a ModelError (a bug)."""

    name = "buggy/route"
    context_window = 100_000

    async def complete(self, request: ModelRequest) -> Any:
        del request
        raise IndexError("list index out of range")


async def test_a_route_that_raises_a_bug_fails_the_operation_and_closes_its_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The IndexError escaped compact(), the journal showed the operation OPEN in summarizing
    # and compaction_update stopped at in_progress.
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(
        path, summarizer=SummaryRoutes(candidates=(Raises(),)), settings=RuntimeSettings()
    )
    updates: list[str] = []
    runtime.events.subscribe(
        lambda e: updates.append(e.payload["status"]) if e.type == "compaction_update" else None
    )
    before = path.read_bytes()
    try:
        with caplog.at_level(logging.ERROR, logger="orchestrator.models"):
            with pytest.raises(ModelError) as caught:
                await runtime.compact()
    finally:
        runtime.close()
    assert caught.value.kind == "fatal"
    assert "buggy/route: IndexError: list index out of range" in str(caught.value)
    assert updates == ["in_progress", "failed"]
    assert path.read_bytes() == before
    [operation] = operations(Journal.open(path).records())
    assert operation.state == "failed"
    assert any(record.exc_info for record in caplog.records)  # the traceback is logged
