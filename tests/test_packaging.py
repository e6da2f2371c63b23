"""The wheel is a pure function of the commit: exactly the package, its data and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    [built] = out.glob("*.whl")
    return built


def test_wheel_holds_the_package_machines_and_prompts(wheel: Path) -> None:
    names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    machines = sorted(n for n in names if n.startswith("orchestrator/machines/"))
    prompts = sorted(n for n in names if n.startswith("orchestrator/prompts/"))
    scenarios = sorted(n for n in names if n.startswith("orchestrator/scenarios/"))
    assert machines == sorted(
        f"orchestrator/machines/{p.name}" for p in (ROOT / "machines").glob("*.toml")
    )
    assert prompts == sorted(
        f"orchestrator/prompts/{p.name}" for p in (ROOT / "prompts").glob("*.md")
    )
    assert scenarios == sorted(
        f"orchestrator/scenarios/{p.name}" for p in (ROOT / "traces" / "scenarios").glob("*.toml")
    )
    # The PostgreSQL store's migrations, applied from inside the installed package (issue 10).
    migrations = sorted(n for n in names if n.startswith("orchestrator/_store/sql/"))
    assert migrations == sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "orchestrator/_store/sql").glob("*.sql")
    )
    assert migrations
    assert "orchestrator/py.typed" in names
    data = {*machines, *prompts, *scenarios, *migrations, "orchestrator/py.typed"}
    others = [n for n in names if n not in data]
    assert others
    assert all(n.startswith("orchestrator/") and n.endswith(".py") for n in others), others
    assert sorted(others) == sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "orchestrator").rglob("*.py")
    )


def test_simulate_from_the_wheel_runs_shipped_scenarios_and_writes_nothing(
    wheel: Path, tmp_path: Path
) -> None:
    # The wheel's files first on the path, run from an unrelated folder: the shipped scenarios
    # must be found inside the package, and without --out no trace file may appear anywhere.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    recorded = {p: p.read_bytes() for p in (ROOT / "traces").glob("*.jsonl")}
    env = {**os.environ, "PYTHONPATH": str(site)}
    for name in ("threshold", "crash"):
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "simulate", name],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "trace not kept" in done.stdout
    assert list(work.iterdir()) == []
    assert {p: p.read_bytes() for p in (ROOT / "traces").glob("*.jsonl")} == recorded
    listed = subprocess.run(
        [sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.strip().startswith(str(site))


def test_resources_fall_back_to_the_checkout() -> None:
    from orchestrator._core.resources import data_dir

    assert (data_dir("machines") / "turn.toml").is_file()
    assert (data_dir("prompts") / "summarizer_system.md").is_file()
    assert (data_dir("scenarios") / "threshold.toml").is_file()


def test_resources_prefer_the_packaged_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.resources

    from orchestrator._core import resources as _resources

    (tmp_path / "machines").mkdir()
    monkeypatch.setattr(importlib.resources, "files", lambda package: tmp_path)
    assert _resources.data_dir("machines") == tmp_path / "machines"
    assert _resources.data_dir("prompts") == _resources._CHECKOUT / "prompts"
