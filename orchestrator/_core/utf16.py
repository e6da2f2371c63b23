"""Lengths and cuts in UTF-16 code units, as JavaScript's ``length`` and ``slice`` count (D26).

pi measures every length with JavaScript's ``String.prototype.length``, which counts UTF-16 code
units: a character outside the Basic Multilingual Plane (an emoji, a rare CJK ideograph) is a
surrogate pair and counts two. Python's ``len`` counts code points. So that the same session file
gives the same estimates, thresholds and cuts here as in pi, every length that feeds a number or
a cut goes through :func:`utf16_len`.

Cuts are where I part from JavaScript on purpose: ``slice`` happily splits a surrogate pair and
leaves half a character in the text. :func:`utf16_head` and :func:`utf16_tail` move such a cut one
unit towards keeping less, so no half pair is ever written. A lone surrogate that was already in
the text (JSON can carry one) counts one unit and is kept as it is.
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring as _encode_json_string

_HIGH = range(0xD800, 0xDC00)
_LOW = range(0xDC00, 0xE000)


def _units(text: str) -> bytes:
    # surrogatepass: a lone surrogate (valid in a Python str read from JSON) encodes as its one
    # unit instead of raising.
    return text.encode("utf-16-le", "surrogatepass")


def _unit(data: bytes, index: int) -> int:
    return data[2 * index] | data[2 * index + 1] << 8


def utf16_len(text: str) -> int:
    """The length of ``text`` in UTF-16 code units (JavaScript's ``text.length``)."""
    # isascii() is a flag check in CPython, so the common case costs nothing.
    if text.isascii():
        return len(text)
    return len(_units(text)) // 2


def utf16_head(text: str, units: int) -> str:
    """The longest prefix of ``text`` of at most ``units`` UTF-16 units that splits no pair.

    Like JavaScript's ``text.slice(0, units)``, except that a cut through a surrogate pair moves
    one unit earlier (D26).
    """
    if units <= 0:
        return ""
    if text.isascii():
        return text[:units]
    data = _units(text)
    total = len(data) // 2
    if units >= total:
        return text
    if _unit(data, units - 1) in _HIGH and _unit(data, units) in _LOW:
        units -= 1
    return data[: 2 * units].decode("utf-16-le", "surrogatepass")


def utf16_tail(text: str, units: int) -> str:
    """The longest suffix of ``text`` of at most ``units`` UTF-16 units that splits no pair.

    Like JavaScript's ``text.slice(-units)``, except that a cut through a surrogate pair moves one
    unit later, keeping less (D26).
    """
    if units <= 0:
        return ""
    if text.isascii():
        return text[-units:]
    data = _units(text)
    total = len(data) // 2
    if units >= total:
        return text
    start = total - units
    if _unit(data, start - 1) in _HIGH and _unit(data, start) in _LOW:
        start += 1
    return data[2 * start :].decode("utf-16-le", "surrogatepass")


_LONE = re.compile("[\ud800-\udfff]")


def escape_lone_surrogates(json_text: str) -> str:
    r"""Write each lone surrogate in ``json_text`` as ``\uXXXX``, as ``JSON.stringify`` does.

    A pair is one code point in a Python str, so only lone halves match. ``json.dumps`` with
    ``ensure_ascii=False`` leaves them raw; JavaScript escapes them (six units instead of one).
    """
    if json_text.isascii():
        return json_text
    return _LONE.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)


def json_string_len(text: str) -> int:
    """``JSON.stringify(text).length``: the quoted, escaped string in UTF-16 units (D26).

    A printable ASCII string without a quote or a backslash is itself in quotes; anything else
    is encoded (non-ASCII kept as is, lone surrogates escaped, as JavaScript writes them).
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text) + 2
    return utf16_len(escape_lone_surrogates(_encode_json_string(text)))
