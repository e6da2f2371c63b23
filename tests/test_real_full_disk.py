"""A REAL full file system: a failed append leaves the file's bytes exactly as they were.

The other full-disk tests (``test_full_disk.py``) patch ``os`` calls. This one mounts a small
tmpfs, fills it to 9 KB of free space and lets the kernel refuse: a compaction line of about
10 KB is then written short (8 KB) and the rest refused with ``ENOSPC``. Those 8 KB were left at
the end of the session, and pi's next append was glued to them (issue 35).

Mounting needs root. Run as another user the test is skipped; under CI
(``ORCHESTRATOR_REQUIRE_SERVICES=1``, set by ``.ci/run``) a tmpfs that cannot be mounted fails it
instead (tests/services.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import StorageError
from orchestrator._core.loading import read_session
from orchestrator._lifecycle.machine import Step
from orchestrator._runtime.session import AgentSession
from orchestrator._store.journal import Journal, journal_path
from orchestrator._store.jsonl import JsonlStore
from tests.cli_kit import EXAMPLE
from tests.services import missing, services_required

_ROOT = os.geteuid() == 0
_FREE = 9 * 1024  # what the disk had left: between 8 and 10 KB

# Not root: skipped, unless CI requires it (then the fixture fails, naming why).
pytestmark = pytest.mark.skipif(
    not _ROOT and not services_required(), reason="mounting a tmpfs needs root"
)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs of its own holding a copy of the example, with 9 KB left free."""
    if not _ROOT:
        missing("mounting a tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(folder)]
    try:
        subprocess.run(mount, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        missing(f"cannot mount a tmpfs: {getattr(exc, 'stderr', None) or exc}")
    try:
        shutil.copy(EXAMPLE, folder / "session.jsonl")
        free = os.statvfs(folder)
        room = free.f_bavail * free.f_frsize
        (folder / "filler").write_bytes(b"\0" * (room - _FREE))
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _ends_on_a_line_boundary(data: bytes) -> None:
    """pi's next append would start a line of its own: the file loads without a problem."""
    assert data.endswith(b"\n")
    pi_line = json.dumps({"type": "custom", "id": "feedbeef", "parentId": None}) + "\n"
    assert read_session(data + pi_line.encode()).result.problems == []


def test_a_compaction_the_disk_refuses_leaves_the_session_byte_for_byte(
    full_disk: Path,
) -> None:
    session = full_disk / "session.jsonl"
    before = session.read_bytes()

    async def compact() -> StorageError:
        runtime = AgentSession.open(session, owner="test")  # the offline summarizer
        try:
            with pytest.raises(StorageError) as refused:
                await runtime.compact()
        finally:
            runtime.close()
        return refused.value

    error = anyio.run(compact)
    assert error.errno == errno.ENOSPC
    assert str(error) == f"{session}: cannot append to it: No space left on device"
    # It left 8 KB of the compaction's line at the end (the short write).
    assert session.read_bytes() == before
    _ends_on_a_line_boundary(session.read_bytes())
    assert not (full_disk / "session.jsonl.corrupt").exists()


def test_an_append_the_disk_refuses_leaves_the_session_byte_for_byte(full_disk: Path) -> None:
    session = full_disk / "session.jsonl"
    before = session.read_bytes()
    store = JsonlStore(session, fsync="always")
    try:
        parent = store.load().entries[-1]["id"]
        big = {
            "type": "custom",
            "id": "0badc0de",
            "parentId": parent,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "customType": "filler",
            "data": "x" * (4 * _FREE),
        }
        with pytest.raises(StorageError, match="cannot append to it: No space left"):
            store.append([big])
        assert session.read_bytes() == before
    finally:
        store.close()
    _ends_on_a_line_boundary(session.read_bytes())


def test_a_journal_record_the_disk_refuses_leaves_the_journal_as_it_was(
    full_disk: Path,
) -> None:
    session = full_disk / "session.jsonl"
    journal = Journal.open(session, exclusive=True)
    step = Step(machine="turn", source="idle", event="start", dest="running", effects=())
    try:
        journal.record(step, durable=True)
        before = journal_path(session).read_bytes()
        with pytest.raises(StorageError, match="cannot write the journal: No space left"):
            journal.record(step, data={"x": "y" * (4 * _FREE)}, durable=True)
        assert journal_path(session).read_bytes() == before
        journal.record(step, durable=True)  # the next record starts a line of its own
    finally:
        journal.close()
    lines = journal_path(session).read_bytes().splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["event"] == "start" for line in lines)
