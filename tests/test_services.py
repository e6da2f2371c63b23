"""The service fixtures skip on a laptop and fail in CI; .ci/run starts and stops the services."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services import DATABASE, REQUIRE_SERVICES, service_env, with_search_path

ROOT = Path(__file__).resolve().parent.parent


def test_a_missing_service_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_SERVICES, raising=False)
    monkeypatch.delenv(DATABASE, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"set {DATABASE}"):
        service_env(DATABASE, "PostgreSQL")


def test_a_missing_service_fails_when_services_are_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_SERVICES, "1")
    monkeypatch.delenv(DATABASE, raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_SERVICES}=1 but needs PostgreSQL"):
        service_env(DATABASE, "PostgreSQL")
    monkeypatch.setenv(DATABASE, "postgresql://h/db")
    assert service_env(DATABASE, "PostgreSQL") == "postgresql://h/db"


def test_search_path_is_added_to_any_url() -> None:
    assert (
        with_search_path("postgresql://h/db", "t1")
        == "postgresql://h/db?options=-csearch_path%3Dt1"
    )
    assert with_search_path("postgresql://h/db?sslmode=disable", "t1").endswith(
        "?sslmode=disable&options=-csearch_path%3Dt1"
    )


def test_ci_starts_postgres_requires_services_and_stops_them_on_exit() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export ORCHESTRATOR_REQUIRE_SERVICES=1" in ci
    assert "export ORCHESTRATOR_TEST_DATABASE=" in ci
    assert "trap cleanup EXIT" in ci
    assert 'main start\n    on_exit+=("pg_ctlcluster $pg_version main stop")' in ci
    # Services start before the tests run.
    assert ci.index("export ORCHESTRATOR_TEST_DATABASE=") < ci.index("python3 -m pytest")
