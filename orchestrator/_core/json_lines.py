r"""Decode one line of a session file the way JavaScript's ``JSON.parse`` reads it.

Theory of operation. Parsing is most of the cost of loading a big session, so there every line
first goes to msgspec's decoder (a maintained C parser, several times faster than the standard
library's, and keeping integers of any size exact). Some lines it refuses that ``JSON.parse``
accepts: a string with a lone surrogate escape (``"\ud800"``, which ``JSON.stringify`` writes
for a broken emoji), a number beyond the range of a double, nesting deeper than its stack
allows. Those lines, and only those, go through the standard library's decoder, which reads lone
surrogates as Python does and lets me say exactly what is wrong with the rest. The two decoders
agree on every line both accept (``tests/test_json_lines.py`` checks this differentially), so
which one read a line never shows in the result, and an entry rewritten later is the same JSON
it was (D2). That is also why a small file (:func:`line_decoder`) skips msgspec altogether:
importing it costs more than it would save, and a short command should start fast.

What ``JSON.parse`` would read but I refuse, each with its own problem code:

* ``too_deep``: nesting deeper than :data:`MAX_DEPTH`. Later steps walk entries recursively
  (token estimates, serialization, the JSON encoder) and Python's stack is finite.
* ``bad_number``: a fraction or exponent beyond the range of a double (``1e400``), which
  JavaScript reads as ``Infinity``: no token count can use it and JSON cannot write it back.
  Also an integer with more digits than Python converts (4300 by default), a limit both parsers
  share. Integers below that stay exact, however large (JavaScript would round them).

And what it refuses too: ``NaN``, ``Infinity``, invalid UTF-8 (``not_json``; the message
names the first invalid byte).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 200
"""Deepest nesting of arrays and objects a line may have (the line itself counts as 1).

pi's own entries nest about 6 deep; tool arguments add what the model sent. The limit leaves
room for the recursive walks later steps make inside Python's default recursion limit (1000).
"""


class BadLine(ValueError):
    """A line that cannot be used, with the problem code and message that say why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _not_json() -> BadLine:
    return BadLine("not_json", "not valid JSON")


def _too_deep() -> BadLine:
    return BadLine(
        "too_deep", f"nested more than {MAX_DEPTH} levels deep, too deep to process; skipped"
    )


def _shown(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


def _out_of_range(text: str) -> BadLine:
    return BadLine(
        "bad_number",
        f"the number {_shown(text)} is beyond the range of a double (JavaScript reads it as "
        "Infinity, which JSON cannot write back); skipped",
    )


def _too_long(text: str) -> BadLine:
    return BadLine(
        "bad_number",
        f"the integer {_shown(text)} has more digits than can be read "
        f"({sys.get_int_max_str_digits()} at most); skipped",
    )


def _reject_constant(name: str) -> Any:
    raise _not_json()


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _out_of_range(text)
    return value


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4300 by default): msgspec agrees
        raise _too_long(text) from None


# One standard decoder for every line: json.loads with keywords builds a new decoder per call.
_EXACT = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
)


FAST_FROM_BYTES = 1 << 20
"""Files from this size on are parsed with msgspec (1 MiB: a few thousand entries)."""


def decode_line(raw: bytes) -> Any:
    """Decode one line, or raise :class:`BadLine` saying why it cannot be used.

    Args:
        raw: The line's bytes, without its newline.

    Returns:
        The decoded value (any JSON value; the caller checks that it is an object).

    Raises:
        BadLine: ``not_json``, ``too_deep`` or ``bad_number``.
    """
    return _fast_decoder()(raw)


def line_decoder(size: int) -> Callable[[bytes], Any]:
    """The decoder for the lines of a file of ``size`` bytes (see :func:`decode_line`).

    Both decoders give the same answer on every line. The fast one pays for its import on big
    files only, and costs nothing more once imported: a server, whose summary routes import
    msgspec, reads every file with it (opening 1,000 sessions of 0.4 MB each: issue 9).
    """
    if size >= FAST_FROM_BYTES or "msgspec" in sys.modules:
        return _fast_decoder()
    return _decode_standard


def _fast_decoder() -> Callable[[bytes], Any]:
    global _fast
    if _fast is None:
        import msgspec

        decode, refused = msgspec.json.Decoder().decode, (msgspec.MsgspecError, RecursionError)

        def fast(raw: bytes) -> Any:
            try:
                value = decode(raw)
            except refused:
                value = _decode_exactly(raw)
            return _checked(raw, value)

        _fast = fast
    return _fast


_fast: Callable[[bytes], Any] | None = None


def _decode_standard(raw: bytes) -> Any:
    return _checked(raw, _decode_exactly(raw))


_SHALLOW_BYTES = 2 * MAX_DEPTH + 1
"""A line this short cannot nest deeper than :data:`MAX_DEPTH`: that takes more openers and as
many closers."""


def _checked(raw: bytes, value: Any) -> Any:
    # A line cannot nest deeper than it has brackets: the exact walk runs only on the rare line
    # with that many (code in a tool result, mostly), and counting bytes is cheap, and skipped
    # for a line too short to hold them.
    if len(raw) > _SHALLOW_BYTES and raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        if depth(value) > MAX_DEPTH:
            raise _too_deep()
    return value


def _decode_exactly(raw: bytes) -> Any:
    try:
        return _EXACT.decode(raw.decode("utf-8"))
    except BadLine:
        raise
    except RecursionError:
        raise _too_deep() from None
    except UnicodeDecodeError as exc:  # only here, after msgspec refused: no cost when valid
        raise BadLine(
            "not_json",
            f"not valid JSON: invalid UTF-8 at byte {exc.start + 1} of the line "
            f"(0x{raw[exc.start]:02x})",
        ) from None
    except ValueError:
        raise _not_json() from None


def is_json(raw: bytes) -> bool:
    """True when ``raw`` is one whole JSON value (usable or not: too deep still counts)."""
    try:
        _decode_standard(raw)
    except BadLine as bad:
        return bad.code != "not_json"
    return True


def depth(value: object) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest
