"""The file store against hostile files and writers: a huge torn line, a header it must not
write after, an appender that ignores the lock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator._store import jsonl
from orchestrator._store.jsonl import JsonlStore, write_pi_line

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

    monkeypatch.setattr(jsonl, "_CHUNK", 16)
    _Counted.copied = 0
    with JsonlStore(path) as store:
        monkeypatch.setattr(jsonl.os, "pread", pread)
        assert store.repair_torn_tail() == torn
        monkeypatch.undo()
    assert _Counted.copied <= 2 * len(torn)
    assert sum(read) <= 2 * len(torn)  # each byte of the line read once (and the tail checked)
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == torn + b"\n"
    assert path.read_bytes() == write_pi_line(HEADER)
