"""The file store against hostile files and writers: a huge torn line, a header it must not
write after, an appender that ignores the lock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.errors import ConflictError, SessionError
from orchestrator._store import jsonl, jsonl_io
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from tests.cli_kit import run

HEADER: dict[str, Any] = {
    "type": "session",
    "version": 3,
    "id": "s1",
    "timestamp": "2026-01-01T00:00:00.000Z",
    "cwd": "/",
}


class _Counted(bytes):
    """Bytes that count what concatenating them copies (``piece + buffer``)."""

    copied = 0

    def __add__(self, other: bytes) -> _Counted:  # type: ignore[override]
        _Counted.copied += len(self) + len(other)
        return _Counted(bytes(self) + other)

    def __radd__(self, other: bytes) -> _Counted:
        _Counted.copied += len(self) + len(other)
        return _Counted(other + bytes(self))


def test_repairing_a_long_torn_line_reads_and_copies_each_byte_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepending each piece to the bytes so far copied the line again per piece: quadratic,
    # 159 s for 200 MB with the lock held. With 16-byte pieces a 64 KB line shows it (4,096
    # pieces: the old way copied about 130 MB), with no clock involved.
    torn = b'{"type":"message","id":"b","text":"' + b"x" * (1 << 16)
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + torn)
    read: list[int] = []
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        read.append(length)
        return _Counted(real_pread(fd, length, offset))

    monkeypatch.setattr(jsonl_io, "CHUNK", 16)
    _Counted.copied = 0
    with JsonlStore(path) as store:
        monkeypatch.setattr(os, "pread", pread)
        assert store.repair_torn_tail() == torn
        monkeypatch.undo()
    assert _Counted.copied <= 2 * len(torn)
    assert sum(read) <= 2 * len(torn)  # each byte of the line read once (and the tail checked)
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == torn + b"\n"
    assert path.read_bytes() == write_pi_line(HEADER)


VERSIONS = {
    "fraction": (3.5, "the header's version 3.5 is not a whole number"),
    "string_number": ("99", 'the header\'s version "99" is a string, not a version number'),
    "boolean": (True, "the header's version true is a boolean, not a version number"),
    "string": ("v4", 'the header\'s version "v4" is a string, not a version number'),
    "zero": (0, "the header says version 0, but versions are 1 to 3"),
    "newer": (4, "the header says version 4, newer than this program reads (3)"),
}


def _with_version(tmp_path: Path, version: object) -> Path:
    path = tmp_path / "s.jsonl"
    root: dict[str, Any] = {
        "type": "message",
        "id": "a",
        "parentId": None,
        "timestamp": "t",
        "message": {},
    }
    path.write_bytes(write_pi_line({**HEADER, "version": version}) + write_pi_line(root))
    return path


@pytest.mark.parametrize("case", sorted(VERSIONS))
def test_a_header_version_other_than_1_to_3_is_never_written_after(
    tmp_path: Path, case: str
) -> None:
    # 3.5, "99", true and "v4" were "not a number" and written to all the same.
    version, said = VERSIONS[case]
    path = _with_version(tmp_path, version)
    before = path.read_bytes()
    with JsonlStore(path) as store:
        loaded = store.load()
        assert [p.code for p in loaded.problems] == ["bad_header"]  # read for inspection
        assert [e["id"] for e in loaded.entries] == ["a"]
        entry = {"type": "label", "id": "b", "parentId": "a", "timestamp": "t"}
        with pytest.raises(SessionError) as append:
            store.append([entry])
        with pytest.raises(SessionError) as rewrite:
            store.rewrite(loaded.header or {}, [*loaded.entries, entry])
    for refused in (append.value, rewrite.value):
        message = str(refused)
        assert "\n" not in message
        assert str(path) in message
        assert said in message
    assert path.read_bytes() == before


@pytest.mark.parametrize("case", sorted(VERSIONS))
def test_check_says_what_is_wrong_with_the_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    version, said = VERSIONS[case]
    path = _with_version(tmp_path, version)
    code, out, _ = run(capsys, "check", str(path))
    assert code == 1
    assert out.startswith(f"{path}: line 1: {said}")
    assert "not a number" not in out


def _pi_appends(path: Path) -> None:
    """pi appending a line of its own, without our lock, as it does."""
    line = {"type": "label", "id": "p1", "parentId": "a", "timestamp": "t", "targetId": "a"}
    with path.open("ab") as file:
        file.write(write_pi_line(line))


def test_an_append_by_pi_after_the_check_is_caught_before_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tail was checked before the tail repair; pi's line landing between them was written
    # after, and ours built on an end that no longer was.
    path = _with_version(tmp_path, 3)
    with JsonlStore(path) as store:
        store.load()
        expect = store.tail()
        repair = JsonlStore._repair_once

        def repair_while_pi_appends(self: JsonlStore, fd: int) -> int:
            _pi_appends(path)
            return repair(self, fd)

        monkeypatch.setattr(JsonlStore, "_repair_once", repair_while_pi_appends)
        mine = {"type": "label", "id": "b", "parentId": "a", "timestamp": "t"}
        with pytest.raises(ConflictError) as refused:
            store.append([mine], expect=expect)
    assert str(path) in str(refused.value)
    assert "nothing was written" in str(refused.value)
    assert b'"id":"b"' not in path.read_bytes()
    assert path.read_bytes().endswith(b'"id":"p1","parentId":"a","timestamp":"t","targetId":"a"}\n')


def test_a_rewrite_does_not_replace_what_pi_appended_while_the_copy_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _with_version(tmp_path, 3)
    with JsonlStore(path) as store:
        loaded = store.load()
        expect = store.tail()
        write_temporary = jsonl_io.write_temporary

        def slow_copy(*args: Any) -> Path:
            _pi_appends(path)
            return write_temporary(*args)

        monkeypatch.setattr(jsonl, "write_temporary", slow_copy)
        assert loaded.header is not None
        with pytest.raises(ConflictError):
            store.rewrite(loaded.header, loaded.entries, expect=expect)
    assert b'"id":"p1"' in path.read_bytes()  # pi's line was kept: the copy was not renamed
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # removed
