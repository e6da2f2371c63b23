"""Damaged session files: each problem named with its line, and the file never destroyed (D3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionError
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.memory import MemoryStore

HEADER = (
    b'{"type":"session","version":3,"id":"s1","timestamp":"2026-01-01T00:00:00.000Z","cwd":"/w"}\n'
)
ROOT = (
    b'{"type":"message","id":"a1b2c3d4","parentId":null,"message":{"role":"user","content":"hi"}}\n'
)
NEW_ENTRY = {"type": "custom", "id": "feedf00d", "parentId": "a1b2c3d4", "customType": "t"}


@dataclass(frozen=True)
class Case:
    code: str
    data: bytes
    line: int
    text: str  # the problem as printed: "line N: message"


CASES = [
    Case(
        "not_json",
        HEADER + ROOT + b'{"type":"message","id":"b",\n',
        3,
        "line 3: not valid JSON",
    ),
    Case(
        "not_object",
        HEADER + b"[1,2,3]\n" + ROOT,
        2,
        "line 2: a JSON array, not an object; skipped",
    ),
    Case(
        "no_id",
        HEADER + ROOT + b'{"type":"message","parentId":"a1b2c3d4"}\n',
        3,
        "line 3: a 'message' entry without an id; skipped",
    ),
    Case(
        "duplicate_id",
        HEADER + ROOT + ROOT.replace(b'"hi"', b'"again"'),
        3,
        "line 3: entry id 'a1b2c3d4' was already used on line 2; this later entry is skipped",
    ),
    Case(
        "unknown_parent",
        HEADER + ROOT + b'{"type":"message","id":"0badc0de","parentId":"deadbeef"}\n',
        3,
        "line 3: parent 'deadbeef' of entry '0badc0de' does not exist; kept as a root",
    ),
    Case(
        "cycle",
        HEADER + ROOT + b'{"id":"c1","parentId":"c2"}\n{"id":"c2","parentId":"c1"}\n',
        3,
        "line 3: entries form a parent cycle ('c1' -> 'c2' -> 'c1'); "
        "each has a parent but none is a root",
    ),
    Case(
        "not_session",
        b'{"type":"message","id":"a","parentId":null}\n' + ROOT,
        1,
        'line 1: the first line is not a session header ({"type": "session", "id": ...}), '
        "so this is not a session file",
    ),
    Case(
        "bad_header",
        HEADER + ROOT + HEADER,
        3,
        "line 3: a second session header; skipped",
    ),
    Case(
        "torn_line",
        HEADER + ROOT + b'{"type":"message","id":"e5f6","par',
        3,
        "line 3: the last line is incomplete (no newline and not JSON), "
        "probably a write cut short by a crash",
    ),
]


# A torn line alone is moved aside, not refused (see test_jsonl_store / test_memory_store).
REFUSED = [case for case in CASES if case.code != "torn_line"]


@pytest.fixture(params=CASES, ids=[case.code for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=REFUSED, ids=[case.code for case in REFUSED])
def refused(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


def test_problem_has_code_line_and_message(case: Case) -> None:
    result = MemoryStore(case.data).load()
    assert [(p.code, p.line, str(p)) for p in result.problems] == [
        (case.code, case.line, case.text)
    ]


def test_load_and_opening_the_store_leave_the_file_unchanged(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(case.data)
    with JsonlStore(path) as store:
        result = store.load()
        assert [p.code for p in result.problems] == [case.code]
        store.sync()
    assert path.read_bytes() == case.data
    assert not (tmp_path / "s.jsonl.corrupt").exists()


def test_the_rest_of_the_file_loads(case: Case) -> None:
    result = MemoryStore(case.data).load()
    if case.code == "not_session":
        assert result.header is None
        assert result.entries == []
    else:
        assert result.header is not None
        assert result.header["id"] == "s1"
        assert result.entries[0]["id"] == "a1b2c3d4"


def test_rewrite_is_refused_and_says_why(refused: Case, tmp_path: Path) -> None:
    case = refused
    path = tmp_path / "s.jsonl"
    path.write_bytes(case.data)
    with JsonlStore(path) as store:
        result = store.load()
        header = result.header or {"type": "session", "id": "fresh"}
        with pytest.raises(SessionError) as caught:
            store.rewrite(header, result.entries)
    assert f"refusing to rewrite {path}" in str(caught.value)
    assert case.text in str(caught.value)
    assert path.read_bytes() == case.data
    # Refused before the writer lock is taken: not even a lock file or a .corrupt side file.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_appending_keeps_every_original_byte(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(case.data)
    with JsonlStore(path) as store:
        store.load()
        if case.code == "not_session":
            with pytest.raises(SessionError, match="not a session file"):
                store.append([NEW_ENTRY])
            assert path.read_bytes() == case.data
            return
        store.append([NEW_ENTRY])
    after = path.read_bytes()
    if case.code == "torn_line":
        kept = case.data[: case.data.rindex(b"\n") + 1]
        assert after.startswith(kept)
        assert (tmp_path / "s.jsonl.corrupt").read_bytes() == case.data[len(kept) :] + b"\n"
    else:
        assert after.startswith(case.data)
    reloaded = JsonlStore(path).load()
    assert reloaded.entries[-1] == NEW_ENTRY
    assert "torn_line" not in {p.code for p in reloaded.problems}


def test_memory_store_refuses_the_same_rewrites(refused: Case) -> None:
    case = refused
    store = MemoryStore(case.data)
    with pytest.raises(SessionError, match="refusing to rewrite <memory:memory>"):
        store.rewrite({"type": "session", "id": "fresh"}, [])
    assert store.data == case.data
