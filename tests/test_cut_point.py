"""findCutPoint and pi's compaction.test.ts cut-point cases."""

from __future__ import annotations

from orchestrator._core.cut_point import (
    CutPoint,
    find_cut_point,
    find_turn_start_index,
    is_cut_point,
    valid_cut_points,
)
from orchestrator._core.entries import role_of
from tests.sessions import SessionBuilder, usage


def _alternating(turns: int) -> list[dict[str, object]]:
    s = SessionBuilder()
    for i in range(turns):
        s.user(f"User {i}")
        s.assistant(f"Assistant {i}", usage=usage(cache_read=(i + 1) * 1000, output=100))
    return s.path()


# -- pi conformance (compaction.test.ts "findCutPoint") ----------------------------------------


def test_cut_lands_on_user_or_assistant() -> None:
    path = _alternating(10)
    cut = find_cut_point(path, 0, len(path), 10)
    assert role_of(path[cut.first_kept_index]) in ("user", "assistant")
    assert cut.first_kept_index > 0


def test_single_assistant_entry_keeps_index_zero() -> None:
    s = SessionBuilder()
    s.assistant("a")
    cut = find_cut_point(s.path(), 0, 1, 1000)
    assert cut.first_kept_index == 0


def test_everything_fits_keeps_everything() -> None:
    s = SessionBuilder()
    s.user("1")
    s.assistant("a")
    s.user("2")
    s.assistant("b")
    assert find_cut_point(s.path(), 0, 4, 50000) == CutPoint(
        first_kept_index=0, turn_start_index=-1, is_split_turn=False
    )


def test_cut_at_assistant_is_a_split_turn() -> None:
    s = SessionBuilder()
    s.user("Turn 1")
    s.assistant("A1")
    s.user("Turn 2")  # index 2
    s.assistant("x" * 400)  # 100 tokens
    s.assistant("y" * 400)
    s.assistant("z" * 400)
    cut = find_cut_point(s.path(), 0, 6, 150)
    assert cut.first_kept_index == 4
    assert cut.is_split_turn
    assert cut.turn_start_index == 2


def test_cut_on_user_is_not_split() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    s.user("c" * 400)
    s.assistant("d" * 400)
    cut = find_cut_point(s.path(), 0, 4, 200)
    assert cut == CutPoint(first_kept_index=2, turn_start_index=-1, is_split_turn=False)


# -- valid cut points --------------------------------------------------------------------------


def test_tool_results_and_metadata_are_not_cut_points() -> None:
    s = SessionBuilder()
    s.model_change()
    s.user("u")
    s.assistant("a", calls=[("bash", {"command": "ls"})])
    s.tool_result("out")
    s.custom_message("note")
    s.branch_summary("went elsewhere")
    s.bash("ls", "out")
    s.thinking()
    s.label("00000002", "here")
    s.custom()
    path = s.path()
    assert valid_cut_points(path, 0, len(path)) == [1, 2, 4, 5, 6]
    assert not is_cut_point({"type": "compaction", "id": "x"})


def test_no_cut_points_keeps_window_start() -> None:
    s = SessionBuilder()
    s.user("u")
    s.tool_result("orphan")
    s.tool_result("orphan")
    assert find_cut_point(s.path(), 1, 3, 1) == CutPoint(
        first_kept_index=1, turn_start_index=-1, is_split_turn=False
    )


def test_custom_messages_count_toward_the_budget() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    s.custom_message("c" * 4000)  # pi 1.x (0.80.4) counts it; pi 0.73 did not
    s.user("d" * 40)
    path = s.path()
    cut = find_cut_point(path, 0, len(path), 100)
    assert cut.first_kept_index == 2  # budget spent at the custom message


def test_metadata_is_pulled_into_the_kept_region() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    s.model_change()
    s.thinking()
    s.user("c" * 400)
    s.assistant("d" * 400)
    path = s.path()
    cut = find_cut_point(path, 0, len(path), 200)
    assert cut.first_kept_index == 2  # the model change before the user message is kept


def test_metadata_pull_stops_at_a_compaction() -> None:
    s = SessionBuilder()
    u = s.user("a" * 400)
    s.assistant("b" * 400)
    s.compaction("sum", first_kept=u)
    s.model_change()
    s.user("c" * 400)
    path = s.path()
    cut = find_cut_point(path, 0, len(path), 100)
    assert cut.first_kept_index == 3


def test_turn_start_scan() -> None:
    s = SessionBuilder()
    s.user("u")
    s.assistant("a")
    s.bash("ls")
    s.assistant("b")
    path = s.path()
    assert find_turn_start_index(path, 3, 0) == 2
    assert find_turn_start_index(path, 1, 0) == 0
    assert find_turn_start_index(path, 1, 1) == -1


def test_cut_on_a_turn_start_other_than_user_is_not_split() -> None:
    s = SessionBuilder()
    s.user("a" * 400)
    s.assistant("b" * 400)
    s.bash("c" * 400)
    s.assistant("d" * 40)
    cut = find_cut_point(s.path(), 0, 4, 100)
    # pi would say "split" with an empty prefix; the executor treats both alike.
    assert cut == CutPoint(first_kept_index=2, turn_start_index=-1, is_split_turn=False)


def test_assistant_cut_without_turn_start_is_not_split() -> None:
    s = SessionBuilder()
    s.assistant("a" * 400)
    s.assistant("b" * 400)
    cut = find_cut_point(s.path(), 0, 2, 100)
    assert cut == CutPoint(first_kept_index=1, turn_start_index=-1, is_split_turn=False)
