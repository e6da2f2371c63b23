"""Entry and journal timestamps: pi's ``new Date(ms).toISOString()``, formatted once a second."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.entries import iso_now, iso_to_ms


def test_the_milliseconds_are_exact_where_float_seconds_would_round_them() -> None:
    # What JavaScript's toISOString gives for these (dividing by 1000 in floating point lost a
    # millisecond far from the epoch).
    assert iso_now(253402300799999) == "9999-12-31T23:59:59.999Z"
    assert iso_now(9456229942911) == "2269-08-28T02:32:22.911Z"
    assert iso_now(0) == "1970-01-01T00:00:00.000Z"
    assert iso_now(-1) == "1969-12-31T23:59:59.999Z"


def test_each_second_is_formatted_again_not_taken_from_the_last_one() -> None:
    assert iso_now(1764000000999) == "2025-11-24T16:00:00.999Z"
    assert iso_now(1764000001000) == "2025-11-24T16:00:01.000Z"  # the next second
    assert iso_now(1764000000001) == "2025-11-24T16:00:00.001Z"  # and back again
    assert iso_now(1764000000001.9) == "2025-11-24T16:00:00.001Z"  # type: ignore[arg-type]


@given(st.integers(min_value=-(10**12), max_value=253402300799999))
def test_a_timestamp_reads_back_as_its_milliseconds(now_ms: int) -> None:
    assert iso_to_ms(iso_now(now_ms)) == now_ms


def test_threads_stamping_different_seconds_each_get_their_own() -> None:
    wrong: list[tuple[int, str]] = []

    def stamp(base: int) -> None:
        for k in range(2000):
            now = base + k * 1000 + 7
            text = iso_now(now)
            if iso_to_ms(text) != now:
                wrong.append((now, text))

    threads = [threading.Thread(target=stamp, args=(1764000000000 + n * 10**9,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
