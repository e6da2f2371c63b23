"""A session's text never drives the terminal: what the commands print shows control characters.

Tool results hold what the tools printed: colour codes, and from a hostile page a sequence that
retitles the terminal (``ESC ] 0 ; ... BEL``) or clears it (``ESC [ 2 J``). ``tree`` and
``context`` printed them raw.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._cli.terminal import TerminalSafe, unwrapped
from orchestrator._core.printable import terminal_safe
from orchestrator._tui.picker import row_content
from tests.cli_kit import run

HOSTILE = "\x1b[31mRED\x1b[0m \x1b]0;pwned\x07 done\x1b[2J \x7f\x9b"
SHOWN = "\\u001b[31mRED\\u001b[0m \\u001b]0;pwned\\u0007 done\\u001b[2J \\u007f\\u009b"


def _usage(n: int) -> dict[str, Any]:
    zero = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}
    return {
        "input": n,
        "output": 1,
        "cacheRead": 0,
        "cacheWrite": 0,
        "totalTokens": n + 1,
        "cost": zero,
    }


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    lines: list[dict[str, Any]] = [
        {
            "type": "session",
            "version": 3,
            "id": "s-1",
            "timestamp": "2026-12-04T10:00:00.000Z",
            "cwd": "/",
        },
        {
            "type": "message",
            "id": "u1",
            "parentId": None,
            "timestamp": "2026-12-04T10:00:01.000Z",
            "message": {
                "role": "user",
                "content": [{"type": "text", "text": "run it"}],
                "timestamp": 1,
            },
        },
        {
            "type": "message",
            "id": "a1",
            "parentId": "u1",
            "timestamp": "2026-12-04T10:00:02.000Z",
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": HOSTILE}],
                "provider": "p",
                "model": "m",
                "usage": _usage(1),
                "stopReason": "stop",
                "timestamp": 2,
            },
        },
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_tree_and_context_show_control_characters_instead_of_sending_them(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("tree", "context"):
        code, out, err = run(capsys, command, str(hostile))
        assert (code, err) == (0, "")
        assert not set(out) & {"\x1b", "\x07", "\x9b"}
        assert SHOWN in out


def test_json_output_keeps_the_same_values(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "context", str(hostile), "--json")
    assert code == 0
    assert not set(out) & {"\x7f", "\x9b"}  # JSON itself leaves these two raw
    report = json.loads(out)
    assert report["messages"][1]["content"][0]["text"] == HOSTILE


def test_an_error_naming_text_from_the_file_is_shown_escaped(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "fork", str(hostile), "--from", "a1\x1b[2J")
    assert code == 1
    assert "\x1b" not in err
    assert "\\u001b[2J" in err or "\\x1b[2J" in err


def test_bytes_and_our_own_control_output_pass_through() -> None:
    raw = io.BytesIO()
    under = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    safe = TerminalSafe(under)
    safe.write("a\x1bb\tc\n")
    safe.buffer.write(b"\x1b[2J")  # export writes the stored bytes as they are
    assert raw.getvalue() == b"a\\u001bb\tc\n\x1b[2J"
    assert unwrapped(safe) is under  # the spinner's own \r and erase-line go underneath
    assert unwrapped(under) is under


def test_the_tree_navigator_shows_them_too() -> None:
    row = {
        "current": False,
        "onActivePath": True,
        "label": "l\x1b[5m",
        "prefix": "└─ ",
        "text": HOSTILE,
    }
    plain = row_content(row).plain
    assert "\x1b" not in plain
    assert SHOWN in plain
    assert "[l\\u001b[5m]" in plain


@given(st.text())
def test_escaping_keeps_every_json_value(text: str) -> None:
    line = json.dumps({"t": text}, ensure_ascii=False)
    assert json.loads(terminal_safe(line)) == {"t": text}
    assert not any(ch in terminal_safe(text) for ch in "\x1b\x07\x9b\x00\r")
