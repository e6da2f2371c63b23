"""The server's lines are the standard library's text whether msgspec or json writes them.

``json_text.encoded`` takes msgspec for plain values only; the differential property holds it
to ``json.dumps`` (plus the lone-surrogate escapes) on generated values: every kind of string
(control characters, quotes, backslashes, lone surrogates, astral characters), integers of any
size, floats, and the types the standard library writes as their ``str``. Around it, the cheaper
parts of a request's path keep their old answers: decoding (a BOM, constants), the depth check
and the operation ids.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.utf16 import escape_lone_surrogates
from orchestrator._rpc import json_text
from orchestrator._rpc.errors import RpcError
from orchestrator._rpc.json_text import PLAIN_DEPTH, encoded, is_plain
from orchestrator._rpc.operations import new_id
from orchestrator._rpc.protocol import decode, depth, encode, encode_answer, success


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Word(enum.StrEnum):
    ONE = "one"


def _standard(value: Any) -> bytes:
    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False
    )
    return escape_lone_surrogates(text).encode("utf-8")


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["x\udc80y", "\ud800", "\U0001f600", '"', "\\", "\n\t\x00\x1f\x7f", "\u2028\u2029", "é"]
)
_OTHERS = st.sampled_from(
    [Color.RED, Level.HIGH, Word.ONE, {1, 2}, uuid.UUID(int=7), b"bytes", object.__name__]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
    | st.floats(allow_nan=False)
    | _TEXT
    | _OTHERS
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_TEXT, inner, max_size=5)
        | st.dictionaries(st.integers(), inner, max_size=2)
    ),
    max_leaves=30,
)


def _outcome(encoder: Callable[[Any], bytes], value: Any) -> bytes | str:
    try:
        return encoder(value)
    except ValueError as exc:  # an infinity: refused by both in the same words
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=500, deadline=None)
@given(value=_VALUES)
def test_encoded_is_the_standard_text(value: Any) -> None:
    assert _outcome(encoded, value) == _outcome(_standard, value)
    assert _outcome(lambda v: encode(v).encode("utf-8"), value) == _outcome(_standard, value)


def test_plain_values_are_written_by_msgspec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken: a plain answer never reaches the standard library."""

    def refuse(value: Any) -> str:
        raise AssertionError("the standard library was asked")

    monkeypatch.setattr(json_text, "standard", refuse)
    answer = success(7, {"compacted": True, "summary": 'é\n"x"', "n": 2**80, "s": None})
    assert encoded(answer) == _standard(answer)
    assert encoded([(1, "a"), {"k": [True, False]}]) == b'[[1,"a"],{"k":[true,false]}]'


@pytest.mark.parametrize(
    "value",
    [1.5, Color.RED, Word.ONE, Level.HIGH, {1: "a"}, {"a": {2, 3}}, "x\ud800"],
    ids=["float", "enum", "str-enum", "int-enum", "int-key", "set", "lone-surrogate"],
)
def test_what_msgspec_writes_otherwise_goes_to_the_standard_library(value: Any) -> None:
    assert encoded({"v": value}) == _standard({"v": value})


def test_nesting_past_the_plain_depth_goes_to_the_standard_library() -> None:
    shallow: Any = "leaf"
    for _ in range(PLAIN_DEPTH):
        shallow = [shallow]
    assert is_plain(shallow)
    assert not is_plain([shallow])
    assert encoded([shallow]) == _standard([shallow])


def test_errors_are_the_standard_librarys() -> None:
    looped: list[Any] = []
    looped.append(looped)
    for value in (float("nan"), {"a": [float("inf")]}, looped):
        with pytest.raises(ValueError, match="Out of range float|Circular reference"):
            encoded(value)
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        encoded(deep)


def test_an_answer_that_cannot_be_encoded_is_an_internal_error() -> None:
    line = encode_answer(success(3, {"x": float("nan")}))
    error = json.loads(line)["error"]
    assert (json.loads(line)["id"], error["code"]) == (3, -32603)
    assert error["message"].startswith("Internal error: result not encodable: Out of range float")


def test_decode_refuses_as_json_loads_does() -> None:
    assert decode(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    refusals = {
        "\ufeff{}": "Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)",
        '{"a": NaN}': "NaN is not valid JSON",
        "[-Infinity]": "-Infinity is not valid JSON",
        "[1,": "Expecting value: line 1 column 4 (char 3)",
    }
    for text, message in refusals.items():
        with pytest.raises(RpcError, match="^Parse error: ") as caught:
            decode(text)
        assert str(caught.value) == f"Parse error: {message}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 0), ("x", 0), ([], 1), ({}, 1), ({"a": [1, {"b": []}]}, 4), ([[[1]], {"a": [{}]}], 4)],
)
def test_depth_counts_arrays_and_objects(value: Any, expected: int) -> None:
    assert depth(value) == expected


def test_operation_ids_are_uuid4_hex() -> None:
    ids = {new_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        made = uuid.UUID(hex=text)
        assert (made.hex, made.version, made.variant) == (text, 4, uuid.RFC_4122)
