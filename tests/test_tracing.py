"""Lifecycle tracing: span nesting, transition events, GenAI attributes, exporters (JSONL, OTLP)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_current_span

from orchestrator._core.errors import (
    Cancelled,
    ContextOverflowError,
    ModelError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest, ModelResponse, Usage
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.machine import Runner, Step, load_machine
from orchestrator._telemetry.export import (
    JsonLinesSpanExporter,
    exporter_of,
    make_tracer_provider,
    read_trace,
)
from orchestrator._telemetry.tracing import (
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    INPUT_VALUE,
    LLM_MODEL_NAME,
    LLM_TOKEN_COUNT_COMPLETION,
    LLM_TOKEN_COUNT_PROMPT,
    LLM_TOKEN_COUNT_TOTAL,
    OPENINFERENCE_SPAN_KIND,
    OUTPUT_VALUE,
    LifecycleTracer,
    set_attributes,
)

SUMMARY = ModelRequest(
    purpose="history", system="s", messages=({"role": "user", "content": "x"},), max_tokens=1234
)
CHAT = ModelRequest(purpose="chat", system="s", messages=(), max_tokens=99)


@pytest.fixture
def memory() -> Iterator[tuple[LifecycleTracer, InMemorySpanExporter]]:
    provider = make_tracer_provider("memory", shutdown_on_exit=False)
    exporter = exporter_of(provider)
    assert isinstance(exporter, InMemorySpanExporter)
    yield LifecycleTracer(provider, capture_content=False), exporter
    provider.shutdown()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def transitions(span: ReadableSpan) -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    found = []
    for event in span.events:
        assert event.name == "transition"
        a = event.attributes or {}
        effects = a["effects"]
        assert isinstance(effects, tuple)
        found.append(
            (
                str(a["machine"]),
                str(a["from"]),
                str(a["trigger"]),
                str(a["to"]),
                tuple(str(e) for e in effects),
            )
        )
    return found


def compaction_story(tracer: LifecycleTracer) -> None:
    """A turn that compacts: turn, operation and model-call spans, steps as events."""
    turn = Runner(load_machine("turn"), observers=[tracer.on_step])
    operation = Runner(load_machine("operation"), observers=[tracer.on_step])
    with tracer.turn_span("session-1", 3):
        turn.fire("user_prompt")
        with tracer.operation_span("compaction", "op-1", "threshold") as op:
            operation.fire("prepared", OperationFacts(has_work=True))
            operation.fire("hooks_done")
            with tracer.model_span(SUMMARY, "anthropic/claude") as call:
                call.record_response(
                    ModelResponse(text="sum", usage=Usage(input=500, output=40), model="claude-x")
                )
                operation.fire("summary_ready")  # fired inside the model span on purpose
            operation.fire("entry_appended")
            op.set(tokens_before=9000, tokens_after=1200, attempts=1, outcome="committed")


def test_spans_nest_turn_operation_model_call(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    compaction_story(tracer)
    spans = by_name(exporter.get_finished_spans())
    turn, op = spans["orchestrator.turn"], spans["orchestrator.compaction"]
    call = spans["summarize anthropic/claude"]
    assert turn.parent is None
    assert op.parent is not None
    assert op.parent.span_id == turn.context.span_id
    assert call.parent is not None
    assert call.parent.span_id == op.context.span_id
    assert turn.attributes == {
        "orchestrator.session.id": "session-1",
        "orchestrator.turn.number": 3,
        "openinference.span.kind": "AGENT",
        "session.id": "session-1",
    }
    assert dict(op.attributes or {}) == {
        "orchestrator.operation.kind": "compaction",
        "orchestrator.operation.id": "op-1",
        "orchestrator.operation.reason": "threshold",
        "orchestrator.operation.tokens_before": 9000,
        "orchestrator.operation.tokens_after": 1200,
        "orchestrator.operation.attempts": 1,
        "orchestrator.operation.outcome": "committed",
        "openinference.span.kind": "CHAIN",
        "input.value": '{"kind": "compaction", "operation_id": "op-1", "reason": "threshold"}',
        "input.mime_type": "application/json",
        "output.value": '{"attempts": 1, "outcome": "committed", "tokens_after": 1200, '
        '"tokens_before": 9000}',
        "output.mime_type": "application/json",
    }


def test_transition_events_land_on_their_machines_span(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    compaction_story(tracer)
    spans = by_name(exporter.get_finished_spans())
    assert transitions(spans["orchestrator.compaction"]) == [
        ("operation", "preparing", "prepared", "consulting_hooks", ("run_hooks",)),
        ("operation", "consulting_hooks", "hooks_done", "summarizing", ("call_model",)),
        ("operation", "summarizing", "summary_ready", "committing", ("append_entry",)),
        (
            "operation",
            "committing",
            "entry_appended",
            "committed",
            ("rebuild_context", "emit_result"),
        ),
    ]
    turn_events = transitions(spans["orchestrator.turn"])
    assert len(turn_events) == 1
    assert turn_events[0][0] == "turn"
    assert spans["summarize anthropic/claude"].events == ()


def test_model_span_carries_genai_attributes(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    compaction_story(tracer)
    with tracer.model_span(CHAT, "openai/gpt") as call:
        call.record_response(ModelResponse(text="", stop_reason="toolUse"))
    spans = by_name(exporter.get_finished_spans())
    summary = spans["summarize anthropic/claude"]
    assert summary.kind.name == "CLIENT"
    assert dict(summary.attributes or {}) == {
        GEN_AI_OPERATION_NAME: "summarize",
        GEN_AI_REQUEST_MODEL: "anthropic/claude",
        GEN_AI_REQUEST_MAX_TOKENS: 1234,
        "orchestrator.model.purpose": "history",
        GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        GEN_AI_USAGE_INPUT_TOKENS: 500,
        GEN_AI_USAGE_OUTPUT_TOKENS: 40,
        GEN_AI_RESPONSE_MODEL: "claude-x",
        OPENINFERENCE_SPAN_KIND: "LLM",
        LLM_MODEL_NAME: "anthropic/claude",
        "llm.invocation_parameters": '{"max_tokens": 1234}',
        LLM_TOKEN_COUNT_PROMPT: 500,
        LLM_TOKEN_COUNT_COMPLETION: 40,
        LLM_TOKEN_COUNT_TOTAL: 540,
    }
    chat = spans["chat openai/gpt"].attributes or {}
    assert chat[GEN_AI_OPERATION_NAME] == "chat"
    assert chat[GEN_AI_RESPONSE_FINISH_REASONS] == ("toolUse",)
    assert GEN_AI_RESPONSE_MODEL not in chat


def test_openinference_kinds_name_every_span_for_llm_dashboards(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    compaction_story(tracer)
    with tracer.navigation_span("session-1", "abc"):
        pass
    kinds = {
        span.name: (span.attributes or {})[OPENINFERENCE_SPAN_KIND]
        for span in exporter.get_finished_spans()
    }
    assert kinds == {
        "orchestrator.turn": "AGENT",
        "orchestrator.compaction": "CHAIN",
        "summarize anthropic/claude": "LLM",
        "orchestrator.navigation": "CHAIN",
    }
    navigation = by_name(exporter.get_finished_spans())["orchestrator.navigation"]
    assert (navigation.attributes or {})["session.id"] == "session-1"


def test_total_token_count_includes_cache_reads_and_writes(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    usage = Usage(input=100, output=10, cache_read=1000, cache_write=5)
    with tracer.model_span(SUMMARY, "m") as call:
        call.record_response(ModelResponse(text="t", usage=usage, provider="anthropic"))
    attributes = exporter.get_finished_spans()[0].attributes or {}
    assert attributes[LLM_TOKEN_COUNT_PROMPT] == 100
    assert attributes[LLM_TOKEN_COUNT_COMPLETION] == 10
    assert attributes[LLM_TOKEN_COUNT_TOTAL] == 1115
    assert attributes["llm.provider"] == "anthropic"


def test_prompts_and_replies_are_recorded_only_when_content_capture_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = make_tracer_provider("memory", shutdown_on_exit=False)
    exporter = exporter_of(provider)
    assert isinstance(exporter, InMemorySpanExporter)
    reply = ModelResponse(text="the summary", usage=Usage(input=5, output=2))
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    tracers = [LifecycleTracer(provider), LifecycleTracer(provider, capture_content=True)]
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    tracers += [LifecycleTracer(provider), LifecycleTracer(provider, capture_content=False)]
    for tracer in tracers:
        with tracer.model_span(SUMMARY, "m") as call:
            call.record_response(reply)
    provider.shutdown()
    seen = [
        ((s.attributes or {}).get(INPUT_VALUE), (s.attributes or {}).get(OUTPUT_VALUE))
        for s in exporter.get_finished_spans()
    ]
    assert seen == [(None, None), ("x", "the summary"), ("x", "the summary"), (None, None)]


def test_model_error_sets_error_status_and_kind(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    with tracer.operation_span("compaction", "op-2"):
        with pytest.raises(ModelError), tracer.model_span(SUMMARY, "m"):
            raise ContextOverflowError("prompt is too long")
    spans = by_name(exporter.get_finished_spans())
    call, op = spans["summarize m"], spans["orchestrator.compaction"]
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == "ModelError: prompt is too long"
    assert (call.attributes or {})[ERROR_TYPE] == "overflow"
    assert [e.name for e in call.events] == ["exception"]
    # The operation caught it (say, to retry): the operation itself did not fail.
    assert op.status.status_code is StatusCode.UNSET
    assert "orchestrator.operation.reason" not in (op.attributes or {})


def test_other_errors_escaping_a_lifecycle_span_mark_it(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    with pytest.raises(RuntimeError), tracer.turn_span("s", 1):
        raise RuntimeError("boom")
    (turn,) = exporter.get_finished_spans()
    assert turn.status.status_code is StatusCode.ERROR
    assert (turn.attributes or {})[ERROR_TYPE] == "RuntimeError"


def test_cancellation_is_marked_not_an_error(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    with pytest.raises(Cancelled), tracer.operation_span("prune", "p"):
        raise Cancelled("stop")
    with pytest.raises(KeyboardInterrupt), tracer.model_span(CHAT, "m"):
        raise KeyboardInterrupt
    for span in exporter.get_finished_spans():
        assert span.status.status_code is StatusCode.UNSET
        assert (span.attributes or {})["orchestrator.cancelled"] is True


def test_set_attributes_prefixes_handles_and_cleans_values(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    with tracer.navigation_span("s", "target-1") as nav:
        set_attributes(nav, summarized=3, model=None, ids=["a", 1], counts=[1, 2], where=Path("x"))
        set_attributes(nav.span, **{"custom.key": True})
    with tracer.navigation_span("s", None):
        pass
    first, second = exporter.get_finished_spans()
    assert dict(first.attributes or {}) == {
        "orchestrator.session.id": "s",
        "orchestrator.navigation.target_id": "target-1",
        "orchestrator.navigation.summarized": 3,
        "orchestrator.navigation.ids": ("a", "1"),
        "orchestrator.navigation.counts": (1, 2),
        "orchestrator.navigation.where": "x",
        "custom.key": True,
        "openinference.span.kind": "CHAIN",
        "session.id": "s",
    }
    assert dict(second.attributes or {}) == {
        "orchestrator.session.id": "s",
        "openinference.span.kind": "CHAIN",
        "session.id": "s",
    }


def test_a_step_without_its_machine_span_goes_on_the_current_span(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    step = Step(
        machine="navigation", source="idle", event="navigate", dest="collecting", effects=()
    )
    tracer.on_step(step)  # no span at all: dropped quietly
    with tracer.turn_span("s", 1):
        tracer.on_step(step)
    (turn,) = exporter.get_finished_spans()
    assert transitions(turn) == [("navigation", "idle", "navigate", "collecting", ())]


def test_concurrent_sessions_keep_their_events_apart(
    memory: tuple[LifecycleTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = memory
    first_inside, second_done = anyio.Event(), anyio.Event()

    async def first() -> None:
        with tracer.operation_span("compaction", "A"):
            first_inside.set()
            await second_done.wait()  # B's span opens and closes while A's is open
            tracer.on_step(Step(machine="operation", source="a", event="e", dest="b", effects=()))

    async def second() -> None:
        await first_inside.wait()
        with tracer.operation_span("compaction", "B"):
            tracer.on_step(Step(machine="operation", source="x", event="e", dest="y", effects=()))
        second_done.set()

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(first)
            group.start_soon(second)

    anyio.run(main)
    spans = {
        (s.attributes or {})["orchestrator.operation.id"]: s for s in exporter.get_finished_spans()
    }
    assert [e[1] for e in transitions(spans["A"])] == ["a"]
    assert [e[1] for e in transitions(spans["B"])] == ["x"]
    assert spans["A"].parent is None
    assert spans["B"].parent is None


def test_no_provider_means_no_op() -> None:
    tracer = LifecycleTracer(None)
    with tracer.turn_span("s", 1) as turn, tracer.operation_span("prune", "p") as op:
        tracer.on_step(Step(machine="turn", source="a", event="e", dest="b", effects=()))
        op.set(outcome="committed")
        with tracer.model_span(CHAT, "m") as call:
            call.record_response(ModelResponse(text="ok"))
        with tracer.navigation_span("s", "t") as navigation:
            navigation.set(outcome="switched")
        assert not turn.span.is_recording()
        assert not navigation.span.is_recording()


def test_no_provider_leaves_the_callers_span_current() -> None:
    outer = TracerProvider().get_tracer("caller")
    tracer = LifecycleTracer(None)
    with outer.start_as_current_span("the caller's") as theirs:
        with tracer.turn_span("s", 1), tracer.operation_span("prune", "p"):
            with tracer.model_span(CHAT, "m"):
                assert get_current_span() is theirs


def test_a_provider_that_samples_nothing_records_nothing() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = LifecycleTracer(provider)
    with tracer.operation_span("prune", "p") as op:
        tracer.on_step(Step(machine="operation", source="a", event="e", dest="b", effects=()))
        op.set(outcome="committed")
        with tracer.model_span(CHAT, "m") as call:
            call.record_response(ModelResponse(text="ok"))
    assert not op.span.is_recording()
    assert exporter.get_finished_spans() == ()


# -- exporters ---------------------------------------------------------------------------------


def test_jsonl_exporter_writes_one_parseable_line_per_span(tmp_path: Path) -> None:
    provider = make_tracer_provider("jsonl", tmp_path / "traces", shutdown_on_exit=False)
    compaction_story(LifecycleTracer(provider))
    provider.shutdown()
    (file,) = (tmp_path / "traces").iterdir()
    assert file.suffix == ".jsonl"
    assert len(file.stem) == 32
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    assert [line["name"] for line in lines] == [
        "summarize anthropic/claude",
        "orchestrator.compaction",
        "orchestrator.turn",
    ]
    assert list(lines[0]) == [
        "name",
        "kind",
        "traceId",
        "spanId",
        "parentSpanId",
        "start",
        "end",
        "status",
        "attributes",
        "events",
    ]
    assert list(lines[0]["attributes"]) == sorted(lines[0]["attributes"])
    assert lines[1]["events"][0]["attributes"]["effects"] == ["run_hooks"]
    assert lines[0]["parentSpanId"] == lines[1]["spanId"]


def test_read_trace_makes_two_runs_of_a_story_equal(tmp_path: Path) -> None:
    def record(name: str) -> Path:
        provider = make_tracer_provider(
            "jsonl", tmp_path, file_name=f"{name}.jsonl", shutdown_on_exit=False
        )
        tracer = LifecycleTracer(provider)
        compaction_story(tracer)
        with pytest.raises(ModelError), tracer.model_span(CHAT, "m"):
            raise TransientModelError("rate limited")
        provider.shutdown()
        return tmp_path / f"{name}.jsonl"

    first, second = record("one"), record("two")
    assert first.read_text() != second.read_text()  # ids and times differ
    trace = read_trace(first)
    assert trace == read_trace(second)
    assert [(s["id"], s["parent"], s["name"]) for s in trace] == [
        (0, 1, "summarize anthropic/claude"),
        (1, 2, "orchestrator.compaction"),
        (2, None, "orchestrator.turn"),
        (3, None, "chat m"),
    ]
    assert not {"traceId", "spanId", "parentSpanId", "start", "end"} & set(trace[0])
    assert all("time" not in e for e in trace[1]["events"])
    assert trace[3]["status"] == {"code": "ERROR", "description": "ModelError: rate limited"}
    assert "exception.stacktrace" not in trace[3]["events"][0]["attributes"]


def test_jsonl_export_failure_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    exporter = JsonLinesSpanExporter(blocker)  # a file where the folder should be
    provider = TracerProvider(shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    assert exporter.export(memory.get_finished_spans()).name == "FAILURE"
    assert exporter.force_flush() is True
    exporter.shutdown()
    provider.shutdown()


def test_console_exporter_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    provider = make_tracer_provider("console", shutdown_on_exit=False)
    assert isinstance(exporter_of(provider), ConsoleSpanExporter)
    with LifecycleTracer(provider).turn_span("s", 1):
        pass
    provider.shutdown()
    out, err = capsys.readouterr()
    assert out == ""
    assert '"name": "orchestrator.turn"' in err


def test_provider_takes_an_exporter_instance_and_refuses_bad_names(tmp_path: Path) -> None:
    mine = InMemorySpanExporter()
    provider = make_tracer_provider(mine, shutdown_on_exit=False)
    assert exporter_of(provider) is mine
    provider.shutdown()
    with pytest.raises(ValueError, match="needs a folder"):
        make_tracer_provider("jsonl", shutdown_on_exit=False)
    with pytest.raises(ValueError, match="unknown exporter"):
        make_tracer_provider("zipkin", shutdown_on_exit=False)  # type: ignore[arg-type]


def test_service_name_defaults_but_yields_to_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = make_tracer_provider("memory", shutdown_on_exit=False)
    assert provider.resource.attributes["service.name"] == "session-orchestrator"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-agent")
    provider = make_tracer_provider("memory", shutdown_on_exit=False)
    assert provider.resource.attributes["service.name"] == "my-agent"
    provider.shutdown()


class Collector(BaseHTTPRequestHandler):
    """A tiny OTLP/HTTP receiver: keeps every request body, answers 200."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_otlp_exporter_sends_spans_to_the_configured_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(proxy, raising=False)  # loopback only, never through a proxy
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "otlp-test")
        provider = make_tracer_provider("otlp", shutdown_on_exit=False)
        compaction_story(LifecycleTracer(provider))
        provider.shutdown()  # the batch processor exports what it holds before returning
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert Collector.received, "no export request arrived"
    names, services = [], set()
    for path, body in Collector.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                names += [span.name for span in scope_spans.spans]
    assert sorted(names) == [
        "orchestrator.compaction",
        "orchestrator.turn",
        "summarize anthropic/claude",
    ]
    assert services == {"otlp-test"}
