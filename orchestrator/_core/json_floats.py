r"""Compact JSON as the standard library writes it, by msgspec's encoder (six times faster).

A float is written by msgspec in its own shortest form (``1e16``, ``0.00001``, ``1e-7``) where
Python writes ``float.__repr__`` (``1e+16``, ``1e-05``, ``1e-07``). They differ only where
Python uses an exponent, so only where msgspec wrote an ``e`` after a digit or a ``0.0000``.
:func:`python_floats` finds those, keeps the ones inside strings (an even count of unescaped
quotes before them says a token is not in one) and writes the others as Python does; the same
double either way, since both forms are shortest round trips.

Used by the command line's ``--json`` output (``_cli/json_output.py``) and by the server's
streamed answers (``_rpc/work.py``). A value msgspec refuses (a lone surrogate, which cannot be
UTF-8; a type it does not know; an integer over 64 bits) is the caller's to encode with the
standard library: :func:`compact` says so with ``None``. A NaN or an infinity would be ``null``
here where ``json.dumps`` writes the invalid ``NaN`` (loading refuses them, and no report
computes one).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

_FOLD_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_TOKEN_HEAD = frozenset(b"0123456789.-")
_TOKEN = frozenset(b"0123456789.-+e")
_BEFORE_VALUE = frozenset(b":,[")
_EXPONENT = re.compile(rb"0e[-+]?0+(?=[,\]}]|\Z)")
_SMALL = re.compile(rb"0\.0000[0-9]*(?=[,\]}]|\Z)")
_CANDIDATES_PER_BYTE = 1 / 64
"""More candidate floats than this per byte: the standard encoder costs less than the checks."""


def compact(value: Any) -> bytes | None:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` as UTF-8, or ``None``.

    ``None``: msgspec cannot encode ``value`` as the standard library would (see the module
    comment); the caller encodes it with the standard library.
    """
    import msgspec  # here: a process that never encodes a large answer never loads it

    try:
        data = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError):  # a lone surrogate, an unknown type
        return None
    return python_floats(data)


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
