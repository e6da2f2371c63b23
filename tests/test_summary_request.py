import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core.errors import ModelError
from orchestrator._core.model import ModelRequest
from orchestrator._core.prompts import render
from orchestrator._core.summary_request import (
    BRANCH_MAX_TOKENS,
    PromptBudget,
    branch_request,
    branch_summary_text,
    elide_oldest,
    elision_marker,
    fit_output_limit,
    history_max_tokens,
    history_request,
    merge_split_turn,
    short_max_tokens,
    short_summary_request,
    turn_prefix_max_tokens,
    turn_prefix_request,
    upsert_file_tags,
)

CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "stopReason": "stop"},
]
SERIALIZED = "<conversation>\n[User]: hello\n\n[Assistant]: hi\n</conversation>\n\n"


def test_output_budgets_follow_the_reference() -> None:
    assert history_max_tokens(16384) == 13107
    assert turn_prefix_max_tokens(16384) == 8192
    assert short_max_tokens(16384) == 512
    assert short_max_tokens(1000) == 200
    assert BRANCH_MAX_TOKENS == 2048


def test_initial_history_request() -> None:
    request = history_request(CONVERSATION, reserve_tokens=16384, reasoning="high")
    assert request.purpose == "history"
    assert request.system == render("summarizer_system")
    assert request.max_tokens == 13107
    assert request.reasoning == "high"
    assert request.messages == (
        {"role": "user", "content": SERIALIZED + render("compaction_summary")},
    )


def test_update_request_with_previous_summary_context_and_focus() -> None:
    request = history_request(
        CONVERSATION,
        reserve_tokens=1000,
        previous_summary="OLD",
        additional_context=["branch main", "dirty tree"],
        focus="the parser",
    )
    assert request.prompt == (
        SERIALIZED
        + "<previous-summary>\nOLD\n</previous-summary>\n\n"
        + "<additional-context>\n- branch main\n- dirty tree\n</additional-context>\n\n"
        + render("compaction_update")
        + "\n\nAdditional focus: the parser"
    )
    assert request.max_tokens == 800


def test_prompt_override_replaces_the_base_prompt_and_keeps_focus() -> None:
    request = history_request(
        CONVERSATION,
        reserve_tokens=1000,
        previous_summary="OLD",
        prompt_override="Do it my way.",
        focus="speed",
    )
    assert request.prompt.endswith(
        "</previous-summary>\n\nDo it my way.\n\nAdditional focus: speed"
    )
    assert render("compaction_update") not in request.prompt


def test_turn_prefix_request() -> None:
    request = turn_prefix_request(CONVERSATION, reserve_tokens=16384)
    assert request.purpose == "turn_prefix"
    assert request.max_tokens == 8192
    assert request.prompt == SERIALIZED + render("turn_prefix")


def test_short_summary_request_sends_the_new_summary_as_previous() -> None:
    request = short_summary_request(
        CONVERSATION, summary="NEW", reserve_tokens=16384, additional_context=["x"]
    )
    assert request.purpose == "short"
    assert request.max_tokens == 512
    assert request.prompt == (
        SERIALIZED
        + "<previous-summary>\nNEW\n</previous-summary>\n\n"
        + "<additional-context>\n- x\n</additional-context>\n\n"
        + render("short_summary")
    )


def test_branch_request_instructions() -> None:
    plain = branch_request(CONVERSATION)
    assert plain.purpose == "branch"
    assert plain.max_tokens == 2048
    assert plain.reasoning is None
    assert plain.prompt == SERIALIZED + render("branch_summary")
    focused = branch_request(CONVERSATION, instructions="files only")
    assert (
        focused.prompt == SERIALIZED + render("branch_summary") + "\n\nAdditional focus: files only"
    )
    replaced = branch_request(CONVERSATION, instructions="files only", replace=True)
    assert replaced.prompt == SERIALIZED + "files only"
    assert branch_request(CONVERSATION, replace=True).prompt == plain.prompt


def _long_conversation(count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message number {i} " + "x" * 80} for i in range(count)]


def _prompt_tokens(request: ModelRequest) -> int:
    return math.ceil((len(request.system) + len(request.prompt)) / 4)


def test_request_that_fits_is_not_elided() -> None:
    budget = PromptBudget(context_window=100_000)
    request = history_request(CONVERSATION, reserve_tokens=1000, budget=budget)
    assert request.prompt == SERIALIZED + render("compaction_summary")


def test_over_budget_elides_oldest_part_with_a_marker() -> None:
    messages = _long_conversation(200)
    whole = history_request(messages, reserve_tokens=2000)
    budget = PromptBudget(context_window=6000)
    request = history_request(messages, reserve_tokens=2000, previous_summary="KEEP", budget=budget)
    allowed = budget.prompt_tokens(request.max_tokens)
    assert request.max_tokens == 1500  # 80 % of the reserve, clamped to a quarter of the window
    assert allowed == 6000 - 1500
    assert _prompt_tokens(request) <= allowed
    assert _prompt_tokens(whole) > allowed
    body = request.prompt.split("<conversation>\n", 1)[1]
    marker = re.match(
        r"\[\.\.\. (\d+) earlier characters elided to fit the summarizer's "
        r"context window\]\n\n",
        body,
    )
    assert marker, body[:200]
    # The newest message and everything after the conversation survive whole.
    assert "message number 199 " in request.prompt
    assert "message number 0 " not in request.prompt
    assert "<previous-summary>\nKEEP\n</previous-summary>" in request.prompt
    assert request.prompt.endswith(render("compaction_update"))
    # The count is exact: kept text + elided characters = the whole serialized conversation.
    whole_body = whole.prompt.split("<conversation>\n", 1)[1].split("\n</conversation>")[0]
    kept = body[marker.end() :].split("\n</conversation>")[0]
    assert whole_body.endswith(kept)
    assert int(marker.group(1)) == len(whole_body) - len(kept)
    # The cut lands on a line start, not inside a message.
    assert kept.startswith("[User]: message number")


def test_halving_shrinks_the_prompt() -> None:
    messages = _long_conversation(400)
    budget = PromptBudget(context_window=20_000)
    sizes = []
    for _ in range(4):
        request = history_request(messages, reserve_tokens=2000, budget=budget)
        assert _prompt_tokens(request) <= budget.prompt_tokens(request.max_tokens)
        sizes.append(len(request.prompt))
        budget = budget.halve()
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(sizes)) == 4
    assert budget.halvings == 4
    assert PromptBudget(context_window=10_000).halve().prompt_tokens(2000) == 4000


def test_unknown_window_assumes_the_fallback() -> None:
    assert PromptBudget(context_window=0).prompt_tokens(1000) == 127_000


def test_elision_when_nothing_fits_keeps_only_the_marker() -> None:
    assert elide_oldest("abc" * 10, 5) == elision_marker(30)
    assert elide_oldest("", -5) == ""
    assert elide_oldest("short", 5) == "short"


@given(st.text(alphabet="ab\n", max_size=400), st.integers(min_value=0, max_value=500))
def test_elision_never_exceeds_room_unless_only_the_marker(text: str, room: int) -> None:
    out = elide_oldest(text, room)
    if len(text) <= room:
        assert out == text
    else:
        count = int(out.split(" ", 2)[1])
        kept = out.split("]\n\n", 1)[1] if "]\n\n" in out else ""
        assert text.endswith(kept)
        assert count == len(text) - len(kept)
        assert len(out) <= room or kept == ""


def test_file_tags_appended_after_a_blank_line() -> None:
    text = upsert_file_tags("Summary.\n\n", ["b.py", "a.py"], ["c.py"])
    assert text == (
        "Summary.\n\n<read-files>\nb.py\na.py\n</read-files>\n\n"
        "<modified-files>\nc.py\n</modified-files>"
    )


def test_file_tags_replace_old_ones() -> None:
    old = "S\n\n<read-files>\nold.py\n</read-files>\n\n<modified-files>\nx\n</modified-files>\n"
    assert upsert_file_tags(old, ["new.py"], []) == "S\n\n<read-files>\nnew.py\n</read-files>"
    assert upsert_file_tags(old, [], []) == "S"
    assert upsert_file_tags(upsert_file_tags("S", ["a"], ["b"]), ["a"], ["b"]) == upsert_file_tags(
        "S", ["a"], ["b"]
    )


def test_file_lists_are_capped_with_an_omitted_line() -> None:
    files = [f"f{i:02}.py" for i in range(25)]
    text = upsert_file_tags("S", files, files[:20])
    read_block = text.split("<read-files>\n")[1].split("\n</read-files>")[0].split("\n")
    assert read_block == files[:20] + ["… (5 more files omitted)"]
    modified = text.split("<modified-files>\n")[1].split("\n</modified-files>")[0].split("\n")
    assert modified == files[:20]


def test_branch_summary_text_has_preamble_blank_line_and_tags() -> None:
    text = branch_summary_text("## Goal\nG", ["r.py"], [])
    assert text == (
        render("branch_preamble") + "\n\n## Goal\nG\n\n<read-files>\nr.py\n</read-files>"
    )
    assert render("branch_preamble").endswith("Summary of that exploration:")


def test_split_turn_merge() -> None:
    assert merge_split_turn("H", "P") == "H\n\n---\n\n**Turn Context (split turn):**\n\nP"


@pytest.mark.parametrize("previous", [None, "P"])
def test_prompt_starts_with_the_conversation(previous: str | None) -> None:
    request = history_request([], reserve_tokens=100, previous_summary=previous)
    assert request.prompt.startswith("<conversation>\n\n</conversation>\n\n")


def test_a_small_window_clamps_the_output_budget_before_sizing_the_prompt() -> None:
    messages = _long_conversation(200)
    budget = PromptBudget(context_window=4000)
    request = history_request(messages, reserve_tokens=16384, budget=budget)
    # 80 % of the default reserve is 13107 tokens, more than the whole window: clamped.
    assert request.max_tokens == 1000
    assert _prompt_tokens(request) + request.max_tokens <= 4000
    body = request.prompt.split("<conversation>\n", 1)[1].split("\n</conversation>")[0]
    kept = body.split("]\n\n", 1)[1]  # after the elision marker
    assert kept.count("[User]: message number") >= 5  # a useful part of the conversation
    assert "message number 199 " in kept


def test_a_window_with_no_room_for_the_conversation_is_refused() -> None:
    messages = _long_conversation(200)
    with pytest.raises(ModelError, match=r"^Summarization refused: .* \(600 tokens\)") as caught:
        history_request(messages, reserve_tokens=16384, budget=PromptBudget(context_window=600))
    assert caught.value.kind == "fatal"
    assert "\n" not in str(caught.value)
    # A conversation that fits whole is still summarized, however small the room.
    tiny = history_request(
        CONVERSATION, reserve_tokens=16384, budget=PromptBudget(context_window=600)
    )
    assert "elided" not in tiny.prompt


def _reference_elided(text: str, length: int, keep: int) -> str:
    """The elision as it was written before it was found by index (issue 9), on the joined
    text: the tail of ``keep`` characters, moved to the next line start when one is within
    _SNAP_CHARS and the cut is mid-line, its leading newlines dropped, under the marker."""
    from orchestrator._core.summary_request import _SNAP_CHARS, elision_marker

    tail = text[-keep:] if keep > 0 else ""
    start = len(text) - len(tail)
    newline = tail.find("\n", 0, _SNAP_CHARS)
    if newline != -1 and text[start - 1] != "\n":
        tail = tail[newline + 1 :]
    tail = tail.lstrip("\n")
    marker = elision_marker(length - len(tail))
    return f"{marker}\n\n{tail}" if tail else marker


_PARAGRAPH = st.text(alphabet="ab\n", min_size=1, max_size=60) | st.builds(
    lambda n, k: "x" * n + "\n" * k, st.integers(0, 2500), st.integers(0, 3)
)


@given(st.lists(_PARAGRAPH, min_size=1, max_size=12), st.integers(-2, 6000), st.integers(0, 9))
def test_elision_found_by_index_is_the_elision_of_the_joined_text(
    pieces: list[str], keep: int, extra: int
) -> None:
    """ASCII paragraphs are elided by index in them, never joined (issue 9): the text that
    comes out is the one the joined text gives, wherever the cut lands (in a paragraph, in a
    separator, before a run of newlines, near the end), for every line-start search window."""
    from orchestrator._core.summary_request import _elided_ascii

    text = "\n\n".join(pieces)
    length = len(text) + extra
    assert "".join(_elided_ascii(pieces, length, keep)) == _reference_elided(text, length, keep)


def test_the_output_limit_is_fitted_after_the_input_as_pi_does() -> None:
    # pi 1.x (clampMaxTokensToContext): the 15 % margin while it leaves 32768 tokens or more,
    # else 4096 spare and at most 32768; never below 1.
    assert fit_output_limit(64_000, 200_000, 10_000) == 64_000
    assert fit_output_limit(200_000, 200_000, 100_000) == 200_000 - 100_000 - 15_000
    assert fit_output_limit(64_000, 200_000, 160_000) == 32_768  # near a full window
    assert fit_output_limit(64_000, 200_000, 170_000) == 200_000 - 170_000 - 4096
    assert fit_output_limit(64_000, 32_000, 10_000) == 32_000 - 10_000 - 4096
    assert fit_output_limit(64_000, 8_000, 7_000) == 1


def test_a_known_output_limit_replaces_the_reserve_share_when_it_is_larger() -> None:
    # pi 1.4 (#9512): a summary may use the summarizer's output limit; the reserve decides only
    # when to compact. Ours keeps the reserve's share as the least a summary is given.
    budget = PromptBudget(context_window=200_000, output_limit=64_000)
    request = history_request(CONVERSATION, reserve_tokens=16384, budget=budget)
    assert request.max_tokens == 64_000
    small = PromptBudget(context_window=200_000, output_limit=2_000)
    assert history_request(CONVERSATION, reserve_tokens=16384, budget=small).max_tokens == 2_000
    full = PromptBudget(context_window=20_000, output_limit=64_000)
    request = history_request(_long_conversation(2000), reserve_tokens=16384, budget=full)
    assert request.max_tokens == 5000  # the reserve's share, clamped to a quarter: still given
    assert _prompt_tokens(request) + request.max_tokens <= 20_000
    unknown = PromptBudget(context_window=200_000)
    assert history_request(CONVERSATION, reserve_tokens=16384, budget=unknown).max_tokens == 13107
