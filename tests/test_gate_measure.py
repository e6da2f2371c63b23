"""The gate's work per answer made cheaper (issue 37), judged against the code it replaced.

``replaced_measure``: the size and hash of what a summary replaces, as ``replaced_input`` says.

The fast path finds the previous summary's tags in one pass and hashes slices of the encoded
prompt; the reference slices the prompt and hashes the joined text. Both must agree on every
prompt, and most of all on the odd ones: tags quoted in the conversation, in either order, cut
in half, or overlapping the conversation's own tags, and text that is not ASCII.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchestrator._runtime.outcomes as outcomes
from orchestrator._core.gate import (
    _LINE_HEADING,
    Verdict,
    _norm,
    replaced_input,
    replaced_measure,
    text_hash,
)
from orchestrator._core.gate import _sections as gate_sections
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._core.summary_request import history_request
from orchestrator._runtime.operation.summarize import Part

TAGS = (
    "<conversation>\n",
    "\n</conversation>",
    "<previous-summary>\n",
    "\n</previous-summary>",
    "previous-summary>",
    "<previous-summary>",
    "\n</",
    "<",
    "\n",
)


def reference(prompt: str) -> tuple[int, str]:
    replaced = replaced_input(prompt)
    return len(replaced), text_hash(replaced)


pieces = st.one_of(
    st.sampled_from(TAGS),
    st.text(alphabet="ab <>/\n-", max_size=12),
    st.text(max_size=6),  # any code point, astral and lone surrogates included
)


@given(st.lists(pieces, max_size=14).map("".join))
def test_any_prompt_measures_as_the_reference(prompt: str) -> None:
    assert replaced_measure(prompt) == reference(prompt)


def test_a_real_request_with_a_previous_summary() -> None:
    messages = [{"role": "user", "content": "hello " * 50, "timestamp": 1}]
    request = history_request(messages, reserve_tokens=16_384, previous_summary="## Goal\nx")
    prompt = str(request.messages[-1]["content"])
    chars, digest = replaced_measure(prompt)
    assert (chars, digest) == reference(prompt)
    assert digest != text_hash("")  # the conversation and the previous summary were hashed
    assert chars == len(replaced_input(prompt)) > 300


def test_tags_quoted_in_the_conversation_count_as_the_reference_counts_them() -> None:
    quoted = "<conversation>\n[User]: see \n</previous-summary> then <previous-summary>\nq\n"
    prompt = quoted + "\n</conversation>\n\n<previous-summary>\nold\n</previous-summary>\n\n"
    assert replaced_measure(prompt) == reference(prompt)
    # The first closing tag comes before the first opening one: no previous summary counted.
    assert replaced_measure(prompt)[0] == len(quoted) - len("<conversation>\n")


def test_non_ascii_prompt_takes_the_plain_way() -> None:
    prompt = (
        "<conversation>\n[User]: café 𝄞\n</conversation>\n\n"
        "<previous-summary>\nü\n</previous-summary>"
    )
    assert replaced_measure(prompt) == reference(prompt)
    assert replaced_measure(prompt)[0] == len("[User]: café 𝄞") + 1


class Waits:
    """A route that passes ``checkpoints`` times through the loop, noting what was measured."""

    name = "waits/route"
    context_window = 100_000

    def __init__(self, checkpoints: int, measured: list[str]) -> None:
        self.checkpoints = checkpoints
        self.measured = measured
        self.measured_before_answer = -1

    async def complete(self, request: ModelRequest) -> ModelResponse:
        for _ in range(self.checkpoints):
            await anyio.sleep(0)
        self.measured_before_answer = len(self.measured)
        return ModelResponse(text="## Goal\nok", stop_reason="stop")


def prompt_part(prompt: str) -> Part:
    def build(budget: Any, texts: Any) -> ModelRequest:
        del budget, texts
        messages = ({"role": "user", "content": prompt},)
        return ModelRequest(purpose="history", system="s", messages=messages, max_tokens=10)

    return Part(purpose="history", routes=(), build=build)


@pytest.mark.anyio
@pytest.mark.parametrize("checkpoints", [0, 3])
async def test_the_input_is_measured_once_while_the_model_is_asked(
    monkeypatch: pytest.MonkeyPatch, checkpoints: int
) -> None:
    prompt = "<conversation>\n[User]: hi\n</conversation>\n\nSummarize."
    measured: list[str] = []

    def counting(text: str) -> tuple[int, str]:
        measured.append(text)
        return replaced_measure(text)

    monkeypatch.setattr(outcomes, "replaced_measure", counting)
    model = Waits(checkpoints, measured)
    attempt = await outcomes.attempt_summary(prompt_part(prompt), model, 0, {}, 30.0)
    for _ in range(3):  # the next pass's callback, for a model that answered without waiting
        await anyio.sleep(0)
    assert attempt.report.outcome == "ok"
    assert attempt.report.data["inputHash"] == text_hash("[User]: hi")
    assert attempt.gate is not None
    assert attempt.gate.input_chars == len("[User]: hi")
    assert measured == [prompt]  # made once, whichever came first
    # A model that waits gets the input measured meanwhile, not after its answer.
    assert model.measured_before_answer == (1 if checkpoints else 0)


def sections_before(body: str, headings: tuple[str, ...]) -> Verdict | None:
    """The sections check as it was before it skipped lines without a "#" (the reference)."""
    if not headings:
        return None
    found: list[tuple[str, int]] = []
    lines = body.splitlines()
    for index, line in enumerate(lines):
        match = _LINE_HEADING.match(line)
        if match:
            found.append((_norm(match.group(1)), index))
    wanted = [_norm(h) for h in headings]
    missing = [h for h, w in zip(headings, wanted, strict=True) if w not in dict(found)]
    if missing:
        return Verdict(check="sections", reason=f"sections missing: {', '.join(missing)}")
    empty: list[str] = []
    for position, (name, index) in enumerate(found):
        if name not in wanted:
            continue
        end = found[position + 1][1] if position + 1 < len(found) else len(lines)
        content = any(line.strip() for line in lines[index + 1 : end])
        nested = end < len(lines) and depth(lines[end]) > depth(lines[index])
        if not content and not nested:
            empty.append(headings[wanted.index(name)])
    if empty:
        return Verdict(check="sections", reason=f"sections empty: {', '.join(empty)}")
    return None


def depth(line: str) -> int:
    stripped = line.lstrip()
    return len(stripped) - len(stripped.lstrip("#")) if _LINE_HEADING.match(line) else 0


LAYOUT = ("Goal", "Progress", "Done", "Next Steps")
summary_lines = st.one_of(
    st.sampled_from(LAYOUT).flatmap(
        lambda h: st.sampled_from(("## ", "### ", "#", "   # ", "\t## ", "    ## ", "**", " ")).map(
            lambda mark: f"{mark}{h}{':' if len(h) % 2 else ''}"
        )
    ),
    st.sampled_from(("", "  ", "- item", "####### Goal", "#Goal", "text # Goal", "\u2003## Done")),
    st.text(alphabet="# \t:*Gmoal\u00a0", max_size=10),
)


@given(st.lists(summary_lines, max_size=16).map("\n".join), st.sampled_from([LAYOUT, LAYOUT[:2]]))
def test_the_sections_check_judges_as_before(body: str, headings: tuple[str, ...]) -> None:
    assert gate_sections(body, headings) == sections_before(body, headings)


def test_the_sections_check_finds_an_empty_section_and_a_nested_one() -> None:
    body = "## Goal\nship it\n## Progress\n### Done\n- a\n## Next Steps\n"
    assert gate_sections(body, LAYOUT) == Verdict(
        check="sections", reason="sections empty: Next Steps"
    )
    assert gate_sections(body.replace("\n### Done", "\n\n### Done"), LAYOUT[:2]) is None
