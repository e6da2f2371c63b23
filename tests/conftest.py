"""Fixtures shared by several test modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli_kit import EXAMPLE
from tests.cluster_kit import Database

# The service fixtures (PostgreSQL), usable by every test module.
from tests.services import pg_url as pg_url  # noqa: F401


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
