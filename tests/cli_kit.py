"""Shared pieces for command-line tests: the example session and an in-process runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._cli.main import main

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``orchestrator ARGV...`` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
