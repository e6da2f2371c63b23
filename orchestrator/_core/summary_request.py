"""Summary requests: what the summarizer is sent, and how its answer is finished.

Theory of operation. Each summary (history, turn prefix, short, branch) is one user message: the
serialized conversation in a ``<conversation>`` tag, optional context blocks, then the
instructions (as pi assembles them), under one system prompt. Output budgets are pi's.

The request must fit before it is sent (D14). Given a :class:`PromptBudget` (the summarizer's
context window), I first clamp the output budget to a quarter of the window: the budgets derive
from the compaction reserve, which knows nothing of the summarizer, and with the default reserve
a small summarizer (4000 tokens) would be asked for more output than its whole window, leaving
no room for the conversation at all. Then I estimate the prompt at chars/4, the same rule the
trigger uses; over budget,
the *oldest* part of the serialized conversation is replaced by a marker line that says how many
characters (UTF-16 units, D26) were left out. The instructions, the previous summary and the
newest messages are what the summary most depends on, so they are kept whole. If the summarizer
still reports an overflow (the estimate is only an estimate), the caller retries with
:meth:`PromptBudget.halve`, at most :data:`MAX_HALVINGS` times; it keeps that count, because it
owns the retry loop. When the window is so small that the instructions leave less than
:data:`MIN_CONVERSATION_TOKENS` for a conversation that does not fit whole, I refuse with a
:class:`FatalModelError` instead of sending a request that could only summarize an elision marker.

The finishing helpers put file lists on summaries (D16) and merge a split turn (pi's layout).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator._core.entries import Message
from orchestrator._core.errors import FatalModelError
from orchestrator._core.measured_messages import MeasuredMessages
from orchestrator._core.model import ModelRequest, Purpose
from orchestrator._core.prompts import render
from orchestrator._core.serialize import PARAGRAPH_SEPARATOR, serialize_conversation
from orchestrator._core.utf16 import utf16_len, utf16_tail

BRANCH_MAX_TOKENS = 2048
"""Output budget of a branch summary."""

FALLBACK_CONTEXT_WINDOW = 128_000
"""The window assumed for a summarizer that does not say (pi's fallback)."""


def no_room_for_branch(window: int, reserve_tokens: int) -> str:
    """Why a branch summary is refused when the reserve takes the summarizer's whole window.

    It names the settings a user changes: pi's ``branchSummary.reserveTokens`` (its settings
    files, which the command line and a pi extension read), ``navigate --reserve-tokens``, or
    ``branch_reserve_tokens`` of ``RuntimeSettings`` (the Python API). It named only the last.
    """
    return (
        f"Summarization refused: the summarizer's context window ({window} tokens) leaves no "
        f"room for the branch after the {reserve_tokens} tokens kept free "
        "(pi's setting branchSummary.reserveTokens, navigate --reserve-tokens, or "
        "RuntimeSettings.branch_reserve_tokens); use a summarizer with a larger window or keep "
        "fewer tokens free"
    )


MAX_HALVINGS = 3
"""How many times a caller may halve the budget after the summarizer reports an overflow."""

FILE_LIST_LIMIT = 20
"""At most this many paths per file list in a summary's text; ``details`` keeps them all."""

SPLIT_TURN_SEPARATOR = "\n\n---\n\n**Turn Context (split turn):**\n\n"

OUTPUT_SHARE = 4
"""With a budget, the output budget is at most ``window // OUTPUT_SHARE`` tokens."""

MIN_CONVERSATION_TOKENS = 256
"""Below this much room for the conversation (when it does not fit whole) a request is refused."""

CONTEXT_SAFETY_TOKENS = 4096
"""pi 1.x: tokens always left between the estimated input plus output and the window."""
CONTEXT_SAFETY_RATIO = 0.15
"""pi 1.x: share of the estimated input also left spare (providers count input higher)."""
MIN_OUTPUT_WITH_RATIO_MARGIN = 32768
"""pi 1.x: below this much output, only the fixed margin is kept and output is capped here."""


def fit_output_limit(output_limit: int, window: int, input_tokens: int) -> int:
    """The model's output limit fitted into the window after the input (pi 1.x's rule).

    pi 1.4 asks for the summarizer's own output limit rather than a share of the compaction
    reserve (a long reasoning no longer hits a fixed cap); it leaves room for the input being
    counted higher than estimated: ``max(4096, 15 %)`` of it, or near a full window 4096 and at
    most 32768 output tokens.
    """
    margin = max(CONTEXT_SAFETY_TOKENS, math.ceil(input_tokens * CONTEXT_SAFETY_RATIO))
    room = window - input_tokens - margin
    if room < MIN_OUTPUT_WITH_RATIO_MARGIN:
        room = min(MIN_OUTPUT_WITH_RATIO_MARGIN, window - input_tokens - CONTEXT_SAFETY_TOKENS)
    return min(output_limit, max(1, room))


_SNAP_CHARS = 2000  # how far past the cut I look for a line start, so no line is half kept


def history_max_tokens(reserve_tokens: int) -> int:
    """Output budget of a history summary: ``floor(0.8 * reserve)``."""
    return reserve_tokens * 8 // 10


def turn_prefix_max_tokens(reserve_tokens: int) -> int:
    """Output budget of a turn-prefix summary: ``floor(0.5 * reserve)``."""
    return reserve_tokens // 2


def short_max_tokens(reserve_tokens: int) -> int:
    """Output budget of a short summary: ``min(512, floor(0.2 * reserve))``."""
    return min(512, reserve_tokens * 2 // 10)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptBudget:
    """How much prompt a summarizer can take (D14).

    Attributes:
        context_window: The summarizer's window in tokens (0 or less: unknown, 128000 assumed).
        halvings: How many times the prompt allowance was halved after an overflow.
        output_limit: The summarizer's own output limit in tokens (0: unknown). When known,
            a summary may use it, fitted after the input (:func:`fit_output_limit`), as pi
            1.x's do; the reserve's share (within the limit) stays the least it is given.
    """

    context_window: int
    halvings: int = 0
    output_limit: int = 0

    @property
    def window(self) -> int:
        """The window in tokens (the fallback when unknown)."""
        return self.context_window if self.context_window > 0 else FALLBACK_CONTEXT_WINDOW

    def output_tokens(self, max_tokens: int) -> int:
        """``max_tokens`` clamped to a share of the window (at most ``window // OUTPUT_SHARE``)."""
        return max(1, min(max_tokens, self.window // OUTPUT_SHARE))

    def prompt_tokens(self, max_tokens: int) -> int:
        """Tokens the prompt may use: window - clamped output, halved ``halvings`` times."""
        return max(0, self.window - self.output_tokens(max_tokens)) >> self.halvings

    def halve(self) -> PromptBudget:
        """The same budget with half the prompt allowance."""
        return dataclasses.replace(self, halvings=self.halvings + 1)


def elision_marker(count: int) -> str:
    """The line that replaces ``count`` elided characters of the conversation."""
    return f"[... {count} earlier characters elided to fit the summarizer's context window]"


def elide_oldest(serialized: str, room: int) -> str:
    """Elide the oldest part of ``serialized`` so that at most ``room`` characters remain.

    Characters are UTF-16 code units, as the estimates count them (D26); the cut never splits a
    surrogate pair. The newest part is kept under a marker line (D14); a cut that lands inside a
    line moves to the next line start when one is near. When even the marker does not fit, the
    bare marker is returned.
    """
    return _elide(MeasuredMessages(), serialized, utf16_len(serialized), room)


def _elide(messages: MeasuredMessages, whole: str | None, length: int, room: int) -> str:
    """:func:`elide_oldest` of a conversation ``length`` units long.

    The conversation is ``whole``, or, when that is ``None``, made from ``messages`` newest
    first: only the part that is kept and the message before it are serialized.
    """
    return "".join(_elided(messages, whole, length, room))


def _elided(messages: MeasuredMessages, whole: str | None, length: int, room: int) -> list[str]:
    """:func:`_elide`'s text as strings to join, so that a prompt copies it once."""
    if not length:
        return []
    if length <= room:
        if whole is not None:
            return [whole]
        made = messages.fragments_from(0)
        return made[0] if made is not None else [messages.text()]
    keep = max(0, room - utf16_len(elision_marker(length)) - 2)
    if whole is None:
        first = messages.first_needed(keep + 1)
        made = messages.fragments_from(first)
        if made is not None and made[1]:
            cut = _elided_fragments(made[0], messages.units_from(first), length, keep)
            if cut is not None:
                return cut
        # A suffix one unit longer than what is kept holds the tail and the character before it.
        pieces = messages.suffix_pieces(keep + 1)
        if all(map(str.isascii, pieces)):
            return _elided_ascii(pieces, length, keep)
        whole = PARAGRAPH_SEPARATOR.join(pieces)
    tail = utf16_tail(whole, keep)
    start = len(whole) - len(tail)
    newline = tail.find("\n", 0, _SNAP_CHARS)
    if newline != -1 and whole[start - 1] != "\n":
        tail = tail[newline + 1 :]
    tail = tail.lstrip("\n")  # the marker already ends with a blank line
    marker = elision_marker(length - utf16_len(tail))
    return [marker, "\n\n", tail] if tail else [marker]


def _elided_fragments(fragments: list[str], total: int, length: int, keep: int) -> list[str] | None:
    """:func:`_elided` of the ASCII text ``"".join(fragments)``, ``total`` characters long.

    The newest part of a conversation as :meth:`MeasuredMessages.fragments_from` wrote it, cut
    where :func:`_elided_ascii` cuts the paragraphs: only the fragments around the cut are
    joined here, and the prompt copies the rest once. ``None`` in the one case read no further
    than that (a run of blank lines reaching past them): :func:`_elided_ascii` then cuts.
    """
    start = total - min(keep, total) if keep > 0 else total
    if start >= total:
        return [elision_marker(length)]
    covered, count, need = 0, 0, start + _SNAP_CHARS + 1
    while count < len(fragments) and covered < need:
        covered += len(fragments[count])
        count += 1
    head = "".join(fragments[:count])
    newline = head.find("\n", start, start + _SNAP_CHARS)
    before = head[start - 1] if start else fragments[-1][-1]
    if newline != -1 and before != "\n":
        start = newline + 1
    while start < len(head) and head[start] == "\n":  # the marker already ends with a blank line
        start += 1
    if start == len(head) and count < len(fragments):
        return None
    marker = elision_marker(length - (total - start))
    return [marker, "\n\n", head[start:], *fragments[count:]] if start < total else [marker]


def _elided_ascii(pieces: list[str], length: int, keep: int) -> list[str]:
    """:func:`_elided` of the paragraphs ``pieces`` (ASCII: a character is a unit), by index.

    The cut is found in the paragraphs rather than in their joined text. That text is 0.75 MB
    at 10k entries, and each copy of it is fresh memory the kernel faults
    in page by page, at microseconds a page on a virtual machine (issue 9). Only the paragraph
    the cut lands in is copied here; the prompt copies the rest once.
    """
    text = _Joined(pieces)
    total = text.size
    start = total - min(keep, total) if keep > 0 else total
    newline = text.find_newline(start, start + _SNAP_CHARS)
    if newline != -1 and text.char(start - 1) != "\n":
        start = newline + 1
    while start < total and text.char(start) == "\n":  # the marker already ends with a blank line
        start += 1
    marker = elision_marker(length - (total - start))
    return [marker, "\n\n", *text.from_index(start)] if start < total else [marker]


class _Joined:
    """``PARAGRAPH_SEPARATOR.join(pieces)``, read by index without being joined."""

    def __init__(self, pieces: list[str]) -> None:
        # The separators go in by slice assignment, not a loop: a request at 10k entries joins
        # about 2,300 paragraphs, and a Python-level loop over them cost a tenth of it.
        self.parts: list[str] = [PARAGRAPH_SEPARATOR] * max(0, 2 * len(pieces) - 1)
        self.parts[::2] = pieces
        self.starts = list(itertools.accumulate(map(len, self.parts), initial=0))
        self.size = self.starts.pop()

    def _part(self, index: int) -> int:
        return bisect.bisect_right(self.starts, index) - 1

    def char(self, index: int) -> str:
        """The character at ``index`` (negative counts from the end, as a str's does)."""
        if index < 0:
            index += self.size
        part = self._part(index)
        return self.parts[part][index - self.starts[part]]

    def find_newline(self, begin: int, end: int) -> int:
        """Where ``text.find(NEWLINE, begin, end)`` finds one, or -1."""
        end = min(end, self.size)
        part = self._part(begin) if begin < self.size else len(self.parts)
        while part < len(self.parts) and self.starts[part] < end:
            offset = self.starts[part]
            found = self.parts[part].find("\n", max(0, begin - offset), end - offset)
            if found != -1:
                return offset + found
            part += 1
        return -1

    def from_index(self, index: int) -> list[str]:
        """``text[index:]`` as strings to join; only the first is a copy."""
        part = self._part(index)
        return [self.parts[part][index - self.starts[part] :], *self.parts[part + 1 :]]


def _request(
    purpose: Purpose,
    messages: Sequence[Message],
    after: str,
    *,
    max_tokens: int,
    budget: PromptBudget | None,
    reasoning: str | None,
) -> ModelRequest:
    system = render("summarizer_system")
    if budget is None:
        conversation = [serialize_conversation(messages)]
    else:
        # Messages a context measured are serialized newest first, only as far as they fit.
        if isinstance(messages, MeasuredMessages) and messages.sums is not None:
            run, whole, length = messages, None, messages.units()
        else:
            run, whole = MeasuredMessages(), serialize_conversation(messages)
            length = utf16_len(whole)
        frame = utf16_len(system) + len("<conversation>\n\n</conversation>\n\n") + utf16_len(after)
        room = budget.prompt_tokens(max_tokens) * 4 - frame
        max_tokens = budget.output_tokens(max_tokens)
        if length > room and room < MIN_CONVERSATION_TOKENS * 4:
            raise FatalModelError(
                f"Summarization refused: the summarizer's context window ({budget.window} "
                f"tokens) leaves {max(0, room) // 4} tokens for the conversation after the "
                f"instructions (~{math.ceil(frame / 4)} tokens) and a {max_tokens}-token "
                f"summary; use a summarizer with a larger window"
            )
        conversation = _elided(run, whole, length, room)
    prompt = "".join(["<conversation>\n", *conversation, "\n</conversation>\n\n", after])
    if budget is not None and budget.output_limit > 0:
        estimate = math.ceil((utf16_len(system) + utf16_len(prompt)) / 4)
        fitted = fit_output_limit(budget.output_limit, budget.window, estimate)
        max_tokens = max(fitted, min(max_tokens, budget.output_limit))  # never over the limit
    return ModelRequest(
        purpose=purpose,
        system=system,
        messages=({"role": "user", "content": prompt},),
        max_tokens=max_tokens,
        reasoning=reasoning,
    )


def _context_blocks(previous_summary: str | None, additional_context: Sequence[str]) -> str:
    text = ""
    if previous_summary:
        text += f"<previous-summary>\n{previous_summary}\n</previous-summary>\n\n"
    if additional_context:
        lines = "\n".join(f"- {line}" for line in additional_context)
        text += f"<additional-context>\n{lines}\n</additional-context>\n\n"
    return text


def _with_focus(prompt: str, focus: str | None) -> str:
    return f"{prompt}\n\nAdditional focus: {focus}" if focus else prompt


def history_request(
    messages: Sequence[Message],
    *,
    reserve_tokens: int,
    previous_summary: str | None = None,
    additional_context: Sequence[str] = (),
    prompt_override: str | None = None,
    focus: str | None = None,
    budget: PromptBudget | None = None,
    reasoning: str | None = None,
) -> ModelRequest:
    """The history summary request (pi's prompt layout).

    Args:
        messages: Context messages to summarize, oldest first.
        reserve_tokens: The compaction reserve; the output budget is 80 % of it.
        previous_summary: The last compaction's summary; selects the update prompt.
        additional_context: Lines a hook added (``<additional-context>``).
        prompt_override: A hook's prompt, replacing the initial or update prompt.
        focus: The user's instructions, appended as ``Additional focus:``.
        budget: The summarizer's budget; ``None`` sends the conversation whole.
        reasoning: Reasoning effort to ask for, if the route supports it.

    Returns:
        The request.
    """
    prompt = prompt_override or render(
        "compaction_update" if previous_summary else "compaction_summary"
    )
    after = _context_blocks(previous_summary, additional_context) + _with_focus(prompt, focus)
    return _request(
        "history",
        messages,
        after,
        max_tokens=history_max_tokens(reserve_tokens),
        budget=budget,
        reasoning=reasoning,
    )


def turn_prefix_request(
    messages: Sequence[Message],
    *,
    reserve_tokens: int,
    budget: PromptBudget | None = None,
    reasoning: str | None = None,
) -> ModelRequest:
    """The request summarizing the first part of a split turn (no previous summary, no focus)."""
    return _request(
        "turn_prefix",
        messages,
        render("turn_prefix"),
        max_tokens=turn_prefix_max_tokens(reserve_tokens),
        budget=budget,
        reasoning=reasoning,
    )


def short_summary_request(
    messages: Sequence[Message],
    *,
    summary: str,
    reserve_tokens: int,
    additional_context: Sequence[str] = (),
    budget: PromptBudget | None = None,
    reasoning: str | None = None,
) -> ModelRequest:
    """The short (two or three sentence) summary over the kept messages (oh-my-pi's short summary).

    Args:
        messages: The messages the compaction keeps.
        summary: The new history summary, before file lists, sent as ``<previous-summary>``.
        reserve_tokens: The compaction reserve.
        additional_context: Lines a hook added.
        budget: The summarizer's budget.
        reasoning: Reasoning effort to ask for.

    Returns:
        The request.
    """
    after = _context_blocks(summary, additional_context) + render("short_summary")
    return _request(
        "short",
        messages,
        after,
        max_tokens=short_max_tokens(reserve_tokens),
        budget=budget,
        reasoning=reasoning,
    )


def branch_request(
    messages: Sequence[Message],
    *,
    instructions: str | None = None,
    replace: bool = False,
    budget: PromptBudget | None = None,
) -> ModelRequest:
    """The branch summary request (pi's generateBranchSummary).

    Args:
        messages: The abandoned branch's messages, oldest first.
        instructions: The user's instructions: appended as ``Additional focus:``, or used
            instead of the default prompt when ``replace`` is true.
        replace: Whether ``instructions`` replace the default prompt.
        budget: The summarizer's budget.

    Returns:
        The request.
    """
    if replace and instructions:
        prompt = instructions
    else:
        prompt = _with_focus(render("branch_summary"), instructions)
    return _request(
        "branch", messages, prompt, max_tokens=BRANCH_MAX_TOKENS, budget=budget, reasoning=None
    )


_FILE_TAGS = re.compile(r"<(read-files|modified-files)>.*?</\1>\s*", re.DOTALL)


def _file_block(tag: str, files: Sequence[str]) -> str:
    lines = list(files[:FILE_LIST_LIMIT])
    if len(files) > FILE_LIST_LIMIT:
        lines.append(f"… ({len(files) - FILE_LIST_LIMIT} more files omitted)")
    return f"<{tag}>\n" + "\n".join(lines) + f"\n</{tag}>"


def upsert_file_tags(text: str, read_files: Sequence[str], modified_files: Sequence[str]) -> str:
    """Replace a summary's file lists with fresh ones (D16).

    Existing ``<read-files>`` / ``<modified-files>`` blocks are removed, the text is trimmed at
    the end, and the new blocks follow after a blank line, separated by a blank line. Each list
    shows at most :data:`FILE_LIST_LIMIT` paths, then a line saying how many were left out.

    Returns:
        The text with its file lists; unchanged but trimmed when both lists are empty.
    """
    body = _FILE_TAGS.sub("", text).rstrip()
    lists = (("read-files", read_files), ("modified-files", modified_files))
    blocks = [_file_block(tag, files) for tag, files in lists if files]
    return "\n\n".join([body, *blocks] if body else blocks)


def branch_summary_text(text: str, read_files: Sequence[str], modified_files: Sequence[str]) -> str:
    """The stored branch summary: preamble, blank line, the model's text, file lists (D16)."""
    return upsert_file_tags(f"{render('branch_preamble')}\n\n{text}", read_files, modified_files)


def merge_split_turn(history: str, turn_prefix: str) -> str:
    """Join a history summary and a turn-prefix summary (pi's layout)."""
    return f"{history}{SPLIT_TURN_SEPARATOR}{turn_prefix}"
