"""OpenTelemetry tracing of the lifecycle: turn, operation and model-call spans, steps as events.

Theory of operation
-------------------

Tracing is an observer (house style habit 5): the runtime driver opens a span around each turn,
each operation (compaction, branch summary, prune) and each model call, and hands every machine
:class:`~orchestrator._machine.Step` to :meth:`LifecycleTracer.on_step`, which adds one
``transition`` event (``machine``, ``from``, ``to``, ``trigger``, ``effects``) to the innermost
open span of *that* machine: operation steps land on the operation span even while a model-call
span is open inside it. A step whose machine has no open span lands on the current span, if any.

The open spans per machine live in a :class:`contextvars.ContextVar`, not on the tracer: anyio
tasks each see their own copy of the context, so two sessions driven concurrently by one tracer
never put events on each other's spans.

I never touch the global ``TracerProvider``: a library that sets it fights its host. The tracer
takes a provider, or ``None`` for a no-op tracer that costs almost nothing. Model-call spans carry
the GenAI semantic-convention attribute names, defined here as our own constants because the
semconv package keeps them in a private, deprecated module.

Exporters (the end of this module): JSON lines into a folder (the ``traces/`` convention, with
:func:`read_trace` to compare recordings), the console, and OTLP over HTTP configured by the
standard ``OTEL_*`` variables. :func:`make_tracer_provider` wires one up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from weakref import WeakKeyDictionary

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NoOpTracer,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
)
from opentelemetry.util.types import AttributeValue

from ._errors import Cancelled, ModelError
from ._guards import Facts
from ._machine import Step
from ._model import ModelRequest, ModelResponse

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ERROR_TYPE = "error.type"

TRANSITION_EVENT = "transition"
TRACER_NAME = "orchestrator"

_ACTIVE: ContextVar[Mapping[str, Span]] = ContextVar(
    "orchestrator_machine_spans", default=MappingProxyType({})
)


@dataclass(frozen=True, slots=True)
class SpanHandle:
    """An open span and the attribute prefix of its kind (``orchestrator.operation.`` ...).

    Attributes:
        span: The OpenTelemetry span.
        prefix: Prepended to the keys given to :meth:`set`.
    """

    span: Span
    prefix: str

    def set(self, **attrs: Any) -> None:
        """Set attributes under this span's prefix; ``None`` values are skipped."""
        set_attributes(self, **attrs)


@dataclass(frozen=True, slots=True)
class ModelCall(SpanHandle):
    """The span of one model call; record the reply with :meth:`record_response`."""

    def record_response(self, response: ModelResponse) -> None:
        """Set the GenAI response attributes: finish reason (pi's vocabulary), usage, model."""
        attributes: dict[str, AttributeValue] = {
            GEN_AI_RESPONSE_FINISH_REASONS: (response.stop_reason,),
            GEN_AI_USAGE_INPUT_TOKENS: response.usage.input,
            GEN_AI_USAGE_OUTPUT_TOKENS: response.usage.output,
        }
        if response.model:
            attributes[GEN_AI_RESPONSE_MODEL] = response.model
        self.span.set_attributes(attributes)


def set_attributes(target: SpanHandle | Span, **attrs: Any) -> None:
    """Set attributes on a handle (keys get its prefix) or on a bare span (keys as given).

    Values that OpenTelemetry cannot hold are turned into strings; sequences become tuples;
    ``None`` is skipped, because "unknown" is better shown by absence than by a fake value.

    Args:
        target: A :class:`SpanHandle` or a span.
        **attrs: The attributes, e.g. ``tokens_before=1200, outcome="committed"``.
    """
    span, prefix = (target.span, target.prefix) if isinstance(target, SpanHandle) else (target, "")
    for key, value in attrs.items():
        if value is not None:
            span.set_attribute(prefix + key, _attribute(value))


def _attribute(value: Any) -> AttributeValue:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        # OpenTelemetry wants one primitive type per sequence; mixed ones become strings.
        if len({type(v) for v in value}) == 1 and isinstance(value[0], str | bool | int | float):
            return tuple(value)
        return tuple(str(v) for v in value)
    return str(value)


def facts_delta(facts: Facts) -> dict[str, Any]:
    """The fields of ``facts`` that differ from :class:`Facts`' defaults."""
    default = Facts()
    return {
        f.name: getattr(facts, f.name)
        for f in dataclasses.fields(facts)
        if getattr(facts, f.name) != getattr(default, f.name)
    }


class LifecycleTracer:
    """Opens lifecycle spans and turns machine steps into span events.

    Args:
        provider: Where spans go; ``None`` makes every method a no-op.
    """

    def __init__(self, provider: TracerProvider | None) -> None:
        self._tracer: Tracer = (
            NoOpTracer() if provider is None else provider.get_tracer(TRACER_NAME)
        )

    @contextmanager
    def turn_span(self, session_id: str, turn_no: int) -> Iterator[SpanHandle]:
        """Open the span of one agent turn; turn steps go on it.

        Yields:
            Its handle; attributes set through it get the ``orchestrator.turn.`` prefix.
        """
        attrs: dict[str, AttributeValue] = {
            "orchestrator.session.id": session_id,
            "orchestrator.turn.number": turn_no,
        }
        with self._span("turn", "orchestrator.turn", attrs, machine="turn") as handle:
            yield handle

    @contextmanager
    def operation_span(
        self, kind: str, operation_id: str, reason: str | None = None
    ) -> Iterator[SpanHandle]:
        """Open the span of one compaction, branch summary or prune; operation steps go on it.

        Set ``tokens_before``, ``tokens_after``, ``summarized``, ``kept``, ``attempts``,
        ``model`` and ``outcome`` through the handle as they become known.

        Yields:
            Its handle; attributes get the ``orchestrator.operation.`` prefix.
        """
        attrs: dict[str, AttributeValue] = {
            "orchestrator.operation.kind": kind,
            "orchestrator.operation.id": operation_id,
        }
        if reason is not None:
            attrs["orchestrator.operation.reason"] = reason
        with self._span(
            "operation", f"orchestrator.{kind}", attrs, machine="operation"
        ) as handle:
            yield handle

    @contextmanager
    def navigation_span(self, session_id: str, target_id: str | None) -> Iterator[SpanHandle]:
        """Open the span of one tree navigation; navigation steps go on it.

        Yields:
            Its handle; attributes get the ``orchestrator.navigation.`` prefix.
        """
        attrs: dict[str, AttributeValue] = {"orchestrator.session.id": session_id}
        if target_id is not None:
            attrs["orchestrator.navigation.target_id"] = target_id
        with self._span(
            "navigation", "orchestrator.navigation", attrs, machine="navigation"
        ) as handle:
            yield handle

    @contextmanager
    def model_span(self, request: ModelRequest, model_name: str) -> Iterator[ModelCall]:
        """Open the span of one model call, with the GenAI request attributes.

        A :class:`~orchestrator.ModelError` escaping the block marks the span as an error with
        ``error.type`` set to the error's kind, and is re-raised.

        Yields:
            A :class:`ModelCall`; call :meth:`ModelCall.record_response` with the reply.
        """
        operation = "chat" if request.purpose == "chat" else "summarize"
        attrs: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_REQUEST_MODEL: model_name,
            GEN_AI_REQUEST_MAX_TOKENS: request.max_tokens,
            "orchestrator.model.purpose": request.purpose,
        }
        with self._tracer.start_as_current_span(
            f"{operation} {model_name}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            with _failures(span):
                yield ModelCall(span, "orchestrator.model.")

    def on_step(self, step: Step) -> None:
        """Add a ``transition`` event to the innermost open span of the step's machine.

        Args:
            step: The step a machine took (give this method to ``Runner.subscribe``).
        """
        span = _ACTIVE.get().get(step.machine) or get_current_span()
        attributes: dict[str, AttributeValue] = {
            "machine": step.machine,
            "from": step.source,
            "to": step.dest,
            "trigger": step.event,
            "effects": step.effects,
        }
        if step.facts is not None:
            # Only the facts that differ from their defaults, as JSON: enough to replay the
            # step through the table (house style habit 5) and short enough to read.
            attributes["facts"] = json.dumps(facts_delta(step.facts), sort_keys=True)
        span.add_event(TRANSITION_EVENT, attributes)

    @contextmanager
    def _span(
        self, kind: str, name: str, attrs: Mapping[str, AttributeValue], *, machine: str
    ) -> Iterator[SpanHandle]:
        with self._tracer.start_as_current_span(
            name, attributes=attrs, record_exception=False, set_status_on_exception=False
        ) as span:
            token = _ACTIVE.set(MappingProxyType({**_ACTIVE.get(), machine: span}))
            try:
                with _failures(span):
                    yield SpanHandle(span, f"orchestrator.{kind}.")
            finally:
                _ACTIVE.reset(token)


@contextmanager
def _failures(span: Span) -> Iterator[None]:
    """Record an escaping error on ``span``; a cancellation is marked, not called an error."""
    try:
        yield
    except Cancelled:
        span.set_attribute("orchestrator.cancelled", True)
        raise
    except Exception as exc:
        span.record_exception(exc)
        kind = exc.kind if isinstance(exc, ModelError) else type(exc).__name__
        span.set_attribute(ERROR_TYPE, kind)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    except BaseException:
        # anyio/trio cancellation and KeyboardInterrupt are not failures of the traced work.
        span.set_attribute("orchestrator.cancelled", True)
        raise


# -- exporters ---------------------------------------------------------------------------------

ExporterName = Literal["jsonl", "console", "otlp", "memory"]
_EXPORTERS: WeakKeyDictionary[TracerProvider, SpanExporter] = WeakKeyDictionary()
_VOLATILE = frozenset({"traceId", "spanId", "parentSpanId", "start", "end"})
_VOLATILE_ATTRIBUTES = frozenset({"exception.stacktrace"})


def span_to_json(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as a JSON object: fixed key order, attributes sorted by key.

    Returns:
        ``name, kind, traceId, spanId, parentSpanId, start, end, status, attributes, events``;
        ids are hex, times epoch nanoseconds.
    """
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "traceId": f"{context.trace_id:032x}" if context else None,
        "spanId": f"{context.span_id:016x}" if context else None,
        "parentSpanId": f"{parent.span_id:016x}" if parent else None,
        "start": span.start_time,
        "end": span.end_time,
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "attributes": _sorted(span.attributes),
        "events": [
            {"name": e.name, "time": e.timestamp, "attributes": _sorted(e.attributes)}
            for e in span.events
        ],
    }


def _sorted(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in sorted((attributes or {}).items())
    }


class JsonLinesSpanExporter(SpanExporter):
    """Append each finished span as one JSON line to a file in ``folder``.

    By default each trace gets its own file, ``<folder>/<trace_id>.jsonl``: a trace is one root
    span (a turn, or an operation run on its own), so a file is one story. Give ``file_name`` to
    put a whole run in one file instead (``traces/<scenario>.jsonl``). Spans are written in the
    order they finish, children before parents; with a synchronous span processor that order is
    deterministic, and :func:`read_trace` drops what is not (ids and times).

    Args:
        folder: Created when missing.
        file_name: One file for every span, instead of one file per trace.
    """

    def __init__(self, folder: str | os.PathLike[str], *, file_name: str | None = None) -> None:
        self.folder = Path(folder)
        self.file_name = file_name
        self._lock = threading.Lock()

    def path_for(self, trace_id: int) -> Path:
        """Return the file a span of ``trace_id`` goes to."""
        return self.folder / (self.file_name or f"{trace_id:032x}.jsonl")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans; one ``write`` per span, so a crash tears at most one line.

        Returns:
            ``SUCCESS``, or ``FAILURE`` when the file cannot be written.
        """
        try:
            with self._lock:
                self.folder.mkdir(parents=True, exist_ok=True)
                for span in spans:
                    context = span.get_span_context()
                    line = json.dumps(span_to_json(span), ensure_ascii=False) + "\n"
                    with self.path_for(context.trace_id if context else 0).open("a") as file:
                        file.write(line)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing is held open between exports."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing is buffered: every export is written before it returns.

        Returns:
            Always ``True``.
        """
        return True


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSON-lines trace and drop what differs between runs, for comparison.

    Ids and times go; each span gets ``id`` (its line index) and ``parent`` (the line index of
    its parent in the file, or ``None``), so the tree shape survives. Exception stack traces go
    too (they hold file paths).

    Returns:
        The normalized spans, in file order.
    """
    spans = [json.loads(line) for line in Path(path).read_text("utf-8").splitlines() if line]
    index = {span["spanId"]: n for n, span in enumerate(spans)}
    normalized = []
    for n, span in enumerate(spans):
        kept = {k: v for k, v in span.items() if k not in _VOLATILE}
        kept["attributes"] = _stable(kept.get("attributes", {}))
        kept["events"] = [
            {"name": e["name"], "attributes": _stable(e.get("attributes", {}))}
            for e in kept.get("events", [])
        ]
        normalized.append({"id": n, "parent": index.get(span.get("parentSpanId")), **kept})
    return normalized


def _stable(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if k not in _VOLATILE_ATTRIBUTES}


def make_tracer_provider(
    exporter: ExporterName | SpanExporter,
    folder: str | os.PathLike[str] | None = None,
    *,
    file_name: str | None = None,
    shutdown_on_exit: bool = True,
) -> TracerProvider:
    """Build a tracer provider with one exporter. It is never made the global provider.

    ``jsonl``, ``console``, ``memory`` and an exporter instance get a ``SimpleSpanProcessor``
    (synchronous, so recordings are deterministic); ``otlp`` gets a ``BatchSpanProcessor`` and
    reads its endpoint, headers and timeout from the standard ``OTEL_EXPORTER_OTLP_*``
    variables. The console exporter writes to stderr, so ``--json`` output on stdout stays clean.
    The resource's ``service.name`` is ``session-orchestrator`` unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` says otherwise.

    Args:
        exporter: ``jsonl``, ``console``, ``otlp``, ``memory``, or an exporter instance.
        folder: The ``jsonl`` folder.
        file_name: For ``jsonl``: one file for the whole run.
        shutdown_on_exit: Shut the provider down at interpreter exit. Pass ``False`` when you
            shut it down yourself (a second shutdown only logs a warning, but why have one).

    Returns:
        The provider; :func:`exporter_of` returns its exporter (e.g. to read ``memory`` spans).

    Raises:
        ValueError: ``jsonl`` without a folder, or an unknown exporter name.
    """
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "session-orchestrator"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=shutdown_on_exit)
    instance = _exporter(exporter, folder, file_name)
    if exporter == "otlp":
        provider.add_span_processor(BatchSpanProcessor(instance))
    else:
        provider.add_span_processor(SimpleSpanProcessor(instance))
    _EXPORTERS[provider] = instance
    return provider


def exporter_of(provider: TracerProvider) -> SpanExporter:
    """Return the exporter :func:`make_tracer_provider` gave ``provider``.

    Raises:
        KeyError: The provider was not made by :func:`make_tracer_provider`.
    """
    return _EXPORTERS[provider]


def _exporter(
    name: ExporterName | SpanExporter, folder: str | os.PathLike[str] | None, file_name: str | None
) -> SpanExporter:
    if isinstance(name, SpanExporter):
        return name
    if name == "jsonl":
        if folder is None:
            raise ValueError("the jsonl exporter needs a folder")
        return JsonLinesSpanExporter(folder, file_name=file_name)
    if name == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    if name == "memory":
        return InMemorySpanExporter()
    if name == "otlp":
        # Imported here: the OTLP stack (requests, protobuf) is heavy and most runs never use it.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    raise ValueError(f"unknown exporter {name!r} (jsonl, console, otlp or memory)")
