"""A writer killed mid-rewrite leaves a temporary file; the next owner removes it (D4, D27).

A rewrite (a v1 migration, a prune) writes ``.<name>.<8 hex>.tmp`` beside the session, under
the session's lock, and renames it over the session. A process killed before the rename left
that whole copy of the session there for ever. Its lock's side file, which an owner deletes as
it lets go, is left too, still naming it: the next owner takes the lock over and removes the
session's temporary files, since nobody else writes them.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator._store.session import Session
from tests.cli_kit import run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LARGE_V1 = ROOT / "tests" / "data" / "pi" / "large-v1.jsonl"

KILLED_AT_RENAME = """
import os, signal, sys
os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
from orchestrator._cli.main import main
sys.exit(main(["compact", sys.argv[1]]))
"""


@pytest.fixture
def session(tmp_path: Path) -> Path:
    target = tmp_path / "s.jsonl"
    shutil.copy(LARGE_V1, target)
    return target


def leftovers(session: Path) -> list[str]:
    return sorted(p.name for p in session.parent.glob(f".{session.name}.*.tmp"))


def test_a_migration_killed_before_its_rename_is_cleaned_up_by_the_next_owner(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = session.read_bytes()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_RENAME, str(session)], cwd=ROOT, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert session.read_bytes() == before  # the rename never happened
    assert len(leftovers(session)) == 1
    assert Path(f"{session}.lock").exists()
    code, _, err = run(capsys, "compact", str(session))
    assert code == 0, err
    assert leftovers(session) == []
    assert not Path(f"{session}.lock").exists()
    code, report, err = run(capsys, "check", str(session))
    assert code == 0, report + err


def test_only_this_sessions_temporary_files_go_and_only_after_a_killed_owner(
    session: Path,
) -> None:
    folder = session.parent
    mine = folder / f".{session.name}.0123abcd.tmp"
    kept = [
        folder / ".other.jsonl.0123abcd.tmp",  # another session's: its own owner's business
        folder / f".{session.name}.notes.tmp",  # not a name a rewrite gives
        folder / f".{session.name}.0123ABCD.tmp",
        folder / f"{session.name}.0123abcd.tmp",
    ]
    for path in [mine, *kept]:
        path.write_bytes(b"copy\n")
    Session.open(session, owner="test").close()  # no lock left: nobody was killed
    assert mine.exists()
    Path(f"{session}.lock").write_text("4242 orchestrator compact\n")  # a killed owner's
    Session.open(session, owner="test").close()
    assert not mine.exists()
    assert all(path.exists() for path in kept)
    assert not Path(f"{session}.lock").exists()


def test_a_leftover_that_is_a_second_name_of_the_session_does_not_block_the_next_owner(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new file (a fork) is named by a hard link from its temporary file, which is then
    removed: a kill in between leaves the session with two names, one of them litter."""
    leftover = session.with_name(f".{session.name}.0123abcd.tmp")
    leftover.hardlink_to(session)
    Path(f"{session}.lock").write_text("4242 orchestrator fork\n")
    code, _, err = run(capsys, "compact", str(session))
    assert code == 0, err
    assert not leftover.exists()
