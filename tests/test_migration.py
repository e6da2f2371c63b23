"""Version migration (pi's migration.test.ts cases; decision D1)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.loading import parse_session_bytes
from orchestrator._core.migration import header_version, migrate

DATA = Path(__file__).parent / "data" / "store"
HEX8 = re.compile(r"^[0-9a-f]{8}$")


def counting_hex() -> Callable[[], str]:
    """A deterministic id source: 00000001..., 00000002..., ..."""
    counter = itertools.count(1)
    return lambda: f"{next(counter):08x}" + "0" * 24


def test_v1_file_gets_8_hex_ids_linear_parents_and_version_3() -> None:
    result = parse_session_bytes((DATA / "v1_session.jsonl").read_bytes())
    assert result.problems == []
    assert result.migrated is True
    assert result.header is not None
    assert result.header["version"] == 3
    ids = [entry["id"] for entry in result.entries]
    assert len(ids) == 6
    assert all(HEX8.match(entry_id) for entry_id in ids)
    assert len(set(ids)) == 6
    assert [entry["parentId"] for entry in result.entries] == [None, *ids[:-1]]


def test_v1_firstKeptEntryIndex_becomes_the_id_of_that_file_entry() -> None:
    result = parse_session_bytes(
        (DATA / "v1_session.jsonl").read_bytes(), random_hex=counting_hex()
    )
    compaction = result.entries[4]
    assert compaction["type"] == "compaction"
    assert "firstKeptEntryIndex" not in compaction
    # Index 4 counts the header as 0, so it is the fourth entry: "Now summarize them."
    target = result.entries[3]
    assert target["message"]["content"] == "Now summarize them."
    assert compaction["firstKeptEntryId"] == target["id"] == "00000004"


def test_v1_hookMessage_becomes_custom_too() -> None:
    result = parse_session_bytes((DATA / "v1_session.jsonl").read_bytes())
    assert result.entries[-1]["message"]["role"] == "custom"


def test_v2_file_keeps_its_ids_and_parents_and_renames_hookMessage() -> None:
    raw = (DATA / "v2_session.jsonl").read_bytes()
    stored = [json.loads(line) for line in raw.splitlines()[1:]]
    result = parse_session_bytes(raw)
    assert result.problems == []
    assert result.migrated is True
    assert result.header is not None
    assert result.header["version"] == 3
    assert [(e["id"], e["parentId"]) for e in result.entries] == [
        (e["id"], e["parentId"]) for e in stored
    ]
    assert result.entries[1]["message"]["role"] == "custom"
    assert result.entries[1]["message"]["customType"] == "status"
    # Everything else in the message is untouched.
    assert {**result.entries[1]["message"], "role": "hookMessage"} == stored[1]["message"]


def test_v3_is_untouched_and_not_migrated() -> None:
    raw = (DATA / "v3_unknown.jsonl").read_bytes()
    result = parse_session_bytes(raw)
    assert result.migrated is False
    assert [json.loads(line) for line in raw.splitlines()] == [result.header, *result.entries]


def test_migrate_does_not_mutate_its_input() -> None:
    header = {"type": "session", "id": "s"}
    entries: list[dict[str, Any]] = [
        {"type": "message", "message": {"role": "hookMessage"}},
        {"type": "compaction", "firstKeptEntryIndex": 1},
    ]
    snapshot = json.dumps([header, entries])
    migration = migrate(header, entries, random_hex=counting_hex())
    assert json.dumps([header, entries]) == snapshot
    assert migration.changed is True
    assert migration.from_version == 1
    assert migration.entries[1]["firstKeptEntryId"] == migration.entries[0]["id"]


def test_index_pointing_at_header_or_outside_is_dropped_without_an_id() -> None:
    header = {"type": "session", "id": "s"}
    for index in (0, 3, -1, 1.5, 99):
        entries: list[dict[str, Any]] = [
            {"type": "message"},
            {"type": "compaction", "firstKeptEntryIndex": index},
        ]
        compaction = migrate(header, entries, random_hex=counting_hex()).entries[1]
        assert "firstKeptEntryIndex" not in compaction, index
        assert "firstKeptEntryId" not in compaction, index


def test_non_numeric_index_is_left_as_it_was() -> None:
    entries = [{"type": "compaction", "firstKeptEntryIndex": "1"}]
    migration = migrate({"type": "session", "id": "s"}, entries, random_hex=counting_hex())
    assert migration.entries[0]["firstKeptEntryIndex"] == "1"


def test_forward_index_gets_the_id_of_the_later_entry() -> None:
    # pi would read an id not assigned yet; I assign all ids first (see _migration docstring).
    entries: list[dict[str, Any]] = [
        {"type": "compaction", "firstKeptEntryIndex": 2},
        {"type": "message"},
    ]
    migration = migrate({"type": "session", "id": "s"}, entries, random_hex=counting_hex())
    assert migration.entries[0]["firstKeptEntryId"] == migration.entries[1]["id"]


def test_v1_ids_never_collide_even_when_randomness_repeats() -> None:
    # pi's generator checks a set it never fills; ours must not hand out the same id twice.
    values = iter(["aaaaaaaa" + "0" * 24, "aaaaaaaa" + "0" * 24, "bbbbbbbb" + "0" * 24])
    entries = [{"type": "message"}, {"type": "message"}]
    migration = migrate({"type": "session", "id": "s"}, entries, random_hex=lambda: next(values))
    assert [entry["id"] for entry in migration.entries] == ["aaaaaaaa", "bbbbbbbb"]


def test_header_version_reading() -> None:
    assert header_version({}) == 1
    assert header_version({"version": None}) == 1
    assert header_version({"version": 2}) == 2
    assert header_version({"version": 3.0}) == 3
    assert header_version({"version": True}) is None
    assert header_version({"version": "3"}) is None
    assert header_version({"version": 2.5}) is None


def test_unreadable_version_is_not_migrated() -> None:
    entries = [{"type": "message", "message": {"role": "hookMessage"}}]
    migration = migrate({"type": "session", "id": "s", "version": "2"}, entries)
    assert migration.changed is False
    assert migration.entries[0]["message"]["role"] == "hookMessage"


entry_kinds = st.sampled_from(["message", "compaction", "custom", "label", "x_unknown"])
v1_entries = st.lists(
    st.fixed_dictionaries(
        {"type": entry_kinds},
        optional={
            "message": st.fixed_dictionaries({"role": st.sampled_from(["user", "hookMessage"])}),
            "firstKeptEntryIndex": st.integers(-2, 12),
        },
    ),
    max_size=10,
)


@given(entries=v1_entries, version=st.sampled_from([None, 1, 2]))
def test_migration_is_idempotent(entries: list[dict[str, object]], version: int | None) -> None:
    header: dict[str, object] = {"type": "session", "id": "s"}
    if version is not None:
        header["version"] = version
    once = migrate(header, entries, random_hex=counting_hex())
    twice = migrate(once.header, once.entries, random_hex=counting_hex())
    assert twice.changed is False
    assert twice.header == once.header
    assert twice.entries == once.entries
    assert once.header["version"] == 3
    assert not [
        entry
        for entry in once.entries
        if entry["type"] == "message" and entry.get("message", {}).get("role") == "hookMessage"
    ]
    if version in (None, 1):
        compactions = [entry for entry in once.entries if entry["type"] == "compaction"]
        assert all("firstKeptEntryIndex" not in entry for entry in compactions)
        assert len({entry["id"] for entry in once.entries}) == len(entries)
