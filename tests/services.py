"""External services for tests (issue 10): find them, or skip locally and fail in CI.

``.ci/run`` starts each service, exports where it listens, and sets
``ORCHESTRATOR_REQUIRE_SERVICES=1``. A developer's run without a service skips the tests that
need it, saying which variable to set; CI never skips them: with the requirement set, a missing
service fails the test instead.

* ``ORCHESTRATOR_TEST_DATABASE``: a PostgreSQL URL whose role may create schemas. Each test gets
  its own schema (:func:`fresh_schema_url`), dropped after, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

REQUIRE_SERVICES = "ORCHESTRATOR_REQUIRE_SERVICES"
DATABASE = "ORCHESTRATOR_TEST_DATABASE"


def services_required() -> bool:
    """Whether a missing service must fail the test (CI) rather than skip it."""
    return os.environ.get(REQUIRE_SERVICES, "") == "1"


def missing(message: str) -> NoReturn:
    """End the test for want of what ``message`` names: a failure under CI, else a skip.

    The one place a test skips: only here, and only outside CI (``.ci/run`` requires every
    service, so there the same lack fails the test).
    """
    if services_required():
        pytest.fail(f"{REQUIRE_SERVICES}=1 but {message}")
    pytest.skip(message)


def service_env(variable: str, what: str) -> str:
    """The value of ``variable``, or skip (locally) / fail (CI) naming what is missing.

    Args:
        variable: The environment variable ``.ci/run`` exports.
        what: The service, for the message (``"PostgreSQL"``).
    """
    value = os.environ.get(variable, "")
    if value:
        return value
    missing(f"needs {what}: set {variable} (.ci/run starts it and sets it)")


def with_search_path(url: str, schema: str) -> str:
    """``url`` with its ``search_path`` set to ``schema`` (libpq's ``options`` parameter)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_schema_url(base: str) -> Iterator[str]:
    """A URL whose tables live in a new, empty schema, dropped (with its rows) on exit."""
    import psycopg
    from psycopg import sql

    schema = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def database_base_url() -> str:
    """The test database's URL (skips or fails when it is not configured, see the module)."""
    url = service_env(DATABASE, "PostgreSQL")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("needs psycopg: pip install -e '.[dev,cluster]'")
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL with a private, empty schema for this test."""
    with fresh_schema_url(database_base_url()) as url:
        yield url
