"""``compact`` with a small summarizer window: the output budget is clamped, or the command
refuses in one line and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._store.session import Session
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import either_part, model_args, run


def compact(
    example: Path, capsys: pytest.CaptureFixture[str], provider: LocalProvider, window: int
) -> tuple[int, str, str]:
    return run(
        capsys,
        "compact",
        str(example),
        *model_args(provider.url),
        "--context-window",
        str(window),
    )


def test_a_4000_token_window_gets_a_request_that_fits_it(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replies = (
        Reply.summary(either_part("History.")),
        Reply.summary(either_part("Prefix.")),
    )
    with LocalProvider(replies) as provider:
        code, _, err = compact(example, capsys, provider, 4000)
        requests = provider.requests
    assert code == 0, err
    assert requests
    for request in requests:
        assert request.body["max_tokens"] == 1000  # a quarter of the window, not 13107 or 8192
        prompt = "".join(str(m["content"]) for m in request.body["messages"])
        assert len(prompt) / 4 + request.body["max_tokens"] <= 4000
        assert "[User]:" in prompt or "[Assistant]:" in prompt  # not only an elision marker
    assert "History." in Session.open(example).tree.entries[-1]["summary"]


def test_a_window_too_small_for_anything_useful_is_refused(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    with LocalProvider(()) as provider:
        code, out, err = compact(example, capsys, provider, 600)
        requests = provider.requests
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("orchestrator compact: Summarization refused: ")
    assert "context window (600 tokens)" in err
    assert not requests  # no model is paid for a request that cannot help
    assert example.read_bytes() == before
