"""Opt-in: a real tracing dashboard, Arize Phoenix, reads what ``--trace otlp`` exports.

Not part of the default run: it needs the ``phoenix`` extra. Run it with::

    pip install -e '.[dev,phoenix]'
    ORCHESTRATOR_PHOENIX=1 python -m pytest tests/phoenix -q

The test starts ``phoenix serve`` on free loopback ports with a throwaway working directory
(SQLite), offline: its telemetry pixels and every resource it would fetch from the internet are
switched off (``PHOENIX_TELEMETRY_ENABLED=false``, ``PHOENIX_ALLOW_EXTERNAL_RESOURCES=false``)
and it gets no proxy. Then ``orchestrator compact`` and ``orchestrator navigate --summarize`` run
on a copy of the example session with ``--trace otlp`` pointed at it, and the spans are read back
through Phoenix's own client: the operation spans with their transitions as events, the model-call
spans with model, token counts, finish reasons and the OpenInference span kinds Phoenix uses.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator._cli.main import main

ENABLED = os.environ.get("ORCHESTRATOR_PHOENIX") == "1"
EXAMPLE = Path(__file__).resolve().parent.parent / "data" / "example-session.jsonl"
PROJECT = "orchestrator-phoenix-test"
BRANCH_TARGET = "11a25bfa"  # a user message on the example session's other branch
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
OFFLINE = {
    "PHOENIX_TELEMETRY_ENABLED": "false",
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "DO_NOT_TRACK": "1",
}
POLLS = 600  # half-second polls for spans to be ingested; Phoenix writes them in batches

pytestmark = [
    pytest.mark.dashboard,
    pytest.mark.skipif(not ENABLED, reason="opt-in: set ORCHESTRATOR_PHOENIX=1 (needs .[phoenix])"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix server on loopback, offline; yields its base URL."""
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in PROXIES and not k.startswith("OTEL_")}
    env.update(OFFLINE)
    env.update(
        PHOENIX_WORKING_DIR=str(work),
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
    )
    log = (work / "phoenix.log").open("wb")
    command = [sys.executable, "-c", "from phoenix.server.main import main; main()", "serve"]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # It either comes up or exits; I wait on the process, not on a clock.
        while process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", trust_env=False).status_code == 200:
                    break
            time.sleep(0.5)
        log.flush()
        assert process.poll() is None, (work / "phoenix.log").read_text(errors="replace")[-3000:]
        yield url
    finally:
        process.terminate()
        process.wait()
        log.close()


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    assert code == 0, out.getvalue()
    return out.getvalue()


def _flat(attributes: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    # Phoenix may hand attributes back nested by their dotted parts; compare them flat.
    flat: dict[str, Any] = {}
    for key, value in attributes.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@pytest.fixture(scope="module")
def spans(phoenix: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Export a compaction and a branch summary to Phoenix; its spans, read back."""
    with warnings.catch_warnings():
        # Importing the client imports the server package, whose LDAP dependency uses a
        # deprecated pyasn1 name; that is theirs, and warnings are errors here.
        warnings.simplefilter("ignore", DeprecationWarning)
        from phoenix.client import Client

    session = tmp_path_factory.mktemp("session") / "session.jsonl"
    shutil.copyfile(EXAMPLE, session)
    with pytest.MonkeyPatch.context() as env:
        for proxy in PROXIES:
            env.delenv(proxy, raising=False)
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)
        env.setenv("OTEL_SERVICE_NAME", "orchestrator-test")
        env.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={PROJECT}")
        env.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
        _cli("compact", str(session), "--trace", "otlp")
        _cli("navigate", str(session), "--to", BRANCH_TARGET, "--summarize", "--trace", "otlp")
    client = Client(base_url=phoenix)
    wanted = {"orchestrator.compaction", "orchestrator.branch_summary", "orchestrator.navigation"}
    found: list[dict[str, Any]] = []
    for _ in range(POLLS):
        with contextlib.suppress(httpx.HTTPStatusError):  # the project appears with its spans
            found = [dict(s) for s in client.spans.get_spans(project_identifier=PROJECT, limit=500)]
        if wanted <= {s["name"] for s in found} and len(found) >= 5:
            break
        time.sleep(0.5)
    for span in found:
        span["attributes"] = _flat(span.get("attributes") or {})
    return found


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    matching = [s for s in spans if s["name"] == name]
    assert len(matching) == 1, sorted(s["name"] for s in spans)
    return matching[0]


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in spans if s.get("parent_id") == parent["context"]["span_id"]]


def _transitions(span: dict[str, Any]) -> list[dict[str, Any]]:
    events = span.get("events") or []
    assert events, f"{span['name']} has no events"
    assert {e["name"] for e in events} == {"transition"}
    return [_flat(e.get("attributes") or {}) for e in events]


@pytest.mark.parametrize("operation", ["compaction", "branch_summary"])
def test_operation_spans_with_their_transitions(
    spans: list[dict[str, Any]], operation: str
) -> None:
    span = _one(spans, f"orchestrator.{operation}")
    assert span["span_kind"] == "CHAIN"
    attributes = span["attributes"]
    assert attributes["orchestrator.operation.kind"] == operation
    assert attributes["orchestrator.operation.outcome"] == "committed"
    if operation == "compaction":
        assert attributes["orchestrator.operation.tokens_before"] > 0
        assert attributes["orchestrator.operation.summarized"] > 0
    assert '"outcome": "committed"' in attributes["output.value"]
    steps = _transitions(span)
    assert {s["machine"] for s in steps} == {"operation"}
    assert steps[0]["from"] == "preparing"
    assert steps[-1]["to"] == "committed"


@pytest.mark.parametrize("operation", ["compaction", "branch_summary"])
def test_model_call_spans_carry_model_tokens_and_finish_reason(
    spans: list[dict[str, Any]], operation: str
) -> None:
    calls = _children(spans, _one(spans, f"orchestrator.{operation}"))
    assert calls, f"no model call under {operation}"
    for call in calls:
        attributes = call["attributes"]
        assert call["span_kind"] == "LLM"
        assert call["name"] == f"summarize {attributes['llm.model_name']}"
        assert attributes["gen_ai.request.model"] == attributes["llm.model_name"]
        prompt = attributes["llm.token_count.prompt"]
        completion = attributes["llm.token_count.completion"]
        assert prompt > 0
        assert completion > 0
        assert attributes["llm.token_count.total"] == prompt + completion
        assert attributes["gen_ai.usage.input_tokens"] == prompt
        assert list(attributes["gen_ai.response.finish_reasons"]) == ["stop"]
        assert "<conversation>" in attributes["input.value"]
        assert attributes["output.value"]


def test_navigation_span_holds_the_branch_summary_and_its_steps(
    spans: list[dict[str, Any]],
) -> None:
    navigation = _one(spans, "orchestrator.navigation")
    assert navigation["span_kind"] == "CHAIN"
    assert navigation["attributes"]["orchestrator.navigation.target_id"] == BRANCH_TARGET
    assert navigation["attributes"]["session.id"]
    assert _one(spans, "orchestrator.branch_summary") in _children(spans, navigation)
    assert {s["machine"] for s in _transitions(navigation)} == {"navigation"}
