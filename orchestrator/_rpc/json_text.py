r"""The JSON text of the server's lines: the standard library's, by msgspec when that is the same.

Every line the server writes is ``json.dumps(value, ensure_ascii=False, separators=(",", ":"),
default=str, allow_nan=False)`` with lone surrogates escaped (:func:`standard`). That costs 5 µs
for a session event and 11 µs for a compaction's answer, and a compaction through the server
writes four such lines (three events and the answer): with a thousand compactions at once,
the encoding was a sixth of the server's own CPU time per request (``tests/bench/bench_rpc.py``).
msgspec writes the same text about five times faster, but not for every value: it writes floats
in its own shortest form (``1e16`` for ``1e+16``), a NaN as ``null`` where the standard library
refuses it, and it knows types (dataclasses, enums, sets, dates) that the standard library
writes as their ``str``; it refuses lone surrogates.

So I take msgspec only for *plain* values, checked first: dicts with ``str`` keys, lists,
tuples, strings, integers, booleans and ``None``, of exactly those types (a ``str`` subclass such
as an enum member is not plain), nested at most :data:`PLAIN_DEPTH` levels. For those, both write
the same bytes: the same escapes (checked for every code point), the same integers of any size,
the same order of keys. Anything else (a float, another type, a lone surrogate msgspec refuses,
a value nested deeper, which includes one that contains itself) is written by the standard
library as before, with its errors.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from orchestrator._core.utf16 import escape_lone_surrogates

PLAIN_DEPTH = 16
"""Deepest nesting the plain check follows (the server's answers and events have four or five
levels); a deeper value, or one that contains itself, goes to the standard library."""

_SCALARS = frozenset({str, int, bool, type(None)})
_ENCODE = msgspec.json.Encoder().encode


def standard(value: Any) -> str:
    r"""``value`` as the server writes it, by the standard library (lone surrogates as ``\udXXX``).

    Raises:
        ValueError: ``value`` holds ``NaN`` or an infinity, or contains itself.
        RecursionError: ``value`` is nested too deeply to encode.
    """
    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False
    )
    return escape_lone_surrogates(text)


def encoded(value: Any) -> bytes:
    """``value`` as :func:`standard` writes it, in UTF-8 (by msgspec when it is plain).

    Raises:
        ValueError: as :func:`standard`.
        RecursionError: as :func:`standard`.
    """
    if is_plain(value):
        try:
            return _ENCODE(value)
        except UnicodeEncodeError:  # a lone surrogate: the standard library escapes it
            pass
    return standard(value).encode("utf-8")


def is_plain(value: Any, level: int = 0) -> bool:
    """Whether msgspec writes ``value`` as the standard library does (see the module comment)."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if level >= PLAIN_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) not in _SCALARS and not is_plain(item, level + 1):
                return False
        return True
    if kind is list or kind is tuple:
        return all(type(item) in _SCALARS or is_plain(item, level + 1) for item in value)
    return False
