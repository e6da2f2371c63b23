"""Tree traversal and labels (pi's tree-traversal.test.ts and labels.test.ts cases)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import SessionError
from orchestrator._core.tree import SessionTree
from tests.test_planning_properties import sessions

HEADER = {
    "type": "session",
    "version": 3,
    "id": "s",
    "timestamp": "2026-01-01T00:00:00.000Z",
    "cwd": "/w",
}


def make_tree() -> tuple[SessionTree, itertools.count[int]]:
    return SessionTree(dict(HEADER)), itertools.count(1)


def add(
    tree: SessionTree, clock: itertools.count[int], kind: str = "message", **fields: object
) -> str:
    n = next(clock)
    entry = tree.new_entry(
        kind,
        dict(fields),
        now_ms=1767225600000 + n * 1000,
        random_hex=lambda: f"{n:08x}" + "0" * 24,
    )
    tree.append(entry)
    return str(entry["id"])


def user(text: str) -> dict[str, Any]:
    return {"message": {"role": "user", "content": text, "timestamp": 0}}


def test_every_append_is_a_child_of_the_leaf_and_moves_it() -> None:
    tree, clock = make_tree()
    a = add(tree, clock, **user("a"))
    b = add(tree, clock, "thinking_level_change", thinkingLevel="high")
    c = add(tree, clock, "model_change", provider="p", modelId="m")
    d = add(tree, clock, "custom", customType="x")
    assert [e["parentId"] for e in tree.entries] == [None, a, b, c]
    assert tree.leaf_id == d
    assert [e["id"] for e in tree.path()] == [a, b, c, d]


def test_ids_are_8_hex_and_timestamps_iso() -> None:
    tree, clock = make_tree()
    add(tree, clock, **user("a"))
    entry = tree.entries[0]
    assert len(entry["id"]) == 8
    assert entry["timestamp"] == "2026-01-01T00:00:01.000Z"


def test_branch_moves_leaf_and_next_append_is_a_sibling() -> None:
    tree, clock = make_tree()
    a = add(tree, clock, **user("a"))
    b = add(tree, clock, **user("b"))
    tree.branch(a)
    c = add(tree, clock, **user("c"))
    assert [e["id"] for e in tree.children_of(a)] == [b, c]
    assert [e["id"] for e in tree.path()] == [a, c]
    assert [e["id"] for e in tree.path(b)] == [a, b]


def test_branch_to_unknown_entry_errors() -> None:
    tree, _ = make_tree()
    with pytest.raises(SessionError, match="Entry nonexistent not found"):
        tree.branch("nonexistent")
    with pytest.raises(SessionError, match="Entry nonexistent not found"):
        tree.path("nonexistent")


def test_reset_leaf_makes_a_new_root() -> None:
    tree, clock = make_tree()
    add(tree, clock, **user("a"))
    tree.reset_leaf()
    assert tree.path() == []
    b = add(tree, clock, **user("b"))
    assert tree.by_id[b]["parentId"] is None
    assert len(tree.roots()) == 2


def test_nodes_nest_children_by_timestamp_and_carry_labels() -> None:
    tree, clock = make_tree()
    a = add(tree, clock, **user("a"))
    b = add(tree, clock, **user("b"))
    tree.branch(a)
    c = add(tree, clock, **user("c"))
    add(tree, clock, "label", targetId=b, label="first try")
    [root] = tree.nodes()
    assert root.entry["id"] == a
    assert [n.entry["id"] for n in root.children] == [b, c]
    assert root.children[0].label == "first try"
    depths = [(d, n.entry["id"]) for d, n in tree.iter_depth_first()]
    assert depths[:3] == [(0, a), (1, b), (1, c)]


def test_labels_last_wins_and_empty_clears() -> None:
    tree, clock = make_tree()
    a = add(tree, clock, **user("a"))
    add(tree, clock, "label", targetId=a, label="one")
    add(tree, clock, "label", targetId=a, label="two")
    assert tree.labels == {a: "two"}
    add(tree, clock, "label", targetId=a)
    assert tree.labels == {}


def test_self_parent_and_orphans_are_roots() -> None:
    entries = [
        {
            "type": "message",
            "id": "aaaaaaaa",
            "parentId": "aaaaaaaa",
            "timestamp": "1",
            "message": {"role": "user", "content": "x"},
        },
        {
            "type": "message",
            "id": "bbbbbbbb",
            "parentId": "gone0000",
            "timestamp": "2",
            "message": {"role": "user", "content": "y"},
        },
    ]
    tree = SessionTree(dict(HEADER), entries)
    assert [e["id"] for e in tree.roots()] == ["aaaaaaaa", "bbbbbbbb"]
    assert tree.leaf_id == "bbbbbbbb"


def test_cycle_does_not_loop() -> None:
    entries = [
        {
            "type": "message",
            "id": "aaaaaaaa",
            "parentId": "bbbbbbbb",
            "timestamp": "1",
            "message": {"role": "user", "content": "x"},
        },
        {
            "type": "message",
            "id": "bbbbbbbb",
            "parentId": "aaaaaaaa",
            "timestamp": "2",
            "message": {"role": "user", "content": "y"},
        },
    ]
    tree = SessionTree(dict(HEADER), entries)
    assert [e["id"] for e in tree.path()] == ["aaaaaaaa", "bbbbbbbb"]
    assert len(tree.nodes()) >= 1


def test_duplicate_append_refused() -> None:
    tree, clock = make_tree()
    a = add(tree, clock, **user("a"))
    with pytest.raises(SessionError, match="already"):
        tree.append(dict(tree.by_id[a]))


def test_session_name_from_latest_session_info() -> None:
    tree, clock = make_tree()
    add(tree, clock, "session_info", name="first")
    add(tree, clock, "session_info", name="  second ")
    add(tree, clock, "session_info", name="")
    assert tree.session_name() == "second"


def test_path_cache_extends_on_append_without_rewalk(monkeypatch: pytest.MonkeyPatch) -> None:
    tree, clock = make_tree()
    for i in range(5):
        add(tree, clock, **user(str(i)))
    first = tree.path()
    walked: list[str] = []
    original = tree._walk

    def spy(leaf_id: str) -> list[dict[str, Any]]:
        walked.append(leaf_id)
        return original(leaf_id)

    monkeypatch.setattr(tree, "_walk", spy)
    add(tree, clock, **user("more"))
    assert tree.path()[:-1] == first
    assert walked == []


def test_a_path_into_a_cycle_ends_where_the_loop_closes() -> None:
    def entry(entry_id: str, parent: str) -> dict[str, object]:
        message = {"role": "user", "content": entry_id}
        return {"type": "message", "id": entry_id, "parentId": parent, "message": message}

    # b and c are each other's parents; d hangs below c and is the leaf.
    entries = [entry("b" * 8, "c" * 8), entry("c" * 8, "b" * 8), entry("d" * 8, "c" * 8)]
    tree = SessionTree(dict(HEADER), entries)
    assert [e["id"][0] for e in tree.path()] == ["b", "c", "d"]
    assert [e["id"][0] for e in tree.path("c" * 8)] == ["b", "c"]


@settings(max_examples=150, deadline=None)
@given(sessions(branched=True), st.integers(min_value=0, max_value=30))
def test_every_path_is_the_walk_of_its_parent_links(session: Any, split: int) -> None:
    # Loaded whole, or loaded in part and the rest appended: a linear file's path is read from
    # the entries in order, every other one walked; both are the guarded walk's answer.
    entries = session.entries
    loaded = SessionTree(dict(HEADER), list(entries))
    grown = SessionTree(dict(HEADER), list(entries[:split]))
    for entry in entries[split:]:
        grown.append(entry)
    for tree in (loaded, grown):
        for entry in entries:
            expected = [e["id"] for e in tree._walk_guarded(entry["id"])]
            assert [e["id"] for e in tree.path(entry["id"])] == expected
        if entries:
            assert [e["id"] for e in tree.path()] == [
                e["id"] for e in tree._walk_guarded(entries[-1]["id"])
            ]
