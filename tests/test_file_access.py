"""Issue 8 item 7, file access: unreadable files and read-only folders give one line, and side
files that are symbolic links are never followed.

The permission tests change real modes. Root ignores modes, so when the suite runs as root the
kernel's answer (``EACCES``) is given by a stand-in for ``os.open`` on exactly those paths.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator._store.journal import Journal
from tests.cli_kit import EXAMPLE, run


class Denied:
    """Paths the process may not open (``files``) or create files in (``folders``)."""

    def __init__(self) -> None:
        self.files: set[Path] = set()
        self.folders: set[Path] = set()

    def file(self, path: Path) -> None:
        path.chmod(0)
        self.files.add(path)

    def folder(self, path: Path) -> None:
        path.chmod(0o555)
        self.folders.add(path)

    def refuses(self, path: Path, flags: int) -> bool:
        if path in self.files:
            return True
        return bool(flags & os.O_CREAT) and path.parent in self.folders and not path.exists()


@pytest.fixture
def denied(monkeypatch: pytest.MonkeyPatch) -> Iterator[Denied]:
    rules = Denied()
    if os.geteuid() == 0:
        real_open = os.open

        def open_as_a_user(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
            if rules.refuses(Path(os.fsdecode(path)), flags):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
            return real_open(path, flags, mode, **kwargs)

        monkeypatch.setattr(os, "open", open_as_a_user)
    yield rules
    for folder in rules.folders:
        folder.chmod(0o755)
    for file in rules.files:
        file.chmod(0o644)


@pytest.fixture
def session(tmp_path: Path) -> Path:
    folder = tmp_path / "sessions"
    folder.mkdir()
    target = folder / "s.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("command", ["context", "check", "tree", "compact", "navigate"])
def test_an_unreadable_session_is_one_line(
    command: str, session: Path, denied: Denied, capsys: pytest.CaptureFixture[str]
) -> None:
    denied.file(session)
    extra = ["--to", "ec48c90d"] if command == "navigate" else []
    code, out, err = run(capsys, command, str(session), *extra)
    assert code == 1
    assert one_line(err) == (
        f"orchestrator {command}: {session}: permission denied (cannot read it)"
    )
    assert out == ""


def test_compact_in_a_read_only_folder_is_one_line_and_changes_nothing(
    session: Path, denied: Denied, capsys: pytest.CaptureFixture[str]
) -> None:
    before = session.read_bytes()
    denied.folder(session.parent)
    code, out, err = run(capsys, "compact", str(session))
    assert code == 1
    assert one_line(err) == (
        f"orchestrator compact: {session}.lock: permission denied (cannot create the lock file "
        "needed to change s.jsonl)"
    )
    assert session.read_bytes() == before
    assert sorted(p.name for p in session.parent.iterdir()) == ["s.jsonl"]


def test_an_unreadable_journal_is_one_line(
    session: Path, denied: Denied, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "compact", str(session))
    assert code == 0, err
    journal = Path(f"{session}.journal")
    denied.file(journal)
    code, _, err = run(capsys, "journal", str(session))
    assert code == 1
    assert one_line(err) == (
        f"orchestrator journal: {journal}: permission denied (cannot read the journal)"
    )


@pytest.fixture
def planted(session: Path, tmp_path: Path) -> Path:
    """A ``.journal`` beside the session that is a symbolic link to a file outside its folder."""
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    Path(f"{session}.journal").symlink_to(outside)
    return outside


@pytest.mark.parametrize("command", ["compact", "navigate", "journal"])
def test_a_symlinked_journal_is_never_followed(
    command: str, session: Path, planted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = session.read_bytes()
    extra = ["--to", "ec48c90d"] if command == "navigate" else []
    code, _, err = run(capsys, command, str(session), *extra)
    assert code == 1
    assert one_line(err).endswith(
        f"{session}.journal: is a symbolic link; refusing to follow it (read the journal)"
    )
    assert planted.read_text() == "not yours\n"
    assert session.read_bytes() == before


def test_the_journal_never_writes_through_a_symlink(session: Path, planted: Path) -> None:
    from orchestrator._core.errors import SessionError
    from orchestrator._lifecycle.machine import Step

    journal = Journal.open(session)
    step = Step(machine="turn", source="idle", event="prompt", dest="running", effects=())
    with pytest.raises(SessionError, match="symbolic link; refusing to follow it"):
        journal.record(step)
    assert planted.read_text() == "not yours\n"


def test_a_stale_lock_file_that_cannot_be_written_is_not_called_uncreatable(
    session: Path, denied: Denied, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "cannot create the lock file": the file is there (left by pid 1234), and what
    # failed is opening it for writing.
    lock = Path(f"{session}.lock")
    lock.write_text("1234 orchestrator compact\n")
    denied.file(lock)
    before = session.read_bytes()
    code, _, err = run(capsys, "compact", str(session))
    assert code == 1
    assert one_line(err) == (
        f"orchestrator compact: {lock}: permission denied (it exists and cannot be opened for "
        "writing)"
    )
    assert session.read_bytes() == before


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.ELOOP, "f: is a symbolic link; refusing to follow it (read it)"),
        (errno.EACCES, "f: permission denied (cannot read it)"),
        (errno.ENOENT, "f: its folder . does not exist (cannot read it)"),
        (errno.EROFS, "f: read-only file system (cannot read it)"),
        (errno.ENOSPC, "f: cannot read it: No space left on device"),
    ],
)
def test_operating_system_errors_read_as_one_line(code: int, expected: str) -> None:
    from orchestrator._store.files import describe_os_error

    assert describe_os_error("f", "read it", OSError(code, os.strerror(code))) == expected
