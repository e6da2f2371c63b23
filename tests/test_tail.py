"""Where a session ends, read back from its bytes (D27; issue 9 for the reading)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator._store.protocol import Tail
from orchestrator._store.tail import _lines_backwards, last_id_in_lines, tail_of_bytes

LINES = st.sampled_from(
    [
        b'{"type":"session","version":3,"id":"s"}',
        b'{"type":"message","id":"a","parentId":null}',
        b'{"type":"message","id":"b","parentId":"a"}',
        b'{"type":"custom","id":"c"}',
        b'{"type":"message"}',
        b"",
        b"   ",
        b"not json",
        b'{"type":"message","id":"d"',
        b"[1]",
    ]
)


@given(st.lists(LINES, max_size=12), st.booleans())
def test_the_lines_read_back_from_the_end_are_the_split_lines_reversed(
    lines: list[bytes], terminated: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if terminated else b"")
    assert list(_lines_backwards(data)) == list(reversed(data.split(b"\n")))
    expected = Tail(last_id=last_id_in_lines(reversed(data.split(b"\n"))), length=len(data))
    assert tail_of_bytes(data) == expected


def test_the_tail_is_the_last_entry_line_whatever_follows_it() -> None:
    data = b'{"type":"session","id":"s"}\n{"type":"message","id":"a"}\n\nnot json\n{"x":'
    assert tail_of_bytes(data) == Tail(last_id="a", length=len(data))
    assert tail_of_bytes(b"") == Tail(last_id=None, length=0)
    assert tail_of_bytes(b'{"type":"session","id":"s"}\n') == Tail(last_id=None, length=28)
