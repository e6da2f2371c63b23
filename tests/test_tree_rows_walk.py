"""Tree rows: the chain of a linear session walked in file order, and previews cut early.

``iter_tree_rows`` walks a linear tree (the usual session) without building a node per entry,
and a preview splits only as much of a text as its line needs (issue 35: a tree of 200,000
entries took 3.5 s to build, each request). Both are held here to the general way: the walk of
``SessionTree.nodes()`` and the whole text made one line.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.entries import Entry
from orchestrator._core.tree import SessionTree
from orchestrator._store.reports import iter_tree_rows, one_line

PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/w"}
# Unicode whitespace too: str.split breaks on it, and so must the cut.
WORDS = st.text(alphabet=st.sampled_from("ab \t\n\u2003\x1c\u00e9\U0001f600"), max_size=400)


@st.composite
def trees(draw: st.DrawFn, linear: bool | None = None) -> SessionTree:
    """A tree of messages, labels and context edits: a chain, or any parents at all."""
    chain = draw(st.booleans()) if linear is None else linear
    entries: list[Entry] = []
    for index in range(draw(st.integers(min_value=0, max_value=12))):
        ids = [e["id"] for e in entries]
        if chain:
            parent: Any = ids[-1] if ids else None
        else:
            parent = draw(st.sampled_from([None, "missing", f"e{index}", *ids]))
        kind = draw(st.sampled_from(["message", "message", "label", "context_edit"]))
        entry: Entry = {
            "type": kind,
            "id": f"e{index}",
            "parentId": parent,
            "timestamp": draw(st.sampled_from(["2026-01-01", "2026-01-02"])),
        }
        if kind == "message":
            role = draw(st.sampled_from(["user", "assistant", "toolResult"]))
            entry["message"] = {"role": role, "content": [{"type": "text", "text": draw(WORDS)}]}
        elif kind == "label":
            entry["targetId"] = draw(st.sampled_from([*ids, "missing"]))
            entry["label"] = draw(st.sampled_from(["", "mark"]))
        else:
            entry["targetId"] = draw(st.sampled_from([*ids, "missing"]))
            entry["replacement"] = None
        entries.append(entry)
    return SessionTree(dict(HEADER), entries)


def walked(tree: SessionTree) -> list[tuple[str, int, str | None]]:
    """Each entry's id, depth and label as ``SessionTree.nodes()`` lays them out."""
    out: list[tuple[str, int, str | None]] = []
    stack = [(0, node) for node in reversed(tree.nodes())]
    while stack:
        depth, node = stack.pop()
        out.append((node.entry["id"], depth, node.label))
        child_depth = depth + 1 if len(node.children) > 1 else depth
        stack.extend((child_depth, child) for child in reversed(node.children))
    return out


@PROPERTIES
@given(trees())
def test_the_rows_are_laid_out_as_the_trees_nodes(tree: SessionTree) -> None:
    leaf = tree.leaf_id
    rows = list(iter_tree_rows(tree, tree.path(), leaf))
    assert [(row["id"], row["depth"], row["label"]) for row in rows] == walked(tree)


@PROPERTIES
@given(trees(linear=True))
def test_a_chain_is_walked_in_file_order_at_depth_zero(tree: SessionTree) -> None:
    assert tree.linear
    rows = list(iter_tree_rows(tree, tree.path(), tree.leaf_id))
    assert [row["id"] for row in rows] == [entry["id"] for entry in tree.entries]
    assert {row["depth"] for row in rows} <= {0}
    assert all(row["onActivePath"] for row in rows)


def test_a_branch_is_not_linear_and_takes_the_general_walk() -> None:
    entries: list[Entry] = [
        {"type": "label", "id": "a", "parentId": None, "timestamp": "1", "targetId": "a"},
        {"type": "label", "id": "b", "parentId": "a", "timestamp": "2", "targetId": "a"},
        {"type": "label", "id": "c", "parentId": "a", "timestamp": "3", "targetId": "a"},
    ]
    tree = SessionTree(dict(HEADER), entries)
    assert not tree.linear
    rows = list(iter_tree_rows(tree, tree.path(), "c"))
    assert [(row["id"], row["depth"]) for row in rows] == [("a", 0), ("b", 1), ("c", 1)]


@PROPERTIES
@given(WORDS, st.integers(min_value=1, max_value=80))
def test_a_preview_is_the_whole_text_made_one_line(text: str, width: int) -> None:
    whole = " ".join(text.split())
    expected = whole if len(whole) <= width else whole[: width - 1] + "…"
    assert one_line(text, width) == expected


def test_a_long_text_with_long_blank_runs_is_cut_as_the_whole_text() -> None:
    text = " " * 5000 + "word " * 10 + "\n" * 3000 + "end " * 50_000
    whole = " ".join(text.split())
    assert one_line(text, 70) == whole[:69] + "…"
    assert one_line("  a  b  ", 70) == "a b"
