"""Line decoding: the fast parser reads what JavaScript's JSON.parse reads, and nothing changes.

msgspec reads most lines; the standard library reads the rest. These tests hold the two to the
same answers, and check that every string pi can write comes back exactly (D2).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core import json_lines
from orchestrator._core.json_lines import (
    FAST_FROM_BYTES,
    MAX_DEPTH,
    BadLine,
    decode_line,
    depth,
    line_decoder,
)
from orchestrator._core.loading import parse_session_bytes
from orchestrator._store.jsonl import write_pi_line

HEADER = b'{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/"}\n'

# Any Unicode string, lone surrogates included (Python strings may hold them; JSON.stringify
# writes them as \\udxxx escapes since ES2019).
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def js_stringify_string(text: str) -> str:
    """JSON.stringify of a string, as node writes it (well-formed JSON.stringify)."""
    short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
    short["\t"] = "\\t"
    out = []
    for char in text:
        code = ord(char)
        if char in short:
            out.append(short[char])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types and key order (1 and 1.0 and True differ here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


@settings(max_examples=300)
@given(TEXT)
def test_every_string_pi_writes_reads_back_exactly(text: str) -> None:
    raw = ('{"id":"a","text":' + js_stringify_string(text) + "}").encode("utf-8")
    assert decode_line(raw)["text"] == text


@settings(max_examples=300)
@given(VALUES)
def test_fast_and_standard_parsers_agree(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "backslashreplace")
    assert same(decode_line(raw), json.loads(raw.decode("utf-8")))


@settings(max_examples=200)
@given(st.dictionaries(TEXT, VALUES, max_size=5))
def test_unknown_fields_survive_load_and_rewrite_byte_for_byte(fields: dict[str, Any]) -> None:
    entry = {"type": "future_kind", **fields, "id": "a1b2c3d4", "parentId": None}
    line = write_pi_line(entry)
    loaded = parse_session_bytes(HEADER + line)
    assert loaded.problems == []
    (back,) = loaded.entries
    assert same(back, entry)
    assert write_pi_line(back) == line


def test_a_lone_surrogate_is_read_although_the_fast_parser_refuses_it() -> None:
    raw = b'{"id":"a","text":"broken \\ud83d emoji"}'
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(raw)  # the case the fallback exists for
    assert decode_line(raw)["text"] == "broken \ud83d emoji"


def test_big_integers_stay_exact() -> None:
    # orjson would turn this into a float, and a rewrite would change the file.
    assert decode_line(b'{"n":36893488147419103232}')["n"] == 2**65
    assert decode_line(b'{"n":-36893488147419103232}')["n"] == -(2**65)
    digits = "9" * 400  # beyond a double, within what both parsers read: kept, exactly
    assert decode_line(f'{{"n":{digits}}}'.encode())["n"] == int(digits)
    # The same through the standard parser (a lone surrogate sends the line there).
    assert decode_line(f'{{"s":"\\ud800","n":{digits}}}'.encode())["n"] == int(digits)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"a":NaN}', "not_json"),
        (b'{"a":Infinity}', "not_json"),
        (b'{"a":"\xff"}', "not_json"),
        (b'{"a":1} x', "not_json"),
        (b'{"a":1e400}', "bad_number"),
        (b'{"a":-1e400}', "bad_number"),
        (b'{"a":' + b"9" * 4301 + b"}", "bad_number"),
        (b'{"a":"\\ud800","b":' + b"9" * 4301 + b"}", "bad_number"),
        (b'{"a":' + b"[" * 1500 + b"]" * 1500 + b"}", "too_deep"),
        (b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "too_deep"),
    ],
)
def test_refused_lines_say_why(raw: bytes, code: str) -> None:
    with pytest.raises(BadLine) as caught:
        decode_line(raw)
    assert caught.value.code == code


def test_depth() -> None:
    assert depth(1) == 0
    assert depth([]) == 1
    assert depth({"a": [1, {"b": []}]}) == 4
    assert depth([[[]], []]) == 3


@settings(max_examples=200)
@given(VALUES)
def test_small_and_big_files_read_every_line_alike(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "backslashreplace")
    small, big = json_lines._decode_standard, line_decoder(FAST_FROM_BYTES)
    assert small is not big
    assert same(small(raw), big(raw))


def test_a_small_file_is_read_with_msgspec_only_once_something_imported_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing msgspec costs a short command more than it saves on a small file; once a
    server's routes imported it, every file is read with it (issue 9)."""
    monkeypatch.delitem(sys.modules, "msgspec")
    assert line_decoder(10) is json_lines._decode_standard
    assert "msgspec" not in sys.modules  # choosing imported nothing
    monkeypatch.setitem(sys.modules, "msgspec", msgspec)
    assert line_decoder(10) is line_decoder(FAST_FROM_BYTES)


def test_a_big_file_loads_like_a_small_one() -> None:
    line = write_pi_line({"type": "x", "id": "a", "parentId": None, "text": "\ud800 é"})
    padding = b"\n" * FAST_FROM_BYTES  # blank lines: a big file with the same content
    small = parse_session_bytes(HEADER + line)
    big = parse_session_bytes(HEADER + padding + line)
    assert small.entries == big.entries
    assert big.problems == []


@pytest.mark.parametrize("decoder", ["fast", "standard"])
def test_the_shortest_line_too_deep_is_refused_and_one_level_less_is_not(decoder: str) -> None:
    """Lines of at most 2 * MAX_DEPTH + 1 bytes skip the bracket count (issue 9): the shortest
    line nested one level too deep is 2 * (MAX_DEPTH + 1) bytes, just past that bound."""
    decode = json_lines.line_decoder(1 << 30 if decoder == "fast" else 0)
    if decoder == "standard" and "msgspec" in sys.modules:
        decode = json_lines._decode_standard
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert len(deep) == 2 * MAX_DEPTH + 2
    with pytest.raises(BadLine) as refused:
        decode(deep)
    assert refused.value.code == "too_deep"
    fits = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert decode(fits) == json.loads(fits)
    # Padding a line that fits does not make it too deep, however long it gets.
    padded = b"[" * MAX_DEPTH + b'"' + b"x" * 500 + b'"' + b"]" * MAX_DEPTH
    assert decode(padded) is not None


@pytest.mark.parametrize("size", [0, FAST_FROM_BYTES])
def test_invalid_utf8_names_the_byte(size: int) -> None:
    # Both decoders (small and big files) said only "not valid JSON".
    with pytest.raises(BadLine) as caught:
        line_decoder(size)(b'{"a":"caf\xe9"}')
    assert caught.value.code == "not_json"
    assert caught.value.message == ("not valid JSON: invalid UTF-8 at byte 10 of the line (0xe9)")
