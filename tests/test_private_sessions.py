"""A private session stays private: its side files and its forks are no more open than it.

A second user on the machine must not read, through a journal, a lock, a ``.corrupt`` file or a
fork made with the default umask, what the session's own mode keeps from them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator._runtime.session import AgentSession
from orchestrator._store.files import mode_like
from orchestrator._store.journal import journal_path
from orchestrator._store.owner import lock_path
from tests.cli_kit import run

FORK_POINT = "ec48c90d"
"""A user message of the example session."""


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)  # what most systems give: a new file is 0644
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("session", "side"),
    [(0o600, 0o600), (0o640, 0o640), (0o644, 0o644), (0o666, 0o644)],
    ids=["600", "640", "644", "666"],
)
def test_the_lock_is_no_more_open_than_the_session_and_the_journal_is_the_owners(
    example: Path, session: int, side: int
) -> None:
    example.chmod(session)
    runtime = AgentSession.open(example, owner="test")
    try:
        assert mode(lock_path(example)) == side
        # It may hold a provider's error text: the owner's only, whatever the session's mode.
        assert mode(journal_path(example)) == 0o600
    finally:
        runtime.close()


def test_a_compaction_of_a_private_session_leaves_private_files(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with example.open("ab") as out:
        out.write(b'{"type":"message","id":"torn')  # a writer killed mid-line
    example.chmod(0o600)
    code, _, err = run(capsys, "compact", str(example))
    assert code == 0, err
    corrupt = Path(f"{example}.corrupt")
    assert corrupt.read_bytes() == b'{"type":"message","id":"torn\n'
    assert mode(corrupt) == 0o600
    assert mode(journal_path(example)) == 0o600
    assert mode(example) == 0o600


def test_a_fork_of_a_private_session_is_private(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example.chmod(0o600)
    out = tmp_path / "fork.jsonl"
    code, _, err = run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
    assert code == 0, err
    assert mode(out) == 0o600


def test_a_fork_of_a_shared_or_read_only_session_gets_the_usual_mode(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for given, made in [(0o644, 0o644), (0o444, 0o644)]:
        example.chmod(given)
        out = tmp_path / f"fork-{given:o}.jsonl"
        code, _, err = run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
        assert code == 0, err
        assert mode(out) == made  # the owner can go on writing it


def test_a_missing_session_gives_what_any_new_file_gets(tmp_path: Path) -> None:
    assert mode_like(tmp_path / "not-yet.jsonl") == 0o666
