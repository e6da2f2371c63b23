r"""A command's JSON as ``json.dumps(value, ensure_ascii=False, indent=2)`` writes it, fast.

Theory of operation. The standard library indents in Python, and even its compact encoder (in
C) took a quarter of ``context --json`` at 40k messages (0.2 s for 20 MB); holding its text, its
UTF-8 and the indented copy at once took 70 MB more than the command's session. msgspec's
encoder is six times faster, and ``msgspec.json.format`` indents exactly as ``json.dumps`` does,
so the value is encoded by msgspec a piece at a time: the top-level object key by key, a long
list a few hundred items at a time, each piece indented where it stands (a small value shifted
to its depth: JSON strings hold no raw newline, so every newline of a piece starts one of its
lines). No copy of the whole output is ever made.

Where msgspec writes other bytes than the standard library, I put the standard ones back:

* A float is written by msgspec in its own shortest form (``1e16``, ``0.00001``, ``1e-7``)
  where Python writes ``float.__repr__`` (``1e+16``, ``1e-05``, ``1e-07``). They differ only
  where Python uses an exponent, so only where msgspec wrote an ``e`` after a digit or a
  ``0.0000``. :func:`python_floats` finds those, keeps the ones inside strings (an even count of
  unescaped quotes before them says a token is not in one) and writes the others as Python
  does; the same double either way, since both forms are shortest round trips.
* A lone surrogate (a session may hold one) cannot be UTF-8, and msgspec refuses it; such a
  piece, a value msgspec cannot encode, and a piece with more candidate floats than the rewrite
  would save (a hexadecimal dump) take the standard library's path, escaped as
  ``JSON.stringify`` escapes them (D26).

Left as they are, because no command prints them: a NaN or an infinity (loading refuses them,
and no report computes one) would be ``null`` here where ``json.dumps`` writes the invalid
``NaN``; a float or boolean used as a dict key is written as msgspec writes it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from orchestrator._core.utf16 import escape_lone_surrogates

CHUNK = 256
"""Items of a long list encoded at once: big enough to amortize the calls, small enough that no
piece holds much of a 40,000-message context."""

_INDENT = b"  "
_FOLD_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_TOKEN_HEAD = frozenset(b"0123456789.-")
_TOKEN = frozenset(b"0123456789.-+e")
_BEFORE_VALUE = frozenset(b":,[")
_EXPONENT = re.compile(rb"0e[-+]?0+(?=[,\]}]|\Z)")
_SMALL = re.compile(rb"0\.0000[0-9]*(?=[,\]}]|\Z)")
_CANDIDATES_PER_BYTE = 1 / 64
"""More candidate floats than this per byte: the standard encoder costs less than the checks."""


def indented_pieces(value: Any) -> Iterator[bytes]:
    """``json.dumps(value, ensure_ascii=False, indent=2)`` as UTF-8, in pieces.

    Lone surrogates are escaped as ``JSON.stringify`` escapes them (D26).
    """
    if type(value) is dict and value and all(type(key) is str for key in value):
        yield b"{\n"
        separator = b""
        for key, item in value.items():
            yield separator + _INDENT + indented(key) + b": "
            yield from _pieces(item, 1)
            separator = b",\n"
        yield b"\n}"
    else:
        yield from _pieces(value, 0)


def _pieces(value: Any, depth: int) -> Iterator[bytes]:
    if type(value) is not list or len(value) <= CHUNK:
        yield _shifted(indented(value), depth)
        return
    # Each piece is wrapped in ``depth`` lists, so that msgspec indents its items where they
    # stand: the lines between the brackets are the piece, with no pass to shift them.
    head = b"".join(_INDENT * level + b"[\n" for level in range(depth + 1))
    tail = b"".join(b"\n" + _INDENT * level + b"]" for level in range(depth, -1, -1))
    yield b"[\n"
    for start in range(0, len(value), CHUNK):
        piece: Any = value[start : start + CHUNK]
        for _ in range(depth):
            piece = [piece]
        yield (b",\n" if start else b"") + indented(piece)[len(head) : -len(tail)]
    yield b"\n" + _INDENT * depth + b"]"


def _shifted(data: bytes, depth: int) -> bytes:
    return data.replace(b"\n", b"\n" + _INDENT * depth) if depth else data


def indented(value: Any) -> bytes:
    """``json.dumps(value, ensure_ascii=False, indent=2)`` as UTF-8, lone surrogates escaped."""
    try:
        data: bytes | None = msgspec.json.encode(value)
    except (TypeError, ValueError):  # a lone surrogate (UnicodeEncodeError), an unknown type
        data = None
    if data is not None:
        data = python_floats(data)
    if data is None:
        text = json.dumps(value, ensure_ascii=False, indent=2)
        return escape_lone_surrogates(text).encode("utf-8")
    return msgspec.json.format(data, indent=2)


def python_floats(data: bytes) -> bytes | None:
    """The compact JSON msgspec wrote, with every float written as ``float.__repr__`` writes it.

    ``None``: so many numbers that look like such floats inside strings (a tool's JSON output
    held in a text) that checking each would cost more than the standard library's encoder.
    """
    starts = _candidates(data)
    if not starts:
        return data
    if len(starts) > len(data) * _CANDIDATES_PER_BYTE + 16:
        return None
    # An escaped backslash as two other bytes: every backslash left before a quote escapes it.
    plain = data.replace(b"\\\\", b"__")
    out: list[bytes] = []
    done = counted = quotes = 0
    for start in starts:
        end = _float_end(data, start)
        if end < 0:
            continue
        quotes += plain.count(b'"', counted, start) - plain.count(b'\\"', counted, start)
        counted = start
        if quotes % 2:
            continue  # inside a string
        out += (data[done:start], repr(float(data[start:end])).encode("ascii"))
        done = end
    out.append(data[done:])
    return b"".join(out)


def _candidates(data: bytes) -> list[int]:
    """Where a float msgspec writes unlike Python may start: sorted token starts, no repeats.

    Both searches begin with a literal, which the regular expression engine finds at the speed
    of a byte search: a digit then ``e`` (the digits folded to ``0``) and ``0.0000``, each
    ending where a value ends. A hexadecimal id (``"3e4f"``) ends in a quote: no candidate.
    """
    hits: set[int] = set()
    found = itertools.chain(_EXPONENT.finditer(data.translate(_FOLD_DIGITS)), _SMALL.finditer(data))
    for match in found:
        start = match.start()
        while start and data[start - 1] in _TOKEN_HEAD:
            start -= 1
        if start == 0 or data[start - 1] in _BEFORE_VALUE:
            hits.add(start)
    return sorted(hits)


def _float_end(data: bytes, start: int) -> int:
    """The end of the number token at ``start``, or -1 when it is no number (text in a string)."""
    end = start
    size = len(data)
    while end < size and data[end] in _TOKEN:
        end += 1
    try:
        float(data[start:end])
    except ValueError:
        return -1
    return end
