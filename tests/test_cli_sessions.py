"""``orchestrator sessions [CWD]``: where pi keeps a directory's sessions, newest first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator._cli.sessions import pi_session_folder
from tests.cli_kit import run


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    return home


def test_the_folder_is_named_as_pi_names_it(home: Path) -> None:
    folder = pi_session_folder("/work/my-app/src")
    assert folder == home / ".pi" / "agent" / "sessions" / "--work-my-app-src--"
    windows_like = pi_session_folder("/C:\\Users\\me", {"PI_CODING_AGENT_DIR": "/agent"})
    assert windows_like.name == "--C--Users-me--"
    assert windows_like.parent == Path("/agent/sessions")


def test_lists_the_sessions_newest_first(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    folder = home / ".pi" / "agent" / "sessions" / f"--{str(project)[1:].replace('/', '-')}--"
    folder.mkdir(parents=True)
    names = ["2026-01-01T10-00-00-000Z_a.jsonl", "2026-01-02T10-00-00-000Z_b.jsonl"]
    for age, name in zip((100, 200), names, strict=True):
        (folder / name).write_text("")
        os.utime(folder / name, (1_800_000_000 - age, 1_800_000_000 - age))
    (folder / "notes.txt").write_text("")  # not a session
    os.utime(folder / names[0], (1_800_000_000, 1_800_000_000))  # a was written to last
    code, out, err = run(capsys, "sessions", str(project))
    assert code == 0, err
    assert out.splitlines() == [str(folder / names[0]), str(folder / names[1])]


def test_no_sessions_is_one_line_naming_the_folder(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "sessions", str(tmp_path))
    assert code == 1
    assert out == ""
    folder = pi_session_folder(str(tmp_path))
    assert err == f"orchestrator sessions: no pi sessions for {tmp_path}: none in {folder}\n"
