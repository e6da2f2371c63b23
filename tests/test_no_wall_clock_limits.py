"""No test has a wall-clock limit: these machines are shared and noisy (speed is benchmarked)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

TESTS = Path(__file__).resolve().parent


def test_property_tests_have_no_deadline() -> None:
    # conftest.py loads the profile; hypothesis's own default is 200 ms per example.
    current = settings.default
    assert current is not None
    assert current.deadline is None


def test_no_test_module_sets_a_deadline_of_its_own() -> None:
    timed = re.compile(r"deadline\s*=\s*(?!None\b)")
    offenders = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if "node_modules" not in path.parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "@settings" in line and timed.search(line)
    ]
    assert offenders == []
