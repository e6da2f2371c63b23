"""Hard links: a side file that shares its inode with another file is never written.

A symbolic link in a side file's place is refused by ``O_NOFOLLOW``; a hard link is not a link
to anything, it is the other file under a second name, so writing the lock, the journal or the
``.corrupt`` file through it wrote that file (a session truncated to a lock text). It is counted
on the opened descriptor and refused in one line, with nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionError
from orchestrator._store.files import open_side_file, read_side_file
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
