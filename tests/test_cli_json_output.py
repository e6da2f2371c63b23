"""``print_json`` writes what ``json.dumps(value, ensure_ascii=False, indent=2)`` writes.

A process that imported msgspec encodes with it, a piece at a time, floats put back as Python
writes them (``_cli/json_output.py``); these tests hold that path to the standard one, byte for
byte, on the values that could tell them apart.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from orchestrator._cli import common
from orchestrator._cli.terminal import TerminalSafe
from orchestrator._core.printable import terminal_safe

ROOT = Path(__file__).resolve().parents[1]

VALUES: list[Any] = [
    {},
    [],
    {"a": [], "b": {}, "c": [[], {}]},
    [1e16, 1e20, 1.5e-05, 1e-07, 0.1, -0.0, 5e-324, 1.7976931348623157e308, 1.0],
    [2**63, -(2**63), 2**64 - 1, 2**64, 2**200, 0, -1, True, False, None],
    {"text": 'a\x00\x01\x1f\x7f\u2028\u2029"\\\n\r\t\b\f/é😀 :, {}[]'},
    {"k": [1, {"x": "y", "nested": {"deep": [None]}}], "z": 2, "": ""},
    {"é": "ü", "😀": ["😀"]},
]


def _choose(monkeypatch: pytest.MonkeyPatch, *, fast: bool) -> None:
    # The fast path is taken by a process that has imported msgspec (it read a big file).
    if fast:
        monkeypatch.setitem(sys.modules, "msgspec", msgspec)
    else:
        monkeypatch.delitem(sys.modules, "msgspec", raising=False)


def _printed(value: Any, monkeypatch: pytest.MonkeyPatch, *, fast: bool) -> bytes:
    _choose(monkeypatch, fast=fast)
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
    monkeypatch.setattr(sys, "stdout", out)
    common.print_json(value)
    out.flush()
    monkeypatch.undo()
    return raw.getvalue()


@pytest.mark.parametrize("value", VALUES)
def test_fast_indent_is_the_standard_one(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode()
    assert _printed(value, monkeypatch, fast=True) == expected
    assert _printed(value, monkeypatch, fast=False) == expected


def test_lone_surrogate_takes_the_standard_path(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = _printed({"t": "a\ud800b"}, monkeypatch, fast=True)
    assert printed == b'{\n  "t": "a\\ud800b"\n}\n'


def test_text_stream_without_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    _choose(monkeypatch, fast=True)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    common.print_json({"a": [1, "é"]})
    assert out.getvalue() == json.dumps({"a": [1, "é"]}, ensure_ascii=False, indent=2) + "\n"


def test_a_process_without_msgspec_does_not_import_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "msgspec", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    common.print_json({"a": 1})
    assert "msgspec" not in sys.modules


@pytest.mark.parametrize("text", ["a\x7fb", "a\x9bc", "\x80", "é\x9f", "ok é ©"])
def test_terminal_controls_are_escaped_as_the_terminal_safe_stream_does(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = {"t": text, "n": [1.5e-05]}
    expected = terminal_safe(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
    for fast in (True, False):
        _choose(monkeypatch, fast=fast)
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        monkeypatch.setattr(sys, "stdout", TerminalSafe(out))  # as the command line runs
        common.print_json(value)
        out.flush()
        monkeypatch.undo()
        assert raw.getvalue().decode() == expected


def test_the_console_script_exits_with_every_byte_written(tmp_path: Path) -> None:
    """``run`` ends an inspection command without freeing what it read: nothing is lost."""
    from tests.bench.bench_core import write_session

    path = tmp_path / "s.jsonl"
    write_session(path, 2_000)  # over 1 MiB: msgspec reads it and indents the output
    script = "from orchestrator._cli.main import run; run()"
    for command in ("context", "plan", "check", "tree"):
        done = subprocess.run(
            [sys.executable, "-c", script, command, "--json", str(path)],
            capture_output=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.endswith(b"}\n")
        json.loads(done.stdout)
    done = subprocess.run(
        [sys.executable, "-c", script, "plan", "--json", str(tmp_path / "none.jsonl")],
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert b"no such session file" in done.stderr


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_stdout_that_is_not_utf8_gets_ascii_in_a_process_with_msgspec(
    encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/sessions.md: every non-ASCII character escaped, whichever encoder a big output takes.
    value = {"t": "smile \U0001f600 café", "n": [1e16, 1.5e-05], "long": ["é"] * 600}
    _choose(monkeypatch, fast=True)
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding, newline="\n")
    monkeypatch.setattr(sys, "stdout", out)
    common.print_json(value)
    out.flush()
    monkeypatch.undo()
    assert raw.getvalue() == (json.dumps(value, ensure_ascii=True, indent=2) + "\n").encode()
    assert b"smile \\ud83d\\ude00 caf\\u00e9" in raw.getvalue()
