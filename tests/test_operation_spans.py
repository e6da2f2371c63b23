"""Operation spans of a real runtime: a branch summary carries what a compaction carries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session
from orchestrator._telemetry.export import exporter_of, make_tracer_provider
from orchestrator._telemetry.tracing import LifecycleTracer
from orchestrator.testing import Hang, ScriptedAgent, ScriptedModel, reply, summary_text
from tests.runtime_kit import BIG, settings, summary, until

pytestmark = pytest.mark.anyio

PREFIX = "orchestrator.operation."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def exported() -> Iterator[tuple[LifecycleTracer, InMemorySpanExporter]]:
    provider = make_tracer_provider("memory", shutdown_on_exit=False)
    exporter = exporter_of(provider)
    assert isinstance(exporter, InMemorySpanExporter)
    yield LifecycleTracer(provider), exporter
    provider.shutdown()


def runtime_with(tracer: LifecycleTracer, model: ScriptedModel) -> AgentSession:
    return AgentSession(
        Session.in_memory(),
        agent=ScriptedAgent(
            [[reply("first", tokens=2000)], [reply("second", tokens=100)], [reply("third")]]
        ),
        summarizer=SummaryRoutes(candidates=(model,)),
        settings=settings(adaptive_keep=False),
        tracer=tracer,
    )


def attributes(exporter: InMemorySpanExporter, name: str) -> dict[str, Any]:
    [span] = [s for s in exporter.get_finished_spans() if s.name == name]
    return {k[len(PREFIX) :]: v for k, v in (span.attributes or {}).items() if k.startswith(PREFIX)}


async def test_a_branch_summary_span_has_tokens_before_and_model_like_a_compaction(
    exported: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = exported
    model = ScriptedModel([summary(), summary(summary_text("The branch."))], name="scripted/writer")
    runtime = runtime_with(tracer, model)
    await runtime.prompt(BIG)
    await runtime.prompt(BIG)
    await runtime.compact()
    first_user = runtime.session.tree.entries[0]["id"]
    await runtime.prompt("third question")
    result = await runtime.navigate(first_user, summarize=True)
    assert result.summary_entry is not None
    compaction = attributes(exporter, "orchestrator.compaction")
    branch = attributes(exporter, "orchestrator.branch_summary")
    assert {"tokens_before", "model", "summarized", "outcome"} <= compaction.keys()
    assert {"tokens_before", "model", "summarized", "outcome"} <= branch.keys()
    assert branch["model"] == compaction["model"] == "scripted/writer"
    assert branch["outcome"] == "committed"
    # What the branch summary was about: the abandoned branch, counted as its plan counts it.
    entries = {e["id"]: e for e in runtime.session.tree.entries}
    assert result.summary_entry["fromId"] in entries
    assert isinstance(branch["tokens_before"], int)
    assert branch["tokens_before"] > 0
    assert branch["summarized"] >= 1


async def test_a_cancelled_branch_summary_span_still_says_what_it_was_about(
    exported: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    import anyio

    tracer, exporter = exported
    model = ScriptedModel([Hang()], name="scripted/writer")
    runtime = runtime_with(tracer, model)
    await runtime.prompt(BIG)
    await runtime.prompt(BIG)
    first_user = runtime.session.tree.entries[0]["id"]
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: runtime.navigate(first_user, summarize=True))
        await until(lambda: len(model.requests) == 1)
        runtime.abort_branch_summary()
    branch = attributes(exporter, "orchestrator.branch_summary")
    assert branch["outcome"] == "cancelled"
    assert branch["tokens_before"] > 0
    assert "model" not in branch  # nothing was written by any model
