"""``--trace otlp`` without a collector: one line and no work, instead of seconds of retries."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from orchestrator._core.errors import OrchestratorError
from orchestrator._telemetry.export import (
    OneLineFailureExporter,
    check_otlp_collector,
    otlp_endpoint,
)
from tests.cli_kit import run


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: nobody listens there


def test_endpoint_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert otlp_endpoint() == "http://localhost:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert otlp_endpoint() == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c.example/custom")
    assert otlp_endpoint() == "https://c.example/custom"


def test_compact_without_a_collector_fails_in_one_line_and_writes_nothing(
    example: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    before = sorted(p.name for p in example.parent.iterdir()), example.read_bytes()
    code, out, err = run(capsys, "compact", str(example), "--trace", "otlp")
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(
        f"orchestrator compact: --trace otlp: no OTLP collector at {endpoint}/v1/traces ("
    )
    assert (sorted(p.name for p in example.parent.iterdir()), example.read_bytes()) == before


def test_a_listening_collector_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}/v1/traces"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        assert check_otlp_collector() == endpoint
    with pytest.raises(OrchestratorError, match="no OTLP collector at"):
        check_otlp_collector()


class Failing(SpanExporter):
    """Fails like the OTLP exporter: a retry warning on its logger, then FAILURE."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").warning(
            "Transient error ... retrying"
        )
        return SpanExportResult.FAILURE


def test_a_failure_mid_run_is_one_line_once(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    inner = Failing()
    exporter = OneLineFailureExporter(inner, "http://c:4318/v1/traces")
    assert exporter.export([]) is SpanExportResult.FAILURE
    assert exporter.export([]) is SpanExportResult.FAILURE
    assert inner.calls == 1  # the second batch is not even tried
    err = capsys.readouterr().err
    assert err == (
        "warning: trace export to http://c:4318/v1/traces failed; "
        "no more spans are sent in this run\n"
    )
    assert "Transient error" not in caplog.text
