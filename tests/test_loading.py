"""Parsing session bytes (decisions D2 and D3)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.loading import (
    append_refusal,
    parse_session_bytes,
    plan_tail_repair,
    read_session,
    rewrite_refusal,
)

HEADER = (
    b'{"type":"session","version":3,"id":"s1","timestamp":"2026-01-01T00:00:00.000Z","cwd":"/"}\n'
)


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def test_healthy_file_loads_everything_without_problems() -> None:
    data = (
        HEADER + line(type="message", id="a", parentId=None) + line(type="x", id="b", parentId="a")
    )
    result = parse_session_bytes(data)
    assert result.problems == []
    assert result.header is not None
    assert result.header["id"] == "s1"
    assert [entry["id"] for entry in result.entries] == ["a", "b"]
    assert result.migrated is False
    assert result.torn_tail == b""


def test_empty_and_blank_files_have_no_header_and_no_problems() -> None:
    for data in (b"", b"\n\n", b"  \n"):
        result = parse_session_bytes(data)
        assert result.header is None
        assert result.entries == []
        assert result.problems == []


def test_blank_lines_are_skipped_silently_and_line_numbers_stay_physical() -> None:
    data = b"\n" + HEADER + b"\n   \n" + line(id="a", parentId="nope")
    result = parse_session_bytes(data)
    assert result.header is not None
    assert [(p.line, p.code) for p in result.problems] == [(5, "unknown_parent")]


def test_unterminated_last_line_that_is_json_is_an_ordinary_line() -> None:
    data = HEADER + b'{"type":"message","id":"a","parentId":null}'
    result = parse_session_bytes(data)
    assert result.problems == []
    assert result.torn_tail == b""
    assert [entry["id"] for entry in result.entries] == ["a"]


def test_crlf_line_endings_load() -> None:
    data = HEADER.replace(b"\n", b"\r\n") + b'{"id":"a","parentId":null}\r\n'
    result = parse_session_bytes(data)
    assert result.problems == []
    assert [entry["id"] for entry in result.entries] == ["a"]


def test_unknown_types_and_fields_are_kept_verbatim_and_are_not_problems() -> None:
    odd = {
        "type": "from_the_future",
        "id": "z",
        "parentId": None,
        "blob": {"deep": [1, {"x": None}]},
    }
    result = parse_session_bytes(HEADER + json.dumps(odd).encode() + b"\n")
    assert result.problems == []
    assert result.entries == [odd]


def test_self_parent_is_a_root_not_a_problem() -> None:
    result = parse_session_bytes(HEADER + line(id="a", parentId="a"))
    assert result.problems == []


def test_parents_may_point_forward_in_the_file() -> None:
    result = parse_session_bytes(HEADER + line(id="b", parentId="a") + line(id="a", parentId=None))
    assert result.problems == []


def test_long_chain_has_no_false_cycle() -> None:
    lines = [line(id="e0", parentId=None)]
    lines += [line(id=f"e{i}", parentId=f"e{i - 1}") for i in range(1, 3000)]
    result = parse_session_bytes(HEADER + b"".join(lines))
    assert result.problems == []
    assert len(result.entries) == 3000


def test_every_cycle_is_reported_once_even_with_tails_leading_into_it() -> None:
    data = HEADER + b"".join(
        [
            line(id="t", parentId="c2"),  # leads into the cycle, not part of it
            line(id="c1", parentId="c3"),
            line(id="c2", parentId="c1"),
            line(id="c3", parentId="c2"),
            line(id="x", parentId="y"),
            line(id="y", parentId="x"),
        ]
    )
    result = parse_session_bytes(data)
    cycles = [p for p in result.problems if p.code == "cycle"]
    assert [p.line for p in cycles] == [3, 6]
    assert "'c1' -> 'c3' -> 'c2' -> 'c1'" in cycles[0].message
    assert "'x' -> 'y' -> 'x'" in cycles[1].message
    assert len(result.entries) == 6  # cycle members are kept


def test_nan_and_infinity_are_not_json() -> None:
    # JavaScript's JSON.parse rejects them, so pi could never have written them.
    result = parse_session_bytes(HEADER + b'{"id":"a","parentId":null,"x":NaN}\n')
    assert [(p.line, p.code) for p in result.problems] == [(2, "not_json")]


def test_invalid_utf8_is_not_json() -> None:
    result = parse_session_bytes(HEADER + b'{"id":"a","parentId":null,"x":"\xff"}\n')
    assert [(p.line, p.code) for p in result.problems] == [(2, "not_json")]


def test_header_with_unreadable_version_is_bad_header_and_read_as_current() -> None:
    header = b'{"type":"session","version":"two","id":"s"}\n'
    result = parse_session_bytes(
        header + b'{"type":"message","id":"a","parentId":null,"message":{"role":"hookMessage"}}\n'
    )
    assert [(p.line, p.code) for p in result.problems] == [(1, "bad_header")]
    assert '"two" is a string' in result.problems[0].message
    assert result.migrated is False
    assert result.entries[0]["message"]["role"] == "hookMessage"


def test_read_session_reports_the_stored_version() -> None:
    assert read_session(HEADER).stored_version == 3
    assert read_session(b'{"type":"session","id":"s"}\n').stored_version == 1
    assert read_session(b"").stored_version is None
    assert read_session(b"[]\n").stored_version is None


def test_plan_tail_repair() -> None:
    assert plan_tail_repair(b"") is None
    assert plan_tail_repair(b"a\n") is None
    whole = plan_tail_repair(b'x\n{"a":1}')
    assert whole is not None
    assert (whole.keep, whole.moved, whole.add_newline) == (len(b'x\n{"a":1}'), b"", True)
    torn = plan_tail_repair(b'x\n{"a":')
    assert torn is not None
    assert (torn.keep, torn.moved, torn.add_newline) == (2, b'{"a":', False)
    only = plan_tail_repair(b'{"type":"sess')
    assert only is not None
    assert (only.keep, only.moved) == (0, b'{"type":"sess')


def test_refusals() -> None:
    healthy = read_session(HEADER)
    assert rewrite_refusal("f", healthy) is None
    assert append_refusal("f", healthy, [{"id": "a"}]) is None
    torn_only = read_session(HEADER + b'{"id":')
    assert rewrite_refusal("f", torn_only) is None
    damaged = read_session(HEADER + b"junk\n")
    reason = rewrite_refusal("f", damaged)
    assert reason is not None
    assert "refusing to rewrite f" in reason
    assert "line 2: not valid JSON" in reason
    empty = read_session(b"")
    assert append_refusal("f", empty, [{"type": "session", "id": "s"}]) is None
    assert "must be the header" in (append_refusal("f", empty, [{"id": "a"}]) or "")
    foreign = read_session(b"hello\n")
    assert "not a session file" in (append_refusal("f", foreign, [{"id": "a"}]) or "")
    v1 = read_session(b'{"type":"session","id":"s"}\n{"type":"message"}\n')
    assert "version 1" in (append_refusal("f", v1, [{"id": "a"}]) or "")


def test_rewrite_refusal_lists_at_most_five_problems() -> None:
    damaged = read_session(HEADER + b"junk\n" * 8)
    reason = rewrite_refusal("f", damaged) or ""
    assert reason.count("not valid JSON") == 5
    assert "(and 3 more)" in reason


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = parse_session_bytes(data)
    assert [p.line for p in result.problems] == sorted(p.line for p in result.problems)
    ids = [entry["id"] for entry in result.entries]
    assert len(ids) == len(set(ids))


@given(
    st.lists(
        st.one_of(
            st.just(b"junk"),
            st.just(b"[1]"),
            st.just(b"{}"),
            st.builds(
                lambda i, p: line(id=f"e{i}", parentId=None if p is None else f"e{p}"),
                st.integers(0, 6),
                st.none() | st.integers(0, 8),
            ).map(lambda raw: raw[:-1]),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_arbitrary_lines_after_a_header_never_raise(lines: list[bytes], terminated: bool) -> None:
    data = HEADER + b"\n".join(lines) + (b"\n" if terminated else b"")
    result = parse_session_bytes(data)
    assert result.header is not None
    for problem in result.problems:
        assert 2 <= problem.line <= len(lines) + 1
        assert problem.code in {
            "not_json",
            "not_object",
            "no_id",
            "duplicate_id",
            "unknown_parent",
            "cycle",
            "torn_line",
        }


def test_header_without_a_string_id_is_not_a_session() -> None:
    result = parse_session_bytes(b'{"type":"session","id":7}\n')
    assert [(p.line, p.code) for p in result.problems] == [(1, "not_session")]
    assert result.header is None


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"null", "null"),
        (b"true", "boolean"),
        (b"1.5", "number"),
        (b'"x"', "string"),
        (b"[]", "array"),
    ],
)
def test_not_object_names_the_json_kind(raw: bytes, kind: str) -> None:
    result = parse_session_bytes(HEADER + raw + b"\n")
    assert [str(p) for p in result.problems] == [f"line 2: a JSON {kind}, not an object; skipped"]


def test_missing_parent_field_is_reported_and_the_entry_kept() -> None:
    result = parse_session_bytes(HEADER + line(type="message", id="a"))
    assert [str(p) for p in result.problems] == [
        "line 2: entry 'a' has no parentId field; kept as a root"
    ]
    assert [entry["id"] for entry in result.entries] == ["a"]


def test_non_string_parent_is_unknown() -> None:
    result = parse_session_bytes(HEADER + line(id="a", parentId=5))
    assert [str(p) for p in result.problems] == [
        "line 2: parent 5 (not an id) of entry 'a' does not exist; kept as a root"
    ]


_PIECES = [
    b"\n",
    b"  \n",
    b"junk\n",
    b"[1, 2]\n",
    HEADER,
    line(type="message", id="a", parentId=None),
    line(type="message", id="b", parentId="a"),
    line(type="message", id="a", parentId=None),  # a duplicate id when "a" came first
    line(type="message", parentId="a"),  # no id
    line(type="x", id="c" * 300, parentId="b"),  # longer than the smallest batches
    b'{"type":"message","id":"d","parentId":"b"}',  # unterminated, but JSON
    b'{"type":"message","id":"e"',  # torn
]


def _summary(data: bytes) -> tuple[object, ...]:
    parsed = read_session(data)
    result = parsed.result
    return (
        result.header,
        result.entries,
        [(p.line, p.code, p.message) for p in result.problems],
        result.torn_tail,
        parsed.stored_version,
    )


@given(
    st.lists(st.integers(0, len(_PIECES) - 3), max_size=30),
    st.integers(0, 2),
    st.sampled_from([1, 2, 5, 64, 1 << 20]),
)
def test_a_file_split_into_batches_reads_as_when_split_whole(
    picks: list[int], ending: int, batch: int
) -> None:
    """The loader splits a big file into lines a batch at a time (issue 9): lines that straddle
    a batch's end, line numbers and problems in later batches, a header after blank lines in an
    earlier batch and an unterminated last line come out as when the whole file is one batch."""
    import orchestrator._core.loading as loading

    data = b"".join(_PIECES[k] for k in picks)
    if ending:
        data += _PIECES[-ending]
    whole = _summary(data)
    saved = loading._BATCH
    loading._BATCH = batch
    try:
        assert _summary(data) == whole
    finally:
        loading._BATCH = saved
    # And the answer is the one a single split of the whole file gives, line by line.
    lines = data.split(b"\n")
    if whole[0] is not None:
        first = next(k for k, raw in enumerate(lines) if raw.strip())
        assert json.loads(lines[first]) == whole[0]


def _reference_link_codes(entries: list[dict[str, object]]) -> list[tuple[str, str]]:
    """Which entries the link check must name, worked out by brute force: an unknown parent
    (absent, not a string, or no such entry), and one problem per parent cycle, named by its
    member earliest in the file."""
    ids = [str(entry["id"]) for entry in entries]
    named: list[tuple[str, str]] = []
    parent_of: dict[str, str] = {}
    for entry_id, entry in zip(ids, entries, strict=True):
        parent = entry.get("parentId", "<missing>")
        if parent is None or parent == entry_id:
            continue
        if isinstance(parent, str) and parent in ids:
            parent_of[entry_id] = parent
        else:
            named.append(("unknown_parent", entry_id))
    cycles = set()
    for start in ids:
        seen: list[str] = []
        node: str | None = start
        while node is not None and node not in seen:
            seen.append(node)
            node = parent_of.get(node)
        if node is not None:
            cycles.add(min(seen[seen.index(node) :], key=ids.index))
    named += [("cycle", member) for member in cycles]
    return sorted(named, key=lambda item: ids.index(item[1]))


@given(st.lists(st.sampled_from(["prev", "earlier", "later", "none", "self", "gone", "num"])))
def test_the_link_check_names_what_brute_force_finds(kinds: list[str]) -> None:
    """The link check skips the lookup for a parent that is the entry just before (issue 9):
    whatever mix of links a file has, it names the same entries as a brute-force walk."""
    import random

    rng = random.Random(len(kinds))
    entries: list[dict[str, object]] = []
    for k, kind in enumerate(kinds):
        parent: object = {
            "prev": f"e{k - 1}",
            "earlier": f"e{rng.randrange(k)}" if k else None,
            "later": f"e{rng.randrange(k, len(kinds))}",
            "none": None,
            "self": f"e{k}",
            "gone": "nowhere",
            "num": k,
        }[kind]
        entries.append({"type": "x", "id": f"e{k}", "parentId": parent})
    if kinds and kinds[-1] == "none":
        del entries[-1]["parentId"]  # and a missing field now and then
    data = HEADER + b"".join(json.dumps(entry).encode() + b"\n" for entry in entries)
    by_line = {number + 2: str(entry["id"]) for number, entry in enumerate(entries)}
    found = [
        (problem.code, by_line[problem.line]) for problem in parse_session_bytes(data).problems
    ]
    assert found == _reference_link_codes(entries)
