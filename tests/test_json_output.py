"""msgspec's pieces (``_cli/json_output.py``) are ``json.dumps(indent=2)``'s bytes, floats too.

The differential property holds the pieces to the standard library on generated values: floats
of every magnitude, strings that look like floats after a comma or a bracket (so only the
quote count tells them apart), escaped quotes and backslashes before them, lone surrogates,
and lists long enough to be cut into pieces at every depth.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._cli import json_output
from orchestrator._cli.json_output import indented, indented_pieces
from orchestrator._core import json_floats
from orchestrator._core.json_floats import python_floats
from orchestrator._core.utf16 import escape_lone_surrogates


def _standard(value: Any) -> bytes:
    return escape_lone_surrogates(json.dumps(value, ensure_ascii=False, indent=2)).encode()


def _pieces(value: Any) -> bytes:
    return b"".join(indented_pieces(value))


_TRICKY = st.sampled_from(
    [",1e16]", "[1e16,", ":1e-07}", ",0.00001]", '\\",1e+16]', "\\\\", '"', "\\", "e", "0e", "3e4f"]
)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e16, 1e-05, -1e-05, 1.5e-07, 5e-324, 1.7976931348623157e308, -0.0, 0.0001, 1e15, 12.00001]
)
_TEXT = st.lists(_TRICKY | st.text(max_size=8), max_size=4).map("".join)
_SCALARS = st.none() | st.booleans() | st.integers() | _FLOATS | _TEXT
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(_TEXT, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(value=_VALUES)
def test_pieces_are_the_standard_bytes(value: Any) -> None:
    chunk = json_output.CHUNK
    json_output.CHUNK = 3  # long lists cut into pieces at every depth the values reach
    try:
        assert _pieces(value) == _standard(value)
        assert _pieces({"top": value, "list": [value] * 7}) == _standard(
            {"top": value, "list": [value] * 7}
        )
    finally:
        json_output.CHUNK = chunk


@settings(max_examples=300, deadline=None)
@given(number=_FLOATS, before=_TEXT)
def test_a_float_is_written_as_python_writes_it(number: float, before: str) -> None:
    value = [before, number, {before: number}, [number, before]]
    assert indented(value) == _standard(value)


@pytest.mark.parametrize(
    "value",
    [
        1e16,
        [1e-05],
        ["a\\", 1e16, "b"],
        ['"', ",1e16]", 1e-07],
        {'k\\"': 'a\\",1e16]', "n": 1e16},
        ["\\\\", "[1e16]", 2e16, ",0.00001]", -1e-05],
        ["a,1e5x", "b,1e-]", "[0.00001e", 1.5e-07, "x3e5]", ",1.-2e5]", ":-0.00001}"],
    ],
)
def test_floats_inside_strings_stay_as_they_are(value: Any) -> None:
    assert indented(value) == _standard(value)


def test_a_long_list_at_the_top_and_in_the_object() -> None:
    items = [{"n": k, "f": k / 3e7, "t": "é😀" * (k % 3)} for k in range(2 * json_output.CHUNK + 5)]
    for value in (items, {"a": items, "b": [], "c": {}, "d": items[:3]}, {"a": [items, items]}):
        assert _pieces(value) == _standard(value)


def test_a_lone_surrogate_takes_the_standard_path_in_its_piece_only() -> None:
    items = ["ok"] * json_output.CHUNK + ["a\ud800b"]
    assert _pieces({"x": items}) == _standard({"x": items})
    assert b'"a\\ud800b"' in _pieces(items)


def test_keys_not_all_strings_are_written_as_the_standard_library_writes_them() -> None:
    value = {1: [1e16], "a": 2}
    assert _pieces(value) == _standard(value)


def test_what_msgspec_cannot_encode_is_left_to_the_standard_library() -> None:
    with pytest.raises(TypeError):
        indented({"s": object()})


def test_many_candidates_cost_the_standard_encoding() -> None:
    dump = ",".join(["1e16"] * 200)  # a tool's JSON output held in a text
    data = json.dumps([dump, 1e16], separators=(",", ":")).encode()
    assert python_floats(data) is None
    assert indented([dump, 1e16]) == _standard([dump, 1e16])


def test_a_nan_is_what_no_report_holds() -> None:
    # Documented, not hidden: msgspec writes null where json.dumps writes the invalid NaN.
    assert indented([math.nan]) == b"[\n  null\n]"


def test_hexadecimal_ids_are_no_candidates() -> None:
    # Ids end in a quote, not where a value ends: the search never reaches Python for them.
    assert json_floats._candidates(b'["3e4f","0e00","1e5"]') == []
    assert json_floats._candidates(b'[1e16,"a",-0.00001]') == [1, 10]
