"""The README's commands, and the machine diagrams of docs/machines.md (moved there from the
README), which are generated from machines/: regenerate them with
``python tests/test_readme.py --write``."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._lifecycle.render import render_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MACHINES_PAGE = ROOT / "docs" / "machines.md"
BEGIN, END = "<!-- machines:begin -->", "<!-- machines:end -->"


def generated() -> str:
    return "\n".join(
        render_markdown(load_machine(name))
        for name in ("turn", "operation", "navigation", "session")
        if name in shipped_machines()
    )


def with_diagrams(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{generated()}{END}{tail}"


def test_machine_diagrams_match_the_tables() -> None:
    text = MACHINES_PAGE.read_text(encoding="utf-8")
    assert text == with_diagrams(text), (
        "docs/machines.md diagrams are stale: python tests/test_readme.py --write"
    )
    assert set(shipped_machines()) == {"turn", "operation", "navigation", "session"}


def test_readme_starts_with_install_and_test_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 5]
    assert block == [
        "python3 -m venv .venv && . .venv/bin/activate",
        "python3 -m pip install -c constraints.txt -e '.[dev,cluster]'",
        "python3 -m pytest",
        "orchestrator compact tests/data/example-session.jsonl --dry-run",
    ]


def test_ci_installs_and_runs_the_readme_test_command() -> None:
    # The same install line as the README's: a new user's test run is CI's (issue 35: with
    # '.[dev]' alone, the cluster tests failed on temporalio).
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # CI runs the README's first block line by line (tests/test_services.py), the install and
    # the test run included, and has no install of its own.
    assert "done 3< <(.ci/readme-block README.md)" in ci
    assert not [line for line in ci if "pip install" in line]
    assert "set -euo pipefail" in ci  # a failing gate, or pytest's 5 (no test ran), fails CI


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    MACHINES_PAGE.write_text(
        with_diagrams(MACHINES_PAGE.read_text(encoding="utf-8")), encoding="utf-8"
    )
