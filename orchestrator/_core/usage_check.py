"""Name the token counts in a session that are numbers but not counts (D3).

pi writes an assistant message's ``usage`` as whole numbers of at least 0. A damaged or
hand-made file can hold a negative one, or an integer beyond a double's range (``10**400``,
which Python reads exactly and JavaScript as ``Infinity``). :mod:`orchestrator._core.tokens`
counts such a value as 0, as it does a string or null; this module says where it is, so
``check`` can name it with its line. The entry is kept verbatim (D2), so the problem does not
stand in the way of a rewrite.

Only numbers are named: a string or null where pi writes a count was tolerated silently before
this check existed, and still is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator._core.entries import Entry
from orchestrator._core.load_result import Problem
from orchestrator._core.tokens import LARGEST_COUNT, is_token_count

USAGE_KEYS = ("input", "output", "cacheRead", "cacheWrite", "totalTokens")
"""The counts of pi's ``Usage`` that the token rules read."""

_LARGEST_INT = int(LARGEST_COUNT)


def usage_problems(entries: Sequence[Entry], numbers: Sequence[int]) -> list[Problem]:
    """A ``bad_usage`` problem for each count that is a number but not a count.

    Args:
        entries: The entries read, in file order.
        numbers: Each entry's 1-based line.
    """
    problems: list[Problem] = []
    for entry, number in zip(entries, numbers, strict=True):
        if entry.get("type") != "message":
            continue
        message = entry.get("message")
        usage = message.get("usage") if type(message) is dict else None
        if type(usage) is dict:
            problems += entry_usage_problems(entry, number, usage)
    return problems


def entry_usage_problems(entry: Entry, number: int, usage: dict[str, Any]) -> list[Problem]:
    """:func:`usage_problems` of one message entry, given its message's ``usage`` dict."""
    problems: list[Problem] = []
    for key in USAGE_KEYS:
        value = usage.get(key)
        if type(value) is int and 0 <= value <= _LARGEST_INT:
            continue  # pi's counts: the one test most of them take, on every load
        if type(value) is bool or not isinstance(value, int | float):
            continue  # not a number: tolerated silently, as the module docstring says
        if not is_token_count(value):
            problems.append(_problem(entry, number, key, value))
    return problems


def _problem(entry: Entry, number: int, key: str, value: float) -> Problem:
    text = str(value)
    shown = text if len(text) <= 24 else f"an integer of {len(text.lstrip('-'))} digits"
    why = "negative" if value < 0 else "beyond the range of a double"
    message = (
        f"usage.{key} of entry {entry.get('id')!r} is {shown}, not a token count ({why}); "
        "counted as 0"
    )
    return Problem(line=number, code="bad_usage", message=message)
