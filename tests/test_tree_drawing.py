"""``tree`` draws branches with connectors, and cuts its lines to a terminal's width.

Siblings were drawn at the same indent with nothing between them, so a branch read as one long
chain; and on a terminal a long line wrapped, its continuation without the ``│`` marker.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from orchestrator._core.tree_drawing import tree_prefixes
from tests.cli_kit import run
from tests.sessions import SessionBuilder


def branched(tmp_path: Path) -> Path:
    """u1 a1, then two tries from a1: A (u2 a2) and B (u3, answered twice: a3, then a4)."""
    s = SessionBuilder()
    s.user("first question")
    a1 = s.assistant("answer one")
    s.user("try A")
    s.assistant("A done")
    s.branch(a1)
    u3 = s.user("try B " + "and explain it at length " * 4)
    s.assistant("B one")
    s.branch(u3)
    s.assistant("B two")
    path = tmp_path / "branched.jsonl"
    lines = [s.header, *s.entries]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_tree_draws_each_branch_with_connectors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "tree", str(branched(tmp_path)))
    assert code == 0, err
    long = "try B " + "and explain it at length " * 4
    assert out == (
        "│ 00000001 user: first question\n"
        "│ 00000002 assistant: answer one\n"
        "  ├─ 00000003 user: try A\n"
        "  │  00000004 assistant: A done\n"
        f"│ └─ 00000005 user: {long[:69]}…\n"
        "     ├─ 00000006 assistant: B one\n"
        "*    └─ 00000007 assistant: B two\n"
        "-- 7 entries; * marks the active leaf, │ the active path\n"
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_line_is_cut_to_the_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator._cli.main import main

    screen = Terminal()
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setenv("COLUMNS", "40")
    assert main(["tree", str(branched(tmp_path))]) == 0
    lines = screen.getvalue().splitlines()
    assert lines[4] == "│ └─ 00000005 user: try B and explain …"
    assert all(len(line) < 40 for line in lines[:-1])  # each keeps its marker on its row
    assert lines[6] == "*    └─ 00000007 assistant: B two"


def test_prefixes_for_several_roots_and_a_missing_parent() -> None:
    rows = [("a", None), ("a1", "a"), ("b", None), ("c", "gone")]
    assert tree_prefixes(rows) == ["├─ ", "│  ", "├─ ", "└─ "]
