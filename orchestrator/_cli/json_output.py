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
  where Python writes ``float.__repr__`` (``1e+16``, ``1e-05``, ``1e-07``):
  :func:`~orchestrator._core.json_floats.python_floats` writes them as Python does.
* A lone surrogate (a session may hold one) cannot be UTF-8, and msgspec refuses it; such a
  piece, a value msgspec cannot encode, and a piece with more candidate floats than the rewrite
  would save (a hexadecimal dump) take the standard library's path, escaped as
  ``JSON.stringify`` escapes them (D26).

Left as they are, because no command prints them: a NaN or an infinity (loading refuses them,
and no report computes one) would be ``null`` here where ``json.dumps`` writes the invalid
``NaN``; a float or boolean used as a dict key is written as msgspec writes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec

from orchestrator._core.json_floats import python_floats
from orchestrator._core.utf16 import escape_lone_surrogates

CHUNK = 256
"""Items of a long list encoded at once: big enough to amortize the calls, small enough that no
piece holds much of a 40,000-message context."""

_INDENT = b"  "


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
