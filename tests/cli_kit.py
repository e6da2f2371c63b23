"""Shared pieces for tests: the example session, an in-process runner, a line pi appends."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._cli.main import main
from orchestrator._store.jsonl import write_pi_line
from orchestrator.testing import summary_text

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``orchestrator ARGV...`` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def model_args(url: str, api_key: str | None = "test") -> list[str]:
    """``--model openai/test-model --api-base URL/v1 --api-key KEY``: a local provider's model.

    ``url``: the provider's (``LocalProvider.url``). ``api_key=None``: no ``--api-key``.
    """
    key = [] if api_key is None else ["--api-key", api_key]
    return ["--model", "openai/test-model", "--api-base", url + "/v1", *key]


def pi_user_line(
    parent: str | None, entry_id: str = "c0ffee01", text: str = "typed in pi"
) -> bytes:
    """A user message as pi appends it to a session file (its own line format, no lock)."""
    return write_pi_line(
        {
            "type": "message",
            "id": entry_id,
            "parentId": parent,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": text, "timestamp": 1},
        }
    )


def either_part(note: str) -> str:
    """A scripted summary the gate (D32) passes for a history or a turn-prefix request.

    A split turn's two requests run at once and take a provider's replies in arrival order:
    each reply holds both layouts, so it passes whichever request it answers.
    """
    return summary_text(note) + "\n\n" + summary_text(note, purpose="turn_prefix")
