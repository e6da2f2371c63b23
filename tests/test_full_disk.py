"""A disk that refuses a journal's write (full, a quota): said with the file, nothing applied.

The system error is made by the operating system's own call, for the journal's descriptor only
(``os.write`` wrapped): a full file system cannot be made here without privileges. By hand, on
a full tmpfs, the same run gave the same answers (``orchestrator compact`` exit 1 with the
journal's name; ``serve``: -32009).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._core.errors import ModelError, SessionError, StorageError
from orchestrator._rpc.errors import STORAGE, error_for
from orchestrator._runtime.operation.runner import storage_failure
from orchestrator._runtime.session import AgentSession
from orchestrator._store.files import os_failure
from orchestrator._store.journal import journal_path
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.whole import append_whole
from tests.cli_kit import run

_WRITE = os.write


def _refusing(number: int, suffix: str = ".journal") -> Callable[[int, bytes], int]:
    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(suffix):
            raise OSError(number, os.strerror(number))
        return _WRITE(fd, data)

    return write


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(os, "write", _refusing(errno.ENOSPC))
    yield
    monkeypatch.setattr(os, "write", _WRITE)


def _works_again(example: Path, navigate: bool) -> None:
    """With room again, the same request on the same file succeeds."""

    async def again() -> None:
        runtime = AgentSession.open(example, owner="test")
        try:
            if navigate:
                result = await runtime.navigate("daa66d13", summarize=True)
                assert result.summary_entry is not None
            else:
                assert (await runtime.compact()).status == "committed"
        finally:
            runtime.close()

    anyio.run(again)


def _attempt(example: Path, navigate: bool) -> BaseException:
    async def go() -> BaseException:
        runtime = AgentSession.open(example, owner="test")
        try:
            if navigate:
                await runtime.navigate("daa66d13", summarize=True)
            else:
                await runtime.compact()
        except SessionError as error:
            return error
        finally:
            runtime.close()
        raise AssertionError("nothing was refused")

    return anyio.run(go)


@pytest.mark.parametrize("navigate", [False, True])
def test_a_refused_journal_write_names_the_file_and_changes_nothing(
    example: Path, disk_full: None, monkeypatch: pytest.MonkeyPatch, navigate: bool
) -> None:
    before = example.read_bytes()
    error = _attempt(example, navigate)
    # It was the bare OSError, "No space left on device", with no file named.
    journal = journal_path(example)
    assert str(error) == f"{journal}: cannot write the journal: No space left on device"
    assert isinstance(error, StorageError)  # the disk's fault, not the caller's input
    assert error.errno == errno.ENOSPC
    # The system error stays its cause (the navigation's unwrapping erased it): a server
    # answers -32009 for it, not -32602.
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.ENOSPC
    assert error_for(error, "session.compress").code == STORAGE
    assert example.read_bytes() == before
    assert not journal.exists()  # nothing was written in it: it goes at close, as an empty one
    monkeypatch.setattr(os, "write", _WRITE)  # space again: the same request works
    _works_again(example, navigate)


def test_the_command_line_says_which_file_and_exits_1(
    example: Path, disk_full: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process (the refusal is this process's os.write), as the command runs it.
    code, out, err = run(capsys, "compact", str(example))
    assert code == 1
    assert out == ""
    assert err == (
        f"orchestrator compact: {journal_path(example)}: cannot write the journal: "
        "No space left on device\n"
    )


def _refused_while(
    example: Path,
    monkeypatch: pytest.MonkeyPatch,
    suffix: str,
    act: Callable[[AgentSession], Awaitable[object]],
) -> BaseException:
    """What ``act`` raises on an opened session while writes to files ending ``suffix`` fail."""

    async def go() -> BaseException:
        runtime = AgentSession.open(example, owner="test")
        monkeypatch.setattr(os, "write", _refusing(errno.ENOSPC, suffix))
        try:
            await act(runtime)
        except (ModelError, SessionError) as error:
            return error
        finally:
            monkeypatch.setattr(os, "write", _WRITE)
            runtime.close()
        raise AssertionError("nothing was refused")

    return anyio.run(go)


def test_a_refused_append_names_the_session_file_and_leaves_it_as_it_was(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The journal has room, the session's append does not: the commit fails (it said only
    # "[Errno 28] No space left on device", and a server answered -32002, "model failed").
    before = example.read_bytes()

    error = _refused_while(example, monkeypatch, example.name, lambda runtime: runtime.compact())
    # It was a ModelError of kind "fatal": a caller falling back to another model on those
    # would have retried a full disk. The store's own error now, naming the file.
    assert isinstance(error, StorageError)
    assert not isinstance(error, ModelError)
    assert error.errno == errno.ENOSPC
    assert str(error) == f"{example}: cannot append to it: No space left on device"
    assert error_for(error, "session.compress").code == STORAGE
    assert example.read_bytes() == before
    _works_again(example, navigate=False)


def test_a_fork_the_disk_refuses_names_the_new_file_and_leaves_nothing(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said only "No space left on device" (the temporary file's write, unnamed).
    target = example.parent / "fork.jsonl"
    before = sorted(p.name for p in example.parent.iterdir())

    error = _refused_while(
        example, monkeypatch, ".tmp", lambda runtime: runtime.fork("daa66d13", target)
    )
    assert isinstance(error, StorageError)
    assert str(error) == f"{target}: cannot write it: No space left on device"
    assert error_for(error, "session.fork").code == STORAGE
    assert sorted(p.name for p in example.parent.iterdir()) == before


def _compaction_refused(
    example: Path, monkeypatch: pytest.MonkeyPatch, call: str, replacement: Callable[..., Any]
) -> StorageError:
    """The StorageError a compaction raises while ``os.<call>`` is ``replacement``."""
    original = getattr(os, call)

    async def go() -> StorageError:
        runtime = AgentSession.open(example, owner="test")
        monkeypatch.setattr(os, call, replacement)
        try:
            with pytest.raises(StorageError) as refused:
                await runtime.compact()
        finally:
            monkeypatch.setattr(os, call, original)
            runtime.close()
        return refused.value

    return anyio.run(go)


def test_a_record_refused_after_the_commit_leaves_the_entry_and_reopening_settles_it(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk fills between the entry's append and the record of its commit.
    appended: list[bool] = []

    def write(fd: int, data: bytes) -> int:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(".journal") and appended:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if name.endswith(example.name):
            appended.append(True)
        return _WRITE(fd, data)

    before = example.read_bytes()

    message = str(_compaction_refused(example, monkeypatch, "write", write))
    assert message == f"{journal_path(example)}: cannot write the journal: No space left on device"
    assert len(example.read_bytes()) > len(before)  # the entry is in the session

    async def reopen() -> list[tuple[str, str]]:
        runtime = AgentSession.open(example, owner="test")
        try:
            assert runtime.session.leaf_id is not None
            leaf = runtime.session.tree.by_id[runtime.session.leaf_id]
            assert leaf["type"] == "compaction"
            return [(s.source, s.dest) for s in runtime.settlements]
        finally:
            runtime.close()

    assert anyio.run(reopen) == [("committing", "committed")]


def test_an_io_error_making_the_commit_durable_names_the_file(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The append's fsync failed with a bare "[Errno 5] Input/output error", no file named, and
    # the Python API raised it as a model failure.
    fsync = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(example):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        fsync(fd)

    error = _compaction_refused(example, monkeypatch, "fsync", failing)
    assert str(error) == f"{example}: cannot make what was appended durable: Input/output error"
    assert isinstance(error, StorageError)
    assert error.errno == errno.EIO
    assert error_for(error, "session.compress").code == STORAGE


@pytest.mark.parametrize(
    ("number", "storage"),
    [
        (errno.ENOSPC, True),
        (errno.EDQUOT, True),
        (errno.EROFS, True),
        (errno.EIO, True),
        (errno.EFBIG, True),
        (errno.EACCES, False),  # the path's permissions: the caller's to fix
        (errno.ENOENT, False),
    ],
)
def test_only_the_disks_refusals_are_storage_errors(
    tmp_path: Path, number: int, storage: bool
) -> None:
    error = os_failure(tmp_path / "s.jsonl", "write it", OSError(number, os.strerror(number)))
    assert isinstance(error, SessionError)
    assert isinstance(error, StorageError) is storage
    assert str(error).startswith(f"{tmp_path / 's.jsonl'}: ")


def test_a_bare_disk_error_behind_a_commit_becomes_a_storage_error() -> None:
    cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    refused = storage_failure(cause, "s.jsonl: the commit failed")
    assert isinstance(refused, StorageError)
    assert str(refused) == "s.jsonl: the commit failed"
    assert refused.__cause__ is cause
    assert storage_failure(OSError(errno.ECONNREFUSED, "refused"), None) is None
    assert storage_failure(ValueError("no"), None) is None


def _short_then(number: int) -> Callable[[int, bytes], int]:
    """``os.write`` that writes 3 bytes, then refuses with ``number`` (a disk filling up)."""
    calls: list[int] = []

    def write(fd: int, data: bytes) -> int:
        calls.append(fd)
        if len(calls) == 1:
            return _WRITE(fd, bytes(data[:3]))
        raise OSError(number, os.strerror(number))

    return write


def test_a_short_write_is_cut_off_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "s.jsonl"
    target.write_bytes(b"{}\n")
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        monkeypatch.setattr(os, "write", _short_then(errno.EDQUOT))
        with pytest.raises(StorageError, match=r"cannot append to it: Disk quota exceeded$"):
            append_whole(fd, target, b'{"a":1}\n', "append to it")
    finally:
        monkeypatch.setattr(os, "write", _WRITE)
        os.close(fd)
    assert target.read_bytes() == b"{}\n"


def test_a_write_of_nothing_is_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "s.jsonl"
    target.write_bytes(b"")
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        monkeypatch.setattr(os, "write", lambda fd, data: 0)
        with pytest.raises(StorageError) as refused:
            append_whole(fd, target, b"{}\n", "append to it")
    finally:
        monkeypatch.setattr(os, "write", _WRITE)
        os.close(fd)
    assert refused.value.errno == errno.ENOSPC
    assert target.read_bytes() == b""


def test_a_cut_that_fails_says_so_and_the_next_writer_moves_the_piece_aside(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = example.read_bytes()
    store = JsonlStore(example)
    try:
        leaf = store.load().entries[-1]["id"]
        entry = {"type": "custom", "id": "0badc0de", "parentId": leaf, "customType": "x"}
        monkeypatch.setattr(os, "write", _short_then(errno.ENOSPC))
        monkeypatch.setattr(os, "ftruncate", _refuse_ftruncate)
        with pytest.raises(StorageError) as refused:
            store.append([entry])
        monkeypatch.undo()
        assert str(refused.value) == (
            f"{example}: cannot append to it: No space left on device; 3 bytes of a torn line "
            "are left at its end (cutting them off failed too; the next writer of the session "
            "moves them aside)"
        )
        assert example.read_bytes() == before + b'{"t'
        store.append([entry])  # reopened: the torn piece goes to .corrupt first
    finally:
        store.close()
    assert example.read_bytes() == before + write_pi_line(entry)
    assert Path(f"{example}.corrupt").read_bytes() == b'{"t\n'


def _refuse_ftruncate(fd: int, length: int) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))
