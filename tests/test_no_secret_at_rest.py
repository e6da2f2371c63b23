"""A provider that echoes the API key in its error text: the key is written nowhere (issue 35).

Some proxies answer a 401 (and a 500) with the request's key, or its ``Authorization`` header,
in the error message. That text went verbatim into the journal (then ``0644``), into the
``--trace jsonl:`` files (the provider's own exception's stack trace too), onto stderr and into
the events. The provider here is the real local one (``LocalProvider``, 127.0.0.1) reached
through the real litellm route.
"""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import ModelError
from orchestrator._core.redact import REDACTED, redact, remember_secret
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._runtime.agent import ChatAgent
from orchestrator._runtime.events import Event
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._store.journal import journal_path
from orchestrator._store.session import Session
from orchestrator._telemetry.export import make_tracer_provider
from orchestrator._telemetry.tracing import LifecycleTracer
from orchestrator.testing import FakeClock, LocalProvider, Reply
from tests.cli_kit import model_args, run

KEY = "sk-proj-Zq8xT2vLm9Kp4Rw7Yb3Nc6Hd1Fg5Js0Ae"
PLAIN_KEY = "local-proxy-key-1"  # not shaped like a key: only its exact value finds it


def _echoing(status: int, key: str) -> Reply:
    """What the proxy answers: the key, quoted and in the header it came in."""
    text = f"Incorrect API key provided: {key}. Request had Authorization: Bearer {key}"
    # retry-after 0: a 500 is retried at once (no waiting in tests)
    return Reply.error(status, text, retry_after="0")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _written(journal: Path, traces: Path) -> dict[str, str]:
    """Every file the run wrote beside the session, by name, checked to be the owner's only."""
    files = {journal: 0o600, traces: 0o700, **dict.fromkeys(traces.iterdir(), 0o600)}
    assert {path: _mode(path) for path in files} == files
    texts = {str(path): path.read_text() for path in files if path.is_file()}
    assert len(texts) > 1  # the journal and a trace file at least
    joined = "".join(texts.values())
    assert "Incorrect API key provided: [redacted]" in texts[str(journal)]  # it is journaled
    assert "Traceback" in joined  # the provider's stack trace is there, redacted
    return texts


@pytest.mark.parametrize("key", [KEY, PLAIN_KEY], ids=["sk-key", "plain-key"])
def test_the_command_line_writes_the_key_nowhere(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    traces = tmp_path / "traces"
    with LocalProvider((_echoing(401, key), _echoing(401, key))) as provider:
        code, out, err = run(
            capsys,
            "compact",
            str(example),
            *model_args(provider.url, key),
            "--trace",
            f"jsonl:{traces}",
        )
        sent = {request.headers["authorization"] for request in provider.requests}
    assert sent == {f"Bearer {key}"}  # the key did go to the provider
    assert code == 1
    assert "Incorrect API key provided: [redacted]. Request had Authorization: Bearer" in err
    written = {"stderr": err, "stdout": out, **_written(journal_path(example), traces)}
    assert [where for where, text in written.items() if key in text] == []


@pytest.mark.parametrize("status", [401, 500])
def test_the_journal_the_traces_the_events_and_the_error_hold_no_key(
    example: Path, tmp_path: Path, status: int
) -> None:
    heard: list[Event] = []
    traces = tmp_path / "traces"
    clock = FakeClock()  # a 500 is retried: the waits are the fake clock's

    async def go() -> ModelError:
        with LocalProvider(tuple(_echoing(status, PLAIN_KEY) for _ in range(8))) as provider:
            model = LiteLLMModel(
                "openai/test-model", api_base=provider.url + "/v1", api_key=PLAIN_KEY
            )
            runtime = AgentSession.open(
                example,
                owner="test",
                summarizer=SummaryRoutes(candidates=(model,), sleep=clock.sleep),
                tracer=LifecycleTracer(make_tracer_provider("jsonl", traces)),
                sleep=clock.sleep,
            )
            runtime.events.subscribe(heard.append)
            try:
                with pytest.raises(ModelError) as failed:
                    await runtime.compact()
            finally:
                runtime.close()
        return failed.value

    error = anyio.run(go)
    assert error.kind == ("fatal" if status == 401 else "transient")
    assert "Incorrect API key provided: [redacted]" in str(error)
    events = [repr(event.as_json()) for event in heard]
    written = {"error": str(error), **_written(journal_path(example), traces)}
    written.update({f"event {n}": event for n, event in enumerate(events)})
    assert [where for where, text in written.items() if PLAIN_KEY in text] == []


@pytest.mark.parametrize("status", [401, 500])
def test_a_failed_turn_keeps_no_key_in_the_session_or_its_events(
    tmp_path: Path, status: int
) -> None:
    # A chat turn's failure is written into the session (pi's errorMessage) and, retried, into
    # the auto_retry_start events.
    heard: list[Event] = []
    clock = FakeClock()
    path = tmp_path / "s.jsonl"

    async def go() -> None:
        with LocalProvider(tuple(_echoing(status, PLAIN_KEY) for _ in range(8))) as provider:
            model = LiteLLMModel(
                "openai/test-model", api_base=provider.url + "/v1", api_key=PLAIN_KEY
            )
            runtime = AgentSession(
                Session.open(path), agent=ChatAgent(model=model), sleep=clock.sleep
            )
            runtime.events.subscribe(heard.append)
            try:
                await runtime.prompt("hello")
            finally:
                runtime.close()

    anyio.run(go)
    events = [repr(event.as_json()) for event in heard]
    saved = path.read_text()
    assert "Incorrect API key provided: [redacted]" in saved  # pi's errorMessage
    if status == 500:
        assert any("auto_retry_start" in event and "[redacted]" in event for event in events)
    written = {"session": saved}
    written.update({f"event {n}": event for n, event in enumerate(events)})
    assert [where for where, text in written.items() if PLAIN_KEY in text] == []


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (f"key {KEY} refused", f"key {REDACTED} refused"),
        ("Authorization: Bearer abc.def", f"Authorization: Bearer {REDACTED}"),
        ('{"authorization": "Basic dXNlcjpw"}', f'{{"authorization": "Basic {REDACTED}"}}'),
        ("bearer tok_123", f"bearer {REDACTED}"),
        ("headers: {'x-api-key': 'abc123'}", f"headers: {{'x-api-key': '{REDACTED}'}}"),
        ("api-key: abc123; next", f"api-key: {REDACTED}; next"),
        ("api_key=abc123&x=1", f"api_key={REDACTED}&x=1"),
        ("GET /v1?key=AIzaSy0&alt=json", f"GET /v1?key={REDACTED}&alt=json"),
        ("https://me:hunter22@proxy/v1", f"https://me:{REDACTED}@proxy/v1"),
        ("sk-ant-api03-abcdefghijklmnop", REDACTED),
        ("token eyJhbGci.eyJzdWIi.c2ln", f"token {REDACTED}"),
        ("gsk_aB3dE6gH9jK2mN5pQ8sT1vW4 bad", f"{REDACTED} bad"),
        ("azure 0123456789abcdef0123456789abcdef", f"azure {REDACTED}"),
    ],
)
def test_secrets_are_redacted(text: str, redacted: str) -> None:
    assert redact(text) == redacted
    assert redact(redacted) == redacted  # twice is once


@pytest.mark.parametrize(
    "text",
    [
        "Entry daa66d13 not found",
        "session 0198c3a1-7e2f-7c3b-9a51-5b3e2f1c4d6e is locked",
        "openai/claude-3-5-sonnet-20241022 at /usr/lib/python3.11/site-packages/litellm/main.py",
        "Error code: 429 - rate limit reached for gpt-4o-mini-2024-07-18 (internationalization)",
        "Authorization failed",  # the word alone, no value after a colon
    ],
)
def test_ordinary_ids_and_words_are_kept(text: str) -> None:
    assert redact(text) == text


def test_a_remembered_key_is_redacted_by_value_and_a_short_one_is_not() -> None:
    remember_secret("  remembered-value-9  ")
    remember_secret("short")
    remember_secret(None)
    assert redact("got remembered-value-9, short") == f"got {REDACTED}, short"
    remember_secret("remembered-value-9")  # again: nothing changes
    assert redact("remembered-value-9") == REDACTED


def test_a_model_error_is_redacted_where_it_is_made() -> None:
    assert str(ModelError(f"401: {KEY}")) == f"401: {REDACTED}"
