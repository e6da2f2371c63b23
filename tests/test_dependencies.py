"""Supply chain (issue 8 item 8): bounded dependencies and a CI install pinned to exact versions."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
DECLARED = [
    Requirement(text)
    for text in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["dev"]]
]
BUILD = [Requirement(text) for text in PYPROJECT["build-system"]["requires"]]


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            found[Requirement(name).name.lower().replace("_", "-")] = Version(version)
    return found


def next_major(version: Version) -> Version:
    return Version(f"{version.major + 1}") if version.major else Version("1")


@pytest.mark.parametrize("requirement", [*DECLARED, *BUILD], ids=str)
def test_every_dependency_stops_before_its_next_major(requirement: Requirement) -> None:
    # The next major after the version CI runs: a breaking release is a deliberate upgrade.
    lower = [s for s in requirement.specifier if s.operator == ">="]
    upper = [s for s in requirement.specifier if s.operator == "<"]
    assert lower, f"{requirement}: no lower bound"
    assert upper, f"{requirement}: no upper bound"
    pinned = pins()[requirement.name.lower()]
    assert Version(upper[0].version) == next_major(pinned), (requirement, pinned)


def test_the_compromised_litellm_releases_stay_excluded() -> None:
    [litellm] = [r for r in DECLARED if r.name == "litellm"]
    assert not litellm.specifier.contains("1.82.7")
    assert not litellm.specifier.contains("1.82.8")
    assert litellm.specifier.contains("1.82.9")
    assert pins()["litellm"] not in (Version("1.82.7"), Version("1.82.8"))


def test_constraints_pin_every_declared_dependency_within_its_bounds() -> None:
    pinned = pins()
    for requirement in DECLARED:
        name = requirement.name.lower().replace("_", "-")
        assert name in pinned, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pinned[name]), (requirement, pinned[name])
    assert "session-orchestrator" not in pinned


def test_ci_installs_with_the_constraints() -> None:
    # CI installs by running the README's first block (tests/test_services.py checks that it
    # does): the block's install line is pinned by the constraints.
    readme = (ROOT / "README.md").read_text()
    assert "pip install -c constraints.txt -e '.[dev,cluster]'" in readme.split("```")[1]
    refresh = (ROOT / ".ci" / "refresh-constraints").read_text()
    assert 'pip" freeze --exclude session-orchestrator' in refresh
