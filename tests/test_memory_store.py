"""The in-memory store: same protocol, same parser, same rules as the file store."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import SessionError
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import SessionStore

DATA = Path(__file__).parent / "data" / "store"
HEADER: dict[str, Any] = {"type": "session", "version": 3, "id": "s1", "cwd": "/w"}


def entry(entry_id: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, **extra}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
field_maps = st.dictionaries(
    st.text(max_size=10).filter(lambda key: key not in {"id", "parentId", "type"}),
    json_values,
    max_size=6,
)
entry_types = st.text(max_size=12).filter(lambda kind: kind != "session")


@settings(max_examples=80, deadline=None)
@given(
    fields=st.lists(st.tuples(entry_types, field_maps), max_size=8),
    header_extra=field_maps,
)
def test_round_trip_keeps_unknown_types_and_fields(
    fields: list[tuple[str, dict[str, Any]]], header_extra: dict[str, Any]
) -> None:
    header = {**header_extra, **HEADER}
    entries, parent = [], None
    for number, (kind, extra) in enumerate(fields):
        entries.append({"type": kind, **extra, "id": f"{number:08x}", "parentId": parent})
        parent = f"{number:08x}"
    store = MemoryStore()
    store.append([header])
    for item in entries:
        store.append([item])
    loaded = store.load()
    assert loaded.problems == []
    assert loaded.header == header
    assert loaded.entries == entries
    store.rewrite(loaded.header, loaded.entries)
    assert store.data == b"".join(write_pi_line(e) for e in [header, *entries])


def test_memory_and_file_stores_hold_the_same_bytes(tmp_path: Path) -> None:
    batches = [[HEADER], [entry("a", text="ß")], [entry("b", "a"), entry("c", "b")]]
    memory = MemoryStore()
    with JsonlStore(tmp_path / "s.jsonl") as file_store:
        for batch in batches:
            memory.append(batch)
            file_store.append(batch)
    assert memory.data == (tmp_path / "s.jsonl").read_bytes()


def test_protocol_location_and_exists() -> None:
    store: SessionStore = MemoryStore(name="demo")
    assert store.location == "<memory:demo>"
    assert store.exists() is False
    store.append([HEADER])
    assert store.exists() is True
    store.sync()
    store.close()


def test_v1_bytes_migrate_on_every_load_until_rewritten() -> None:
    counter = itertools.count(1)
    store = MemoryStore(
        (DATA / "v1_session.jsonl").read_bytes(),
        random_hex=lambda: f"{next(counter):08x}" + "0" * 24,
    )
    result = store.load()
    assert result.migrated is True
    with pytest.raises(SessionError, match="version 1"):
        store.append([entry("z")])
    assert result.header is not None
    store.rewrite(result.header, result.entries)
    store.append([entry("z", result.entries[-1]["id"])])
    again = store.load()
    assert again.migrated is False
    assert again.entries[:-1] == result.entries


def test_torn_tail_moves_to_corrupt_and_appends_land_on_a_clean_line() -> None:
    clean = write_pi_line(HEADER) + write_pi_line(entry("a"))
    store = MemoryStore(clean + b'{"id":"b","par')
    assert store.load().torn_tail == b'{"id":"b","par'
    assert store.data == clean + b'{"id":"b","par'  # loading alone changes nothing
    store.append([entry("c", "a")])
    assert store.data == clean + write_pi_line(entry("c", "a"))
    assert bytes(store.corrupt) == b'{"id":"b","par\n'


def test_whole_last_line_without_newline_gets_one() -> None:
    store = MemoryStore(write_pi_line(HEADER)[:-1])
    assert store.repair_torn_tail() == b""
    assert store.data == write_pi_line(HEADER)
    assert bytes(store.corrupt) == b""


def test_rewrite_requires_a_session_header() -> None:
    with pytest.raises(SessionError, match="not a session header"):
        MemoryStore().rewrite({"id": "a"}, [])


def test_damaged_bytes_refuse_rewrite_but_accept_appends() -> None:
    original = write_pi_line(HEADER) + b"junk\n"
    with MemoryStore(original) as store:
        with pytest.raises(SessionError, match="line 2: not valid JSON"):
            store.rewrite(HEADER, [])
        assert store.data == original
        store.append([entry("a")])
    assert store.data == original + write_pi_line(entry("a"))


def test_appending_nothing_changes_nothing() -> None:
    store = MemoryStore(b"not a session\n")
    store.append([])
    assert store.data == b"not a session\n"
