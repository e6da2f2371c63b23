"""A session file named through a symbolic link is the file it points to.

Its lock, journal and rewrites are the file's, whatever name opened it: two names of one file
must not give two writers two locks (D27), a half-done operation journaled under one name must
be settled under the other, and a rewrite must replace the file, not the link. Nothing may be
created through a link that points nowhere (``fork --out``), and a path naming something that is
not a file says so instead of "no such session file".
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionLockedError
from orchestrator._store.fork import fork_path
from orchestrator._store.journal import journal_path
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.owner import lock_path
from orchestrator._store.session import Session
from tests.cli_kit import EXAMPLE, run

FIRST_USER = "daa66d13"  # the example's first user message: a fork target


@pytest.fixture
def linked(tmp_path: Path) -> tuple[Path, Path]:
    """``(file, link)``: the example session in a folder of its own, and a link beside it."""
    store = tmp_path / "store"
    store.mkdir()
    real = store / "real.jsonl"
    shutil.copy(EXAMPLE, real)
    link = tmp_path / "link.jsonl"
    link.symlink_to(Path("store") / "real.jsonl")  # relative, as `ln -s` makes them
    return real, link


def test_the_side_files_of_a_link_are_the_files(linked: tuple[Path, Path]) -> None:
    real, link = linked
    assert lock_path(link) == lock_path(real.resolve())
    assert journal_path(link) == journal_path(real.resolve())
    assert JsonlStore(link).corrupt_path == JsonlStore(real.resolve()).corrupt_path
    # Not a link: the path as given, relative or not.
    assert lock_path("s.jsonl") == Path("s.jsonl.lock")


def test_a_link_to_an_owned_session_is_refused_both_ways(linked: tuple[Path, Path]) -> None:
    real, link = linked
    for first, second in ((real, link), (link, real)):
        owner = Session.open(first, owner="first")
        try:
            with pytest.raises(SessionLockedError, match="first"):
                Session.open(second, owner="second")
        finally:
            owner.close()


def test_the_cli_is_refused_on_a_link_to_a_session_another_process_owns(
    linked: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    real, link = linked
    before = real.read_bytes()
    owner = Session.open(real, owner="orchestrator serve")
    try:
        code, _, err = run(capsys, "navigate", str(link), "--to", FIRST_USER)
    finally:
        owner.close()
    assert code == 1
    assert "being changed by" in err
    assert "orchestrator serve" in err
    assert real.read_bytes() == before


def test_a_migration_rewrite_through_a_link_rewrites_the_file(
    linked: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    real, link = linked
    real.write_text(real.read_text().replace('"version":3', '"version":2', 1))
    code, _, err = run(capsys, "compact", str(link))
    assert code == 0, err
    assert link.is_symlink(), "the rewrite replaced the link"
    header = json.loads(real.read_text().splitlines()[0])
    assert header["version"] == 3
    assert '"type":"compaction"' in real.read_text().replace(" ", "")
    # The journal went beside the file, where opening it by either name finds it.
    assert journal_path(real).exists()
    assert not Path(f"{link}.journal").exists()


def test_fork_out_onto_a_link_that_points_nowhere_is_refused(
    linked: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    real, link = linked
    elsewhere = real.parent.parent / "elsewhere"
    elsewhere.mkdir()
    dangling = real.parent.parent / "out.jsonl"
    dangling.symlink_to(elsewhere / "victim.jsonl")
    code, _, err = run(capsys, "fork", str(real), "--from", FIRST_USER, "--out", str(dangling))
    assert code == 1
    assert "already exists; choose another --out" in err
    assert dangling.is_symlink()
    assert list(elsewhere.iterdir()) == []


def test_fork_names_pass_over_a_link_that_points_nowhere(tmp_path: Path) -> None:
    source = tmp_path / "s.jsonl"
    (tmp_path / "s.fork1.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert fork_path(source) == tmp_path / "s.fork2.jsonl"


def test_a_named_pipe_as_the_session_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = tmp_path / "q.jsonl"
    os.mkfifo(pipe, 0o600)
    code, _, err = run(capsys, "context", str(pipe))
    assert code == 1
    assert "q.jsonl: not a regular file; a session is a file of JSON lines" in err
    code, _, err = run(capsys, "compact", str(tmp_path / "missing.jsonl"))
    assert code == 1
    assert "no such session file" in err


def test_a_journal_that_is_not_a_file_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, session)
    os.mkfifo(tmp_path / "s.jsonl.journal", 0o600)
    code, _, err = run(capsys, "journal", str(session))
    assert code == 1
    assert "s.jsonl.journal: cannot read the journal: not a regular file" in err
    (tmp_path / "s.jsonl.journal").unlink()
    (tmp_path / "s.jsonl.journal").mkdir()
    code, _, err = run(capsys, "journal", str(session))
    assert code == 1
    assert "not a regular file" in err or "is a directory" in err
