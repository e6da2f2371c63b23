"""Fixtures shared by several test modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.cli_kit import EXAMPLE
from tests.cluster_kit import Database

# The service fixtures (PostgreSQL), usable by every test module.
from tests.services import pg_url as pg_url  # noqa: F401

# No wall-clock limit on any property test: hypothesis's default 200 ms deadline per example
# failed test_rpc_server's chunking property on a host at load 9 (these machines are shared).
# A module's own @settings overrides only what it names, so this holds for every @given.
settings.register_profile(
    "shared-machines", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-machines")


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """A private copy of the shipped example session, safe to change."""
    target = tmp_path / "session.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


@pytest.fixture(params=["files", "postgres"])
def cluster_database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """A store the cluster tests share between processes: a directory, then PostgreSQL."""
    if request.param == "postgres":
        return Database(request.getfixturevalue("pg_url"))
    return Database(str(tmp_path / "db"))
