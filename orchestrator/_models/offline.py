"""The built-in offline summarizer: deterministic, extractive, no model called.

Theory of operation. A fresh machine with no key must still be able to compact, so this route
answers summary requests by reading them, not by generating text. It reads the request's
``<conversation>`` (:mod:`orchestrator._models.offline_evidence`), its optional
``<previous-summary>``, summaries embedded in the conversation
(:mod:`orchestrator._models.offline_summary`) and any ``<additional-context>``, and lays out what
it recognised in the sections the prompts ask a model for, so everything downstream (file tags,
split-turn merges, later updates) works the same.

It never invents: every item is a quotation or a count, and the first line says the summary is
extractive (except the one-line short summary, :mod:`orchestrator._models.offline_short`).
Updating is where an extractive summary usually goes wrong, so the rules are explicit:

* Goal is the session's goal (the previous summary's, else the first request) plus at most one
  ``Latest request`` line; an abandoned branch's goal goes to Critical Context instead.
* An In Progress item moves to Done only on evidence: it names a file that was then changed and
  a test run passed after that change, or its words are nearly all in a new Done item.
* A Blocked item goes once the same call (or, for a failed test run, any test run) succeeded
  later. An open question goes once assistant text follows it.
* Next Steps is rewritten every time, because a stale next step is worse than none.
* Every section keeps at most a fixed number of items (the newest, or for constraints the first
  and the last ones), and says how many it left out, so repeated compactions cannot make the
  summary grow without bound. Output is also trimmed to the request's output budget, so it never
  ends with stop reason ``length``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import anyio

from orchestrator._core.errors import FatalModelError
from orchestrator._core.model import ModelRequest, ModelResponse, Usage
from orchestrator._core.prompts import render
from orchestrator._core.utf16 import utf16_head, utf16_len
from orchestrator._models.offline_evidence import (
    Call,
    Evidence,
    block,
    gist,
    read_conversation,
    short,
)
from orchestrator._models.offline_focus import FOCUS, ON_FOCUS, focus_lines
from orchestrator._models.offline_short import short_summary
from orchestrator._models.offline_summary import (
    ASKED,
    FILES_MODIFIED,
    FILES_READ,
    LATEST,
    NOTE,
    STILL_OPEN,
    UNANSWERED,
    Parsed,
    branch_lesson,
    parse_summary,
)

__all__ = ("NOTE", "OfflineSummarizer", "summarize")

_SECTION_ORDER = (
    "Goal",
    "Constraints & Preferences",
    "Done",
    "In Progress",
    "Blocked",
    "Key Decisions",
    "Next Steps",
    "Critical Context",
)
# How many items each section keeps across updates. Together with the item length (at most 300
# characters, 400 for a branch line) they bound the summary: about 60 items at the very worst,
# and far fewer in practice because most items are short call descriptions.
_KEEP = {
    "Goal": 4,
    "Constraints & Preferences": 16,
    "Done": 15,
    "In Progress": 8,
    "Blocked": 6,
    "Key Decisions": 8,
    "Critical Context": 14,
    "Open questions": 4,  # pending questions, kept after the rest of Critical Context
}
_KEEP_ENDS = {"Constraints & Preferences"}  # the first rules are as binding as the last
_KEEP_FIRST = {"Goal", "Next Steps"}
_FILES_SHOWN = 20
_GOAL_CHARS = 600  # a request is the goal whole, up to a pasted log's worth
_PENDING = (UNANSWERED, STILL_OPEN)
_FILES = (FILES_READ, FILES_MODIFIED)
_HEAD = (*_FILES, FOCUS, ON_FOCUS)
_COMMAND = re.compile(r"^Ran `[^`]*`")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[\w./-]+", text.lower()) if len(w) > 2}


def _mentions(item: str, path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    whole_name = re.search(rf"(?<![\w/.-]){re.escape(name)}\b", item) is not None
    return path in item or ("." in name and whole_name)


def _passing_runs(facts: Evidence) -> list[int]:
    return [c.seq for c in facts.calls if c.is_test_run() and c.settled() and not c.failed()]


def _completed(item: str, facts: Evidence, done: list[str]) -> bool:
    passes = _passing_runs(facts)
    for call in facts.calls:
        changed = call.name in ("write", "edit") and call.settled() and not call.failed()
        if changed and call.path and _mentions(item, call.path):
            if any(seq > call.seq for seq in passes):
                return True
    words = _words(item)
    return len(words) >= 3 and any(len(words & _words(d)) >= 0.8 * len(words) for d in done)


def _resolved(item: str, calls: list[Call]) -> bool:
    good = [c for c in calls if c.settled() and not c.failed()]
    if any(c.is_test_run() for c in good) and re.search(r"pytest|\btests?\b", item, re.IGNORECASE):
        return True
    return any((c.command or c.describe()) in item for c in good)


def _newest_last(items: list[str]) -> list[str]:
    # Work done again moves to the end, and the same command run again replaces its older line:
    # the latest outcome is what counts, and the newest items are the ones a cap keeps.
    seen: set[str] = set()
    kept = []
    for item in reversed(items):
        command = _COMMAND.match(item)
        key = command.group(0) if command else item
        if key not in seen:
            kept.append(item)
            seen.add(key)
    return kept[::-1]


def _files_line(label: str, paths: set[str]) -> list[str]:
    if not paths:
        return []
    shown = sorted(paths)[:_FILES_SHOWN]
    more = f" (+{len(paths) - _FILES_SHOWN} more)" if len(paths) > _FILES_SHOWN else ""
    return [label + ", ".join(f"`{p}`" for p in shown) + more]


def _goal(facts: Evidence, previous: Parsed) -> list[str]:
    base = [g for g in previous.items("Goal") if not g.startswith(LATEST)]
    later = [*previous.items("Original Request"), *(r.text for r in facts.requests)]
    if not base and later:
        # The goal is the first request whole: its rules are also listed under Constraints,
        # but a goal cut down to the sentences without rules loses what was asked.
        base, later = [gist(later[0], _GOAL_CHARS)], later[1:]
    latest = [LATEST + gist(later[-1])] if later else []
    latest = latest or [g for g in previous.items("Goal") if g.startswith(LATEST)][-1:]
    return [*base, *latest]


def _progress(facts: Evidence, previous: Parsed) -> dict[str, list[str]]:
    calls = [c for c in facts.calls if c.settled()]
    done = [c.outcome() for c in calls if not c.failed() and c.name != "read"]
    blocked = [
        c.failure()
        for c in calls
        if c.failed() and not _resolved(c.describe(), [d for d in calls if d.seq > c.seq])
    ]
    answered = {short(q) for q in _pending(facts, previous)[1]}
    still_open = [
        item
        for item in previous.items("In Progress")
        if item not in answered and not _completed(item, facts, done)
    ]
    finished = [i for i in previous.items("In Progress") if i not in still_open + list(answered)]
    all_done = _newest_last([*previous.items("Done"), *finished, *done])
    opened = [short(q) for q in [*facts.passed_over(), facts.last_open()] if q]
    in_progress = [i for i in dict.fromkeys([*still_open, *opened]) if i not in all_done]
    old_blocked = [b for b in previous.items("Blocked") if not _resolved(b, facts.calls)]
    return {
        "Done": all_done,
        "In Progress": in_progress,
        "Blocked": list(dict.fromkeys([*old_blocked, *blocked])),
    }


def _pending(facts: Evidence, previous: Parsed) -> tuple[list[str], set[str]]:
    """Open questions to carry (newest last), and the earlier ones the new messages settled.

    The previous summary's last request is answered when the new messages start with assistant
    text; when they start with another request instead, it was passed over: a question stays
    open, an instruction was taken up by what followed.
    """
    carried, settled = [], set()
    for item in previous.items("Critical Context"):
        text = item.removeprefix(UNANSWERED)
        if item.startswith(STILL_OPEN):
            carried.append(item)
        elif text == item:
            continue
        elif facts.answers_earlier or (facts.requests and "?" not in text):
            settled.add(text)
        else:
            carried.append((STILL_OPEN if facts.requests else UNANSWERED) + text)
    carried += [STILL_OPEN + q for q in facts.passed_over()]
    last = facts.last_open()
    carried += [UNANSWERED + last] if last else []
    return list(dict.fromkeys(carried)), settled


def _critical(
    facts: Evidence, previous: Parsed, extra: list[str], focus: list[str]
) -> tuple[list[str], int]:
    read, modified = facts.files()
    changed = previous.modified | set(modified)
    files = _files_line(FILES_READ, (previous.read | set(read)) - changed)
    files += _files_line(FILES_MODIFIED, changed)
    kept = [i for i in previous.items("Critical Context") if not i.startswith(_PENDING)]
    new = [f"Error seen: {line}" for line in facts.errors]
    new += [f"Reference: {line}" for line in facts.references]
    new += [f"{ASKED}{short(q, 160)} Answer: {short(a, 200)}" for q, a in facts.answered()]
    rest = list(dict.fromkeys([*kept, *new, *extra]))
    pending = _pending(facts, previous)[0]
    cap, open_cap = _KEEP["Critical Context"], _KEEP["Open questions"]
    dropped = len(rest[:-cap]) + len(pending[:-open_cap])
    return [*files, *focus, *rest[-cap:], *pending[-open_cap:]], dropped


def _next_steps(
    facts: Evidence, previous: Parsed, sections: dict[str, list[str]], branch: bool
) -> list[str]:
    questions = [q.partition("(verbatim): ")[2] for q in _pending(facts, previous)[0]]
    steps = [f"Answer the user's pending message: {gist(q)}" for q in questions[-1:]]
    opened = {short(q) for q in questions}
    steps += [f"Continue: {i}" for i in sections["In Progress"] if i not in opened][:3]
    steps += [f"Resolve: {i}" for i in sections["Blocked"]][-2:]
    # A branch was left for another one: where it ended is history, not the next message.
    stopped = "The branch ended at" if branch else "Work stopped at"
    if not steps and facts.last != "call":
        steps.append(
            "Nothing on this branch was left open"
            if branch
            else "Carry on from the most recent messages: nothing summarized here is open"
        )
    if facts.last == "request" and facts.last_open():
        steps.append(f"{stopped} the user's last message, which has no reply yet")
    elif facts.last == "reply":
        steps.append(f"{stopped} the assistant's reply: " + short(facts.replies[-1], 160))
    elif facts.last == "call":
        outcome = ", whose outcome is not in the branch" if branch else ""
        steps.append(f"{stopped} the tool call {facts.calls[-1].describe()}{outcome}")
    return steps


def _sections(
    facts: Evidence, previous: Parsed, extra: list[str], focus: list[str], branch: bool
) -> tuple[dict[str, list[str]], dict[str, int]]:
    rules = [*previous.items("Constraints & Preferences"), *facts.rules]
    decisions = [*previous.items("Key Decisions"), *facts.decisions]
    sections = {
        "Goal": _goal(facts, previous),
        "Constraints & Preferences": list(dict.fromkeys(rules)),
        **_progress(facts, previous),
        "Key Decisions": list(dict.fromkeys(decisions)),
    }
    omitted = dict(previous.omitted)
    for name, items in list(sections.items()):
        sections[name], dropped = _trim(name, items, _KEEP[name])
        omitted[name] = omitted.get(name, 0) + dropped
    sections["Critical Context"], dropped = _critical(facts, previous, extra, focus)
    omitted["Critical Context"] = omitted.get("Critical Context", 0) + dropped
    sections["Next Steps"] = _next_steps(facts, previous, sections, branch)
    extras = {k: v for k, v in previous.sections.items() if k not in sections}
    extras.pop("Original Request", None)  # folded into Goal
    return {**sections, **extras}, omitted


def _trim(name: str, items: list[str], cap: int) -> tuple[list[str], int]:
    if len(items) <= cap:
        return items, 0
    if name in _KEEP_ENDS:
        return [*items[: cap - cap // 2], *items[-(cap // 2) :]], len(items) - cap
    return (items[:cap] if name in _KEEP_FIRST else items[-cap:]), len(items) - cap


def _marked(name: str, items: list[str], omitted: int) -> list[str]:
    if not omitted:
        return items
    marker = f"… ({omitted} more items omitted)"
    if name in _KEEP_ENDS:
        half = len(items) - len(items) // 2
        return [*items[:half], marker, *items[half:]]
    return [*items, marker] if name in _KEEP_FIRST else [marker, *items]


def _layout(
    sections: dict[str, list[str]], omitted: dict[str, int], cap: int, names: tuple[str, ...]
) -> str:
    marks = {"Done": "- [x] ", "In Progress": "- [ ] "}
    lines = [NOTE]
    extras = [k for k in sections if k not in names and k not in _SECTION_ORDER]
    for name in [*names, *extras]:
        if name == "Done":
            lines += ["", "## Progress"]
        items = sections.get(name, [])
        # File lists, the focus and open questions are never dropped: only what lies between.
        head = [i for i in items if name == "Critical Context" and i.startswith(_HEAD)]
        tail = [i for i in items if name == "Critical Context" and i.startswith(_PENDING)]
        middle, dropped = _trim(name, [i for i in items if i not in head + tail], cap)
        items = [*head, *_marked(name, middle, omitted.get(name, 0) + dropped), *tail]
        level = "###" if name in ("Done", "In Progress", "Blocked") else "##"
        lines += ([] if level == "###" else [""]) + [f"{level} {name}"]
        if name == "Next Steps":
            lines += [f"{n}. {item}" for n, item in enumerate(items, start=1)]
        else:
            lines += [marks.get(name, "- ") + item for item in items] or ["(none)"]
    return "\n".join(lines)


def _fit(render: Callable[[int], str], max_tokens: int) -> str:
    limit = max(utf16_len(NOTE), max_tokens * 4)  # chars/4 in UTF-16 units, as estimated (D26)
    for cap in (16, 8, 4, 2, 1):
        text = render(cap)
        if utf16_len(text) <= limit:
            return text
    return utf16_head(text, limit - 1) + "…"


def _turn_prefix(facts: Evidence) -> dict[str, list[str]]:
    read, modified = facts.files()
    context = _files_line(FILES_READ, set(read)) + _files_line(FILES_MODIFIED, set(modified))
    context += [f"Error seen: {line}" for line in dict.fromkeys(facts.errors)]
    context += [f"Reference: {line}" for line in dict.fromkeys(facts.references)]
    context += [f"Last assistant text: {short(facts.replies[-1])}"] if facts.replies else []
    calls = [c for c in facts.calls if c.name != "read" and c.settled()]
    done = [c.describe() + " (failed)" if c.failed() else c.outcome() for c in calls]
    return {
        "Original Request": [short(r.text) for r in facts.requests[:1]],
        "Early Progress": list(dict.fromkeys(done + facts.decisions)),
        "Context for Suffix": context,
    }


def _split_prompt(prompt: str) -> tuple[str, str]:
    # The conversation runs to the last closing tag: the text after it is ours (blocks and
    # instructions), while the conversation itself may quote anything.
    start = prompt.find("<conversation>\n")
    end = prompt.rfind("\n</conversation>")
    if start == -1 or end < start:
        return "", prompt
    return prompt[start + len("<conversation>\n") : end], prompt[end:]


def _previous(facts: Evidence, rest: str) -> Parsed:
    # The previous summary is older than anything in the conversation, so it comes first.
    previous = parse_summary(block(rest, "previous-summary") or "")
    for kind, text in facts.embedded:
        previous.merge(branch_lesson(text) if kind == "branch" else parse_summary(text))
    return previous


def summarize(request: ModelRequest) -> str:
    """The offline summary for a summary request (pure; see the module docstring).

    Raises:
        FatalModelError: the request is a chat turn, which this route cannot answer.
    """
    if request.purpose == "chat":
        raise FatalModelError("the offline summarizer only writes summaries")
    conversation, rest = _split_prompt(request.prompt)
    facts = read_conversation(conversation)
    previous = _previous(facts, rest)
    if request.purpose == "branch" and render("branch_summary") not in rest:
        # The instructions replaced the prompt: they may ask for anything, and an extractive
        # summarizer cannot follow them. Saying so beats a summary that ignores them.
        raise FatalModelError(
            "the offline summarizer cannot follow replacement instructions; give them as "
            "focus (without replacing the prompt) or summarize with a model"
        )
    context = _block_lines(block(rest, "additional-context"))
    asked = re.search(r"\n\nAdditional focus: (.*)\Z", rest, re.DOTALL)
    focus = focus_lines(asked.group(1), facts) if asked else []
    if request.purpose == "short":
        return _fit(lambda cap: short_summary(facts, previous), request.max_tokens)
    if request.purpose == "turn_prefix":
        sections, omitted = _turn_prefix(facts), dict[str, int]()
        names: tuple[str, ...] = tuple(sections)
    else:
        branch = request.purpose == "branch"
        sections, omitted = _sections(facts, previous, context, focus, branch)
        names = _SECTION_ORDER
    return _fit(lambda cap: _layout(sections, omitted, cap, names), request.max_tokens)


def _block_lines(text: str | None) -> list[str]:
    return [line.removeprefix("- ") for line in (text or "").splitlines() if line.strip()]


IN_THREAD_CHARS = 200_000
"""From this many characters of prompt, the summary is written in a worker thread."""


class OfflineSummarizer:
    """A :class:`~orchestrator._core.model.Model` that summarizes without calling any model."""

    name = "offline/extractive"
    context_window = 1_000_000

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Summarize ``request`` extractively.

        Raises:
            FatalModelError: the request is a chat turn.
        """
        if len(request.prompt) < IN_THREAD_CHARS:
            text = summarize(request)
        else:
            # Reading a long conversation takes a CPU-bound half second: in a worker thread,
            # so that a server's other clients are answered meanwhile. An abort does not wait
            # for it: the reading is pure, and its result is dropped.
            text = await anyio.to_thread.run_sync(summarize, request, abandon_on_cancel=True)
        prompt_chars = utf16_len(request.system) + utf16_len(request.prompt)
        usage = Usage(input=math.ceil(prompt_chars / 4), output=math.ceil(utf16_len(text) / 4))
        return ModelResponse(
            text=text, usage=usage, model="extractive", provider="offline", stop_reason="stop"
        )
