"""The words of a big file's entries are one string each, and nothing else changes (issue 35).

A server holds an open session's entries for as long as it is open, and most of their objects
were copies of the same few words and of each parent's id (``_core/reading.py``). These tests
prove that a big file's entries share them, that their values and the lines written from them
are exactly as before, and that the load holds less for it.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core import loading
from orchestrator._core.entries import Entry
from orchestrator._core.loading import read_session_chunks
from orchestrator._core.reading import SHARE_FROM_BYTES, share_words
from orchestrator._store.jsonl_io import write_pi_line
from orchestrator._store.session import Session
from tests.bench.bench_core import write_session


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("words") / "s.jsonl"
    write_session(path, 2000)
    return path.read_bytes()


def entries_of(data: bytes, *, size: int) -> list[Entry]:
    """The entries as a file of ``size`` bytes is loaded (the size picks the sharing)."""
    result = read_session_chunks([data], size=size).result
    assert not result.problems
    return result.entries


def messages(entries: list[Entry], role: str) -> list[dict[str, Any]]:
    return [e["message"] for e in entries if e["message"]["role"] == role]


def test_a_big_files_words_are_one_string_each(data: bytes) -> None:
    entries = entries_of(data, size=SHARE_FROM_BYTES)
    assistants = messages(entries, "assistant")
    assert len(assistants) > 100
    for key in ("role", "provider", "model", "stopReason"):
        assert len({id(m[key]) for m in assistants}) == 1, key
    assert len({id(e["type"]) for e in entries}) == 1
    blocks = [b for m in assistants for b in m["content"]]
    assert len({id(b["type"]) for b in blocks if b["type"] == "toolCall"}) == 1
    assert len({id(b["name"]) for b in blocks if b.get("name") == "read"}) == 1
    results = messages(entries, "toolResult")
    assert len({id(m["toolName"]) for m in results if m["toolName"] == "read"}) == 1


def test_a_small_file_is_spared_the_work(data: bytes) -> None:
    assistants = messages(entries_of(data, size=SHARE_FROM_BYTES - 1), "assistant")
    assert len({id(m["provider"]) for m in assistants}) == len(assistants)


@pytest.mark.parametrize("size", [1, SHARE_FROM_BYTES])
def test_each_parent_id_is_the_id_before(data: bytes, size: int) -> None:
    entries = entries_of(data, size=size)
    assert entries[0]["parentId"] is None
    for before, entry in zip(entries, entries[1:], strict=False):
        assert entry["parentId"] is before["id"]


def test_nothing_but_the_objects_changes(data: bytes) -> None:
    shared = entries_of(data, size=SHARE_FROM_BYTES)
    assert shared == [json.loads(line) for line in data.splitlines()[1:]]
    written = b"".join(write_pi_line(entry) for entry in shared)
    assert written == b"".join(line + b"\n" for line in data.splitlines()[1:])


def test_the_load_holds_less(data: bytes) -> None:
    def held(size: int) -> int:
        tracemalloc.start()
        try:
            entries = entries_of(data, size=size)
            current, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert entries
        return current

    assert held(SHARE_FROM_BYTES) < 0.9 * held(SHARE_FROM_BYTES - 1)


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "message", "message": "not an object"},
        {"type": "message", "message": {"role": 5, "provider": None, "content": "text"}},
        {"type": "message", "message": {"role": "user", "content": [1, "two", None, {"type": 3}]}},
        {"type": "message"},
    ],
)
def test_odd_messages_are_kept_as_they_are(entry: Entry) -> None:
    before = json.loads(json.dumps(entry))
    share_words(entry)
    assert entry == before


def test_odd_lines_load_as_before(tmp_path: Path) -> None:
    lines = [
        {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"},
        {"type": "message", "id": "a", "parentId": None, "timestamp": "t", "message": 7},
        {"type": "message", "id": "b", "parentId": "a", "timestamp": "t", "message": {"role": 1}},
        {"type": "message", "id": "c", "parentId": "zz", "timestamp": "t", "message": {}},
    ]
    data = "".join(json.dumps(line) + "\n" for line in [*lines, [1, 2]]).encode()
    small = read_session_chunks([data], size=len(data)).result
    big = read_session_chunks([data], size=SHARE_FROM_BYTES).result
    assert big.entries == small.entries == lines[1:]
    assert big.problems == small.problems
    assert [p.code for p in big.problems] == ["unknown_parent", "not_object"]


def test_a_store_shares_by_the_files_size(
    data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file store hands the loader the file's size, which decides."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)

    def models(threshold: int) -> set[int]:
        monkeypatch.setattr(loading, "SHARE_FROM_BYTES", threshold)
        session = Session.open(path)
        try:
            return {id(m["model"]) for m in messages(session.tree.entries, "assistant")}
        finally:
            session.close()

    assert len(models(len(data))) == 1
    assert len(models(len(data) + 1)) > 100
