"""The line pass notes links and usage as it reads: the same problems as separate passes.

:func:`~orchestrator._core.reading.read_entries` checks usage counts and notes which entries'
parents are not the entry before while each entry is fresh; the loader then looks at those
only. Here both are held to the passes over all entries they replace.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.json_lines import line_decoder
from orchestrator._core.loading import parse_session_bytes
from orchestrator._core.reading import link_problems, read_entries
from orchestrator._core.tree import SessionTree
from orchestrator._core.usage_check import usage_problems

IDS = [f"{k:08x}" for k in range(6)]
PARENTS = st.sampled_from([*IDS, None, "missing0", 5, "__absent__"])
COUNTS = st.one_of(st.integers(-3, 10), st.just(10**400), st.floats(allow_nan=False), st.none())


@st.composite
def lines(draw: st.DrawFn) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(draw(st.integers(0, 10))):
        kinds = ["message", "custom", "session", "label"]
        entry: dict[str, Any] = {"type": draw(st.sampled_from(kinds))}
        if draw(st.booleans()):
            entry["id"] = draw(st.sampled_from([*IDS, "", 7]))
        parent = draw(PARENTS)
        if parent != "__absent__":
            entry["parentId"] = parent
        if entry["type"] == "label":
            entry["targetId"] = draw(st.sampled_from(IDS))
            entry["label"] = draw(st.sampled_from(["a", "", None]))
        if draw(st.booleans()):
            usage = {key: draw(COUNTS) for key in ("input", "output", "totalTokens")}
            entry["message"] = {"role": "assistant", "usage": usage}
        kind = draw(st.sampled_from(["entry", "entry", "entry", "array", "broken", "blank"]))
        if kind == "entry":
            out.append(json.dumps(entry).encode())
        else:
            out.append({"array": b"[1]", "broken": b"{", "blank": b"  "}[kind])
    return out


@settings(max_examples=300, deadline=None)
@given(lines(), st.booleans())
def test_the_noted_links_and_usage_are_what_whole_passes_find(
    raw: list[bytes], with_ids: bool
) -> None:
    problems: list[Any] = []
    read = read_entries([(0, raw)], problems, line_decoder(0), with_ids=with_ids)
    if with_ids:
        assert link_problems(read.entries, read.numbers, read.line_of, read.irregular) == (
            link_problems(read.entries, read.numbers, read.line_of)
        )
    assert read.usage_problems == usage_problems(read.entries, read.numbers)


@settings(max_examples=300, deadline=None)
@given(lines())
def test_a_tree_over_the_reads_index_is_the_tree_that_indexes_itself(raw: list[bytes]) -> None:
    header = json.dumps({"type": "session", "version": 3, "id": "s", "timestamp": "t"})
    result = parse_session_bytes(b"\n".join([header.encode(), *raw]) + b"\n")
    assert result.header is not None
    assert result.index is not None
    given_index = SessionTree(result.header, result.entries, result.index)
    own = SessionTree(result.header, list(result.entries))
    assert given_index.by_id == own.by_id
    assert given_index._linear == own._linear
    assert given_index.labels == own.labels
    for entry_id in [*own.by_id, None]:
        assert given_index.path(entry_id) == own.path(entry_id)
