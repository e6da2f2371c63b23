"""The service fixtures skip on a laptop and fail in CI; .ci/run starts and stops the services."""

from __future__ import annotations

import subprocess
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
    assert 'main start\n        on_exit+=("pg_ctlcluster $pg_version main stop")' in ci
    # Services start just before the README's test line runs.
    assert '"python3 -m pytest"*)\n        start_postgres\n        start_temporal\n' in ci


def _readme_first_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("```sh\n") + len("```sh\n")
    return text[start : text.index("```", start)].splitlines()


def test_ci_runs_the_readmes_first_block_and_installs_nothing_else() -> None:
    # Issue 35: the README's block is what a new user types; CI runs that very block (in the
    # fresh .venv its first line makes) and has no install of its own that could hide a gap.
    printed = subprocess.run(
        [str(ROOT / ".ci" / "readme-block"), str(ROOT / "README.md")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert printed == _readme_first_block()
    assert printed[0].startswith("python3 -m venv .venv")
    assert any(line.startswith("python3 -m pytest") for line in printed)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "done 3< <(.ci/readme-block README.md)" in ci
    assert "pip install" not in ci


def test_the_block_printer_stops_at_the_first_blocks_end(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\n```sh\none\ntwo\n```\n\n```sh\nthree\n```\n", encoding="utf-8")
    printed = subprocess.run(
        [str(ROOT / ".ci" / "readme-block"), str(readme)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert printed == "one\ntwo\n"
