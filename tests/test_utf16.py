"""D26: lengths are UTF-16 code units, as pi's JavaScript ``length`` counts them.

Each test puts characters outside the Basic Multilingual Plane (two units each) where a length is
measured and checks the number JavaScript would give; counting code points, as Python's ``len``
does, gives a different one in every case.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator._core.branch_plan import prepare_branch_entries
from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction
from orchestrator._core.cut_point import find_cut_point
from orchestrator._core.serialize import serialize_conversation, truncate_for_summary
from orchestrator._core.summary_request import PromptBudget, elide_oldest, history_request
from orchestrator._core.tokens import CompactionSettings, estimate_tokens
from orchestrator._core.utf16 import escape_lone_surrogates, utf16_head, utf16_len, utf16_tail
from tests.sessions import SessionBuilder, usage

EMOJI = "\U0001f600"  # U+1F600, a surrogate pair in UTF-16
CJK = "\U0002000b"  # U+2000B, a rare CJK ideograph outside the BMP
THUMB = "\U0001f44d\U0001f3fd"  # a thumb with a skin tone: two astral code points, four units
LONE = "\ud83d"  # a lone high surrogate, as JSON can carry one


def _has_half_pair(text: str) -> bool:
    # A pair is one code point in a Python str, so any surrogate code point is a lone half.
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("", 0),
        ("plain ascii", 11),
        ("漢字 ü", 4),  # BMP characters are one unit, as in Python
        (EMOJI, 2),
        (CJK * 3, 6),
        (THUMB, 4),
        (f"a{LONE}b", 3),  # a lone surrogate is one unit
    ],
)
def test_d26_lengths_are_utf16_code_units(text: str, units: int) -> None:
    assert utf16_len(text) == units


def test_d26_estimates_count_an_astral_character_as_two() -> None:
    assert estimate_tokens({"role": "user", "content": EMOJI * 4}) == 2  # 8 units, not 4
    assert estimate_tokens({"role": "user", "content": [{"type": "text", "text": CJK * 6}]}) == 3
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": EMOJI * 2},
            {"type": "text", "text": EMOJI * 2},
            {"type": "toolCall", "id": "c", "name": "read", "arguments": {"path": EMOJI}},
        ],
    }
    # thinking 4 + text 4 + "read" 4 + '{"path":"😀"}' 13 units = 25 -> 7 tokens
    assert estimate_tokens(assistant) == math.ceil(25 / 4)
    bash = {"role": "bashExecution", "command": EMOJI, "output": EMOJI * 3}
    assert estimate_tokens(bash) == 2
    assert estimate_tokens({"role": "compactionSummary", "summary": THUMB * 3}) == 3
    assert estimate_tokens({"role": "branchSummary", "summary": THUMB * 3}) == 3
    result = {"role": "toolResult", "content": [{"type": "text", "text": EMOJI * 10}]}
    assert estimate_tokens(result) == 5


def test_d26_a_lone_surrogate_in_tool_arguments_counts_as_its_json_escape() -> None:
    # JSON.stringify writes a lone surrogate as \ud83d: six units where the text holds one.
    assert escape_lone_surrogates(f'"{LONE}{EMOJI}"') == f'"\\ud83d{EMOJI}"'
    call = {"type": "toolCall", "id": "c", "name": "w", "arguments": {"t": LONE}}
    message = {"role": "assistant", "content": [call]}
    assert estimate_tokens(message) == math.ceil((1 + len('{"t":"\\ud83d"}')) / 4)


def test_d26_context_total_and_tokens_before_count_units() -> None:
    s = SessionBuilder()
    s.user("a" * 40)
    s.assistant("b" * 40, usage=usage(1000))
    s.user(EMOJI * 200)  # 400 units: 100 tokens after the usage (50 counting code points)
    s.assistant("c" * 40)
    plan = plan_compaction(s.path(), CompactionSettings(keep_recent_tokens=1, adaptive_keep=False))
    assert isinstance(plan, CompactionPlan)
    assert plan.tokens_before == 1000 + 100 + 10


def test_d26_the_cut_point_follows_the_unit_count() -> None:
    # Newest first: 10 tokens, then the emoji message's 20 (80 units) spend the 30-token budget
    # on it. Counting code points it would weigh 10, and the cut would reach one message back.
    s = SessionBuilder()
    s.user("old " * 20)
    s.assistant("x" * 80)
    middle = s.user(EMOJI * 40)
    s.assistant("y" * 40)
    path = s.path()
    cut = find_cut_point(path, 0, len(path), keep_recent_tokens=30)
    assert path[cut.first_kept_index]["id"] == middle


def test_d26_branch_total_tokens_count_units() -> None:
    s = SessionBuilder()
    s.user(CJK * 8)  # 16 units: 4 tokens
    s.assistant(THUMB * 4)  # 16 units: 4 tokens
    s.branch_summary(EMOJI * 6)  # 12 units: 3 tokens
    plan = prepare_branch_entries(s.path())
    assert plan.total_tokens == 11
    # A budget counted in units: 7 tokens take only the newest message and the summary rule.
    assert prepare_branch_entries(s.path(), 7).total_tokens == 7


def test_d26_tool_results_are_cut_at_2000_units() -> None:
    text = "\U0001f680" * 1500  # 3000 units
    cut = truncate_for_summary(text)
    assert cut == "\U0001f680" * 1000 + "\n\n[... 1000 more characters truncated]"
    assert truncate_for_summary(EMOJI * 1000) == EMOJI * 1000  # exactly 2000 units: whole


def test_d26_a_cut_through_a_pair_moves_one_unit_earlier() -> None:
    text = "a" * 1999 + EMOJI + "b" * 10  # units 1999 and 2000 are the pair
    cut = truncate_for_summary(text)
    # pi 1.x (sliceHead) and we leave the whole pair out; the marker says length - 2000 ("11
    # more"), as pi's does, though 12 units were left out.
    assert cut == "a" * 1999 + "\n\n[... 11 more characters truncated]"
    assert not _has_half_pair(cut)
    serialized = serialize_conversation(
        [{"role": "toolResult", "content": [{"type": "text", "text": text}]}]
    )
    assert serialized == f"[Tool result]: {cut}"


def test_d26_head_and_tail_never_split_a_pair_at_any_position() -> None:
    text = f"a{EMOJI}b{CJK}{THUMB}漢{LONE} z{EMOJI}"
    total = utf16_len(text)
    for units in range(total + 2):
        head, tail = utf16_head(text, units), utf16_tail(text, units)
        for part in (head, tail):
            assert min(units, total) - 1 <= utf16_len(part) <= min(units, total)
            # The only half pair ever present is the one the text already had.
            assert [c for c in part if 0xD800 <= ord(c) <= 0xDFFF] in ([], [LONE])
        assert text.startswith(head)
        assert text.endswith(tail)


def test_d26_elision_budget_counts_units_and_keeps_whole_characters() -> None:
    serialized = "\n".join(f"[User]: {EMOJI * 30} line {i}" for i in range(200))
    room = 1500
    elided = elide_oldest(serialized, room)
    assert utf16_len(elided) <= room
    assert len(elided) < room  # counting code points would have let far more through
    assert not _has_half_pair(elided)
    marker = elided.split("\n\n", 1)[0]
    count = int(marker.split()[1])
    assert count == utf16_len(serialized) - utf16_len(elided.split("\n\n", 1)[1])


def test_d26_summary_requests_fit_a_window_counted_in_units() -> None:
    messages = [{"role": "user", "content": EMOJI * 3000} for _ in range(4)]  # 24 000 units
    request = history_request(
        messages, reserve_tokens=1000, budget=PromptBudget(context_window=4000)
    )
    prompt = request.messages[0]["content"]
    assert isinstance(prompt, str)
    # (4000 - 800 output tokens) * 4 = 12 800 units for the system prompt and the user message.
    assert utf16_len(request.system) + utf16_len(prompt) <= (4000 - 800) * 4
    assert not _has_half_pair(prompt)


@pytest.mark.parametrize("argv", [("context",), ("context", "--json"), ("tree",)])
def test_d26_the_cli_prints_a_session_holding_lone_surrogates(argv: tuple[str, ...]) -> None:
    # pi writes lone surrogates as \udXXX escapes; printing one raw to UTF-8 would fail.
    session = Path(__file__).parent / "data" / "pi" / "non-bmp.jsonl"
    command = [sys.executable, "-m", "orchestrator._cli.main", argv[0], str(session), *argv[1:]]
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(command, capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"\\ude00" in done.stdout
    if "--json" in argv:
        messages = json.loads(done.stdout)["messages"]
        assert any("\ude00" in str(m.get("content")) for m in messages)
