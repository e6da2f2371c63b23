"""Folder fsyncs shared by the files made before them (issue 9, orchestrator/_store/dirsync.py)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from orchestrator._lifecycle.machine import Step
from orchestrator._store import dirsync
from orchestrator._store.dirsync import Folders
from orchestrator._store.journal import Journal


def _count_folder_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the folders fsynced from now on (files' fsyncs are not counted)."""
    folders: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            folders.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return folders


def test_one_folder_fsync_covers_every_file_made_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = Folders()
    synced = _count_folder_fsyncs(monkeypatch)
    tickets = []
    for name in ("a", "b", "c"):
        (tmp_path / name).touch()
        tickets.append(folders.ticket())
    for ticket in tickets:
        folders.sync(tmp_path, ticket)
    assert synced == [str(tmp_path)]


def test_a_file_made_after_the_fsync_started_gets_one_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = Folders()
    (tmp_path / "a").touch()
    first = folders.ticket()
    later: list[int] = []
    real = dirsync.fsync_dir

    def fsync_dir(directory: Path) -> None:
        if not later:  # a file made while the folder's first fsync is under way
            (tmp_path / "b").touch()
            later.append(folders.ticket())
        real(directory)

    monkeypatch.setattr(dirsync, "fsync_dir", fsync_dir)
    synced = _count_folder_fsyncs(monkeypatch)
    folders.sync(tmp_path, first)
    folders.sync(tmp_path, later[0])  # not covered: its fsync must run
    folders.sync(tmp_path, first)  # covered twice over now
    assert synced == [str(tmp_path), str(tmp_path)]


def test_each_folder_is_fsynced_for_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = Folders()
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    ticket = folders.ticket()
    synced = _count_folder_fsyncs(monkeypatch)
    folders.sync(one, ticket)
    folders.sync(two, ticket)
    folders.sync(one, ticket)
    assert synced == [str(one), str(two)]


def test_threads_syncing_one_folder_wait_for_the_fsync_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = Folders()
    tickets = [folders.ticket() for _ in range(8)]
    started, release = threading.Event(), threading.Event()
    calls: list[Path] = []

    def slow_fsync_dir(directory: Path) -> None:
        calls.append(directory)
        started.set()
        release.wait(timeout=30)

    monkeypatch.setattr(dirsync, "fsync_dir", slow_fsync_dir)
    first = threading.Thread(target=folders.sync, args=(tmp_path, tickets[0]))
    first.start()
    assert started.wait(timeout=30)
    others = [threading.Thread(target=folders.sync, args=(tmp_path, t)) for t in tickets[1:]]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(timeout=30)
    assert calls == [tmp_path]  # the others were covered by the one under way


def test_a_failed_folder_fsync_covers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = Folders()
    ticket = folders.ticket()
    failures = [OSError(5, "Input/output error")]
    real = dirsync.fsync_dir

    def failing_once(directory: Path) -> None:
        if failures:
            raise failures.pop()
        real(directory)

    monkeypatch.setattr(dirsync, "fsync_dir", failing_once)
    with pytest.raises(OSError, match="Input/output"):
        folders.sync(tmp_path, ticket)
    synced = _count_folder_fsyncs(monkeypatch)
    folders.sync(tmp_path, ticket)  # tried again, not taken as done
    assert synced == [str(tmp_path)]


def test_journals_opened_in_one_folder_share_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thousand sessions' journals in one folder: one folder fsync, not one each."""
    turn = Step(machine="turn", source="idle", event="prompt", dest="running", effects=())
    journals = [Journal.open(tmp_path / f"s{i}.jsonl", exclusive=True) for i in range(5)]
    for journal in journals:
        journal.open_file()  # as AgentSession.open does
    synced = _count_folder_fsyncs(monkeypatch)
    for journal in journals:
        journal.record(turn)
        journal.sync()
    assert synced == [str(tmp_path)]
    # A journal made after that fsync needs one of its own, once.
    late = Journal.open(tmp_path / "late.jsonl", exclusive=True)
    late.open_file()
    for _ in range(2):
        late.record(turn)
        late.sync()
    assert synced == [str(tmp_path), str(tmp_path)]
    for journal in [*journals, late]:
        journal.close()
    assert all(journal.exists() for journal in journals)


def test_a_journal_made_again_after_its_empty_file_was_removed_syncs_its_folder_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owned session's empty journal is removed at close; opened again, the file is new, and
    a folder fsync that ran in between does not cover its name."""
    turn = Step(machine="turn", source="idle", event="prompt", dest="running", effects=())
    journal = Journal.open(tmp_path / "s.jsonl", exclusive=True)
    journal.open_file()
    journal.close()  # nothing written: the file is removed
    assert not journal.exists()
    other = Journal.open(tmp_path / "other.jsonl", exclusive=True)
    other.record(turn)
    other.sync()  # a folder fsync after the first journal's ticket, before its new file
    synced = _count_folder_fsyncs(monkeypatch)
    journal.open_file()
    journal.record(turn)
    journal.sync()
    assert synced == [str(tmp_path)]
    journal.close()
    other.close()
