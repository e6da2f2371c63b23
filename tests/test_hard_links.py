"""Hard links: a file with several names is never written as a session's side file or session.

A symbolic link in a side file's place is refused by ``O_NOFOLLOW``; a hard link is not a link
to anything, it is the other file under a second name, so writing the lock, the journal or the
``.corrupt`` file through it wrote that file (a session truncated to a lock text). It is counted
on the opened descriptor and refused in one line, with nothing written.

A session file with two names had two locks and two journals, one per name: two processes could
own it at once, and a half-done operation under one name was never settled under the other.
Every reader still reads it; every writer is refused before it locks anything (D27).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionError
from orchestrator._store.files import open_side_file, read_side_file
from orchestrator._store.session import Session
from tests.cli_kit import EXAMPLE, run

PRECIOUS = b"precious, another file's bytes\n"


@pytest.fixture
def session(tmp_path: Path) -> Path:
    target = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


@pytest.mark.parametrize("suffix", [".lock", ".journal", ".corrupt"])
def test_a_hard_linked_side_file_is_refused_and_nothing_is_written(
    suffix: str, session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = session.with_name("other.jsonl")
    other.write_bytes(PRECIOUS)
    side = Path(f"{session}{suffix}")
    os.link(other, side)
    if suffix == ".corrupt":
        with session.open("ab") as file:
            file.write(b'{"torn')  # the commit moves it aside into the .corrupt file
    before = session.read_bytes()
    code, _, err = run(capsys, "compact", str(session))
    assert code == 1
    lines = [line for line in err.splitlines() if not line.startswith("warning:")]
    assert lines == [
        f"orchestrator compact: {side}: has 2 names (hard links); "
        "refusing to write a side file another file shares"
    ]
    assert other.read_bytes() == PRECIOUS
    assert session.read_bytes() == before


def test_a_side_file_of_one_name_is_written_and_a_shared_one_still_read(tmp_path: Path) -> None:
    side = tmp_path / "s.jsonl.journal"
    side.write_bytes(PRECIOUS)
    os.close(open_side_file(side, os.O_WRONLY | os.O_APPEND, "write the journal"))
    os.link(side, tmp_path / "other")
    assert read_side_file(side) == PRECIOUS  # reading changes nothing
    with pytest.raises(SessionError, match="has 2 names"):
        open_side_file(side, os.O_RDWR | os.O_CREAT, "create the lock file")


@pytest.fixture
def two_names(session: Path) -> tuple[Path, Path]:
    """``(session, other name)``: the example session under two names of one file."""
    other = session.with_name("b.jsonl")
    os.link(session, other)
    return session, other


@pytest.mark.parametrize(
    "argv",
    [["compact"], ["navigate", "--to", "ec48c90d"]],
    ids=["compact", "navigate"],
)
@pytest.mark.parametrize("which", [0, 1], ids=["first name", "second name"])
def test_a_session_with_two_names_is_never_changed(
    argv: list[str],
    which: int,
    two_names: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The lock and journal are per name: two processes could own the file at once, one under
    each name. Refused before the lock is taken, so before any model call or journal record."""
    target = two_names[which]
    before = target.read_bytes()
    code, out, err = run(capsys, argv[0], str(target), *argv[1:])
    assert code == 1
    assert out == ""
    assert err == (
        f"orchestrator {argv[0]}: {target}: has 2 names (hard links); refusing to change it: "
        "an append changes every name, but the lock and the journal are per name, so a writer "
        "under another name would not be kept out (copy it to give it one name)\n"
    )
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.jsonl", "s.jsonl"]


@pytest.mark.parametrize("command", ["context", "tree", "plan", "check"])
def test_a_session_with_two_names_is_still_read(
    command: str, two_names: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, command, str(two_names[1]))
    assert code == 0, err


def test_an_owner_is_refused_and_a_writer_without_one_too(two_names: tuple[Path, Path]) -> None:
    """``serve``, the TUI and embedding applications own through ``Session.open(owner=...)``;
    a store that writes without owning is refused when it opens the file to write."""
    session, other = two_names
    with pytest.raises(SessionError, match="has 2 names"):
        Session.open(other, owner="orchestrator serve")
    assert not Path(f"{other}.lock").exists()
    opened = Session.open(session)  # a reader
    before = session.read_bytes()
    with pytest.raises(SessionError, match="has 2 names"):
        opened.append_custom("note")
    opened.store.close()
    assert session.read_bytes() == before
