"""``JSON.stringify`` as pi's JavaScript writes it: compact, non-ASCII kept, JavaScript numbers.

Token estimates and the serialized conversation measure and write tool-call arguments as pi
does, so that a file gives the same numbers here and in pi (D26). Python's number layout differs
from JavaScript's: ``1.0`` is ``1`` there, ``1e20`` is ``100000000000000000000``, and an integer
beyond 2^53 is the nearest double (``1.2345678901234568e+29``), since JavaScript reads every
JSON number as one. The stored value is kept exactly (D2); only what is measured and written
for the model follows JavaScript.
"""

from __future__ import annotations

import json
import math
from typing import Any

from orchestrator._core.utf16 import escape_lone_surrogates

# json.dumps(text, ensure_ascii=False) for a str is exactly this C function; calling it directly
# skips building an encoder per call.
encode_string = json.encoder.encode_basestring

_SAFE_INTEGER = 2**53  # beyond it a JavaScript number is no longer the integer it was written as


def js_number(value: float) -> str:
    """``String(value)`` for a double, as ``JSON.stringify`` writes it (``null`` if not finite)."""
    # JSON.stringify prints non-finite doubles as null, and the shortest round-trip digits
    # positionally for 1e-6 <= |x| < 1e21, else with an unpadded exponent ("1e-7", "1e+21").
    # Python's repr switches to exponents earlier (below 1e-4, from 1e16), so I redo the layout.
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    if 1e-6 <= abs(value) < 1e21:
        from decimal import Decimal  # here, not at the top: only floats need it

        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, exponent = repr(value).partition("e")
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa.removesuffix('.0')}e{sign}{exponent.lstrip('+-').lstrip('0')}"


def js_json(value: Any) -> str:
    """``JSON.stringify(value)``: compact separators, non-ASCII kept, JavaScript numbers.

    ``None`` prints as ``null``; values JSON cannot hold print as their ``str`` in quotes, as
    ``json.dumps(default=str)`` would, which is the least surprising choice for a summary.
    """
    if isinstance(value, str):
        return escape_lone_surrogates(encode_string(value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
            return int.__repr__(value)
        try:
            return js_number(float(value))  # the double JavaScript reads it as
        except OverflowError:  # beyond any double: Infinity, which JSON writes as null
            return "null"
    if isinstance(value, float):
        return js_number(value)
    if isinstance(value, dict):
        items = (f"{js_json(str(k))}:{js_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(js_json(item) for item in value) + "]"
    return js_json(str(value))
