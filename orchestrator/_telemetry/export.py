"""Trace exporters: JSON lines into a folder, the console, OTLP; and reading traces back.

The JSON-lines exporter writes one object per finished span with a fixed key order, so recorded
traces (``traces/``) diff well; :func:`read_trace` drops what changes from run to run (ids,
times, stack traces) so two runs of the same scenario compare equal. A provider is never made the
global one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
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

from orchestrator._core.errors import OrchestratorError
from orchestrator._core.redact import redact

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
    description = span.status.description
    return {
        "name": span.name,
        "kind": span.kind.name,
        "traceId": f"{context.trace_id:032x}" if context else None,
        "spanId": f"{context.span_id:016x}" if context else None,
        "parentSpanId": f"{parent.span_id:016x}" if parent else None,
        "start": span.start_time,
        "end": span.end_time,
        "status": {"code": span.status.status_code.name, "description": _redacted(description)},
        "attributes": _sorted(span.attributes),
        "events": [
            {"name": e.name, "time": e.timestamp, "attributes": _sorted(e.attributes)}
            for e in span.events
        ],
    }


def _sorted(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        key: _redacted(value) if _error_text(key) else _listed(value)
        for key, value in sorted((attributes or {}).items())
    }


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _error_text(key: str) -> bool:
    """Whether an attribute holds error text, which may quote a provider's (redact.py)."""
    return key.startswith("exception.") or key.endswith("error")


def _redacted(value: Any) -> Any:
    """Error text as it is written to a trace file: redacted again (the tracer did it once).

    The file outlives the process and may be read by others; a span made by a tracer that is
    not ours (an instrumented library's) never went through the tracer's redaction.
    """
    return redact(value) if isinstance(value, str) else _listed(value)


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
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                for span in spans:
                    context = span.get_span_context()
                    line = json.dumps(span_to_json(span), ensure_ascii=False) + "\n"
                    _append(self.path_for(context.trace_id if context else 0), line)
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


def _append(path: Path, line: str) -> None:
    """Append one line to a trace file, created ``0600``: spans may hold prompts and errors."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as file:
        file.write(line)


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

        return OneLineFailureExporter(OTLPSpanExporter(), otlp_endpoint())
    raise ValueError(f"unknown exporter {name!r} (jsonl, console, otlp or memory)")


# -- OTLP: fail fast, and in one line ---------------------------------------------------------

_OTLP_DEFAULT = "http://localhost:4318/v1/traces"
_OTLP_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def otlp_endpoint() -> str:
    """The traces URL the OTLP/HTTP exporter sends to, resolved as the exporter resolves it.

    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` plus
    ``/v1/traces``, else ``http://localhost:4318/v1/traces``.
    """
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else _OTLP_DEFAULT


def check_otlp_collector(timeout_s: float = 1.0) -> str:
    """Make sure something listens at the OTLP endpoint before a run depends on it.

    Without a collector the exporter retries with backoff for up to its timeout and logs a
    warning per attempt; a command would finish seconds late with a screenful of tracebacks.
    A TCP connect says in at most ``timeout_s`` whether anyone is there.

    Returns:
        The endpoint.

    Raises:
        OrchestratorError: nothing accepts connections there (one line, with the endpoint).
    """
    from urllib.parse import urlsplit

    endpoint = otlp_endpoint()
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "localhost", port), timeout=timeout_s):
            return endpoint
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OrchestratorError(
            f"--trace otlp: no OTLP collector at {endpoint} ({reason.lower()}); start one or "
            "point OTEL_EXPORTER_OTLP_ENDPOINT at it"
        ) from None


class _Quiet(logging.Filter):
    """Drops the OTLP exporter's retry warnings while :class:`OneLineFailureExporter` exports."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "active", False)


_QUIET = _Quiet()


class OneLineFailureExporter(SpanExporter):
    """Wraps an exporter so a failing destination costs one line on stderr, once.

    The OTLP exporter logs every retry with the whole connection error. I silence those while
    it exports, and after the first failed export I stop sending: the spans of this run are lost
    anyway, and each further batch would wait through the same retries.

    Args:
        inner: The exporter to wrap.
        destination: Named in the warning line.
    """

    def __init__(self, inner: SpanExporter, destination: str) -> None:
        self.inner = inner
        self.destination = destination
        self.failed = False
        logger = logging.getLogger(_OTLP_LOGGER)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the inner exporter, quietly; after one failure, drop everything.

        Returns:
            The inner result, or ``FAILURE`` once the destination has failed.
        """
        if self.failed:
            return SpanExportResult.FAILURE
        _QUIET.local.active = True
        try:
            result = self.inner.export(spans)
        finally:
            _QUIET.local.active = False
        if result is not SpanExportResult.SUCCESS:
            self.failed = True
            print(
                f"warning: trace export to {self.destination} failed; "
                "no more spans are sent in this run",
                file=sys.stderr,
            )
        return result

    def shutdown(self) -> None:
        """Shut the inner exporter down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the inner exporter.

        Returns:
            What the inner exporter returns.
        """
        return self.inner.force_flush(timeout_millis)
