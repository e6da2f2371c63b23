"""The wheel is a pure function of the commit: exactly the package, its data and nothing else."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_wheel_holds_the_package_machines_and_prompts(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("*.whl")
    names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    machines = sorted(n for n in names if n.startswith("orchestrator/machines/"))
    prompts = sorted(n for n in names if n.startswith("orchestrator/prompts/"))
    assert machines == sorted(
        f"orchestrator/machines/{p.name}" for p in (ROOT / "machines").glob("*.toml")
    )
    assert prompts == sorted(
        f"orchestrator/prompts/{p.name}" for p in (ROOT / "prompts").glob("*.md")
    )
    assert "orchestrator/py.typed" in names
    others = [
        n for n in names if n not in machines and n not in prompts and n != "orchestrator/py.typed"
    ]
    assert others
    assert all(n.startswith("orchestrator/") and n.endswith(".py") for n in others), others
    assert sorted(others) == sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "orchestrator").rglob("*.py")
    )


def test_resources_fall_back_to_the_checkout() -> None:
    from orchestrator._core.resources import data_dir

    assert (data_dir("machines") / "turn.toml").is_file()
    assert (data_dir("prompts") / "summarizer_system.md").is_file()


def test_resources_prefer_the_packaged_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.resources

    from orchestrator._core import resources as _resources

    (tmp_path / "machines").mkdir()
    monkeypatch.setattr(importlib.resources, "files", lambda package: tmp_path)
    assert _resources.data_dir("machines") == tmp_path / "machines"
    assert _resources.data_dir("prompts") == _resources._CHECKOUT / "prompts"
