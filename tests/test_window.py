"""A window on an append-only list reads as the tuple of its slice, without copying it."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.context import ContextBuilder, window
from orchestrator._core.window import Window
from tests.sessions import SessionBuilder


@given(
    st.lists(st.integers(), max_size=12),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=12),
    st.slices(14),
)
def test_a_window_reads_as_the_tuple_of_its_slice(
    items: list[int], lo: int, hi: int, cut: slice
) -> None:
    lo, hi = min(lo, len(items)), min(max(lo, hi), len(items))
    view, expected = Window(items, lo, hi - lo), tuple(items[lo:hi])
    assert len(view) == len(expected)
    assert tuple(view) == expected
    assert view == expected
    assert expected == view
    assert view == list(expected)
    assert hash(view) == hash(expected)
    assert view[cut] == expected[cut]
    for index in range(-len(expected), len(expected)):
        assert view[index] == expected[index]
    for index in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            view[index]
    assert repr(view) == f"Window({list(expected)!r})"


def test_a_window_ignores_what_is_appended_after_it() -> None:
    items = [1, 2, 3]
    view = Window(items, 1)
    items.append(4)
    assert view == (2, 3)
    assert list(view) == [2, 3]
    assert 4 not in view


def test_a_window_is_not_equal_to_a_string_or_a_number() -> None:
    assert Window(["a"]) != "a"
    assert Window([1]) != 1
    assert Window(array("q", [1, 2])) == (1, 2)


def test_a_plan_window_reads_the_context_list_directly() -> None:
    s = SessionBuilder()
    for text in ("a", "b", "c"):
        s.user(text)
    context = ContextBuilder(s.path()).context()
    ids = window(context.entry_ids, 1, 3)
    assert ids == tuple(context.entry_ids)[1:3]
    assert window(list(context.entry_ids), 0, 2) == tuple(context.entry_ids)[:2]
