"""The built-in offline summarizer: deterministic, extractive, no model called.

Theory of operation. A fresh machine with no key must still be able to compact, so this route
answers summary requests by reading them, not by generating text. It parses the request's
``<conversation>`` (the labelled paragraphs of :mod:`orchestrator._serialize`), its optional
``<previous-summary>`` and ``<additional-context>``, and copies out what it can recognise: the
first and last user requests, sentences that state rules, tool calls and their results, the files
they read and changed, and error lines. It lays them out in the same sections the prompts ask a
model for, so everything downstream (file tags, split-turn merges, later updates) works the same.

It never invents: every item is a quotation or a count, and the first line says the summary is
extractive. When updating, the previous summary's items are kept and the new ones merged in;
only Next Steps is rewritten, because a stale next step is worse than none. Output is trimmed to
the request's output budget by showing fewer items per section (saying how many were left out),
so it never ends with stop reason ``length``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ._errors import ModelError
from ._model import ModelRequest, ModelResponse, Usage

NOTE = "_Extractive summary generated offline (no model was called)._"
"""First line of every offline summary."""

_LABELS = ("User", "Assistant thinking", "Assistant tool calls", "Assistant", "Tool result")
_PARAGRAPH = re.compile(r"(?:^|\n\n)\[(" + "|".join(map(re.escape, _LABELS)) + r")\]: ")
_RULE = re.compile(
    r"\b(must|never|always|don'?t|do not|prefer|please use|avoid|make sure|should(?:n'?t| not)?"
    r"|only use|instead of)\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(I'll|I will|I decided|decided|let's|we'll|instead|chose|going to|the plan is)\b",
    re.IGNORECASE,
)
_ERROR = re.compile(
    r"(?i:\b(error|exception|traceback|failed|failure|fatal|panic|denied|not found)\b)"
    r"|\b\w+(Error|Exception)\b|Command exited with code"
)
_TAGS = re.compile(r"<(read-files|modified-files)>.*?</\1>", re.DOTALL)
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
_ITEM_CHARS = 300


def _short(text: str, limit: int = _ITEM_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _block(text: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, re.DOTALL)
    return match.group(1) if match else None


def _split_top(text: str, separator: str) -> list[str]:
    """Split ``text`` at ``separator`` outside JSON strings and brackets."""
    parts, depth, in_string, escaped, start = [], 0, False, False, 0
    i = 0
    while i < len(text):
        char = text[i]
        if in_string:
            escaped = char == "\\" and not escaped
            in_string = escaped or char != '"'
        elif char == '"':
            in_string = True
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


@dataclass(slots=True)
class _Call:
    name: str
    text: str
    path: str | None
    result: str | None = None


def _parse_call(text: str) -> _Call:
    name, _, rest = text.partition("(")
    path = None
    for pair in _split_top(rest.removesuffix(")"), ", "):
        key, _, value = pair.partition("=")
        if key in ("path", "file_path"):
            try:
                decoded = json.loads(value)
            except ValueError:
                decoded = value
            path = decoded if isinstance(decoded, str) and decoded else None
    return _Call(name=name.strip(), text=text, path=path)


@dataclass(slots=True)
class _Facts:
    """What the conversation says, in order of appearance."""

    requests: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    embedded: list[str] = field(default_factory=list)
    last_label: str = ""


def _paragraphs(conversation: str) -> Iterator[tuple[str, str]]:
    matches = list(_PARAGRAPH.finditer(conversation))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(conversation)
        yield match.group(1), conversation[match.end() : end]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _error_lines(text: str) -> list[str]:
    # Error strings are kept exactly (only the ends trimmed): they are what gets searched for.
    lines = (line.strip() for line in text.splitlines() if _ERROR.search(line))
    return [line if len(line) <= _ITEM_CHARS else line[: _ITEM_CHARS - 1] + "…" for line in lines]


def _read_user(facts: _Facts, text: str) -> None:
    summary = _block(text, "summary")
    if summary is not None:
        facts.embedded.append(summary)
    elif text.startswith("Ran `"):
        facts.commands.append(_short(text.partition("\n")[0]))
        facts.errors.extend(_error_lines(text))
    else:
        facts.requests.append(text)
        facts.rules.extend(_short(s) for s in _sentences(text) if _RULE.search(s))


def _read_tool_result(facts: _Facts, text: str) -> None:
    waiting = next((call for call in facts.calls if call.result is None), None)
    if waiting is not None:
        waiting.result = text
    # A file's contents are not errors, even when the code in it mentions some.
    if waiting is None or waiting.name != "read":
        facts.errors.extend(_error_lines(text))


def _read(conversation: str) -> _Facts:
    facts = _Facts()
    for label, text in _paragraphs(conversation):
        facts.last_label = label
        if label == "User":
            _read_user(facts, text)
        elif label == "Assistant":
            facts.replies.append(text)
            facts.decisions.extend(_short(s) for s in _sentences(text) if _DECISION.search(s))
        elif label == "Assistant tool calls":
            facts.calls.extend(_parse_call(call) for call in _split_top(text, "; "))
        elif label == "Tool result":
            _read_tool_result(facts, text)
    return facts


def _parse_summary(text: str) -> dict[str, list[str]]:
    """Sections of a Markdown summary: heading -> item lines (markers stripped)."""
    sections: dict[str, list[str]] = {}
    current = "Critical Context"
    for raw in _TAGS.sub("", text).splitlines():
        line = raw.strip()
        if not line or line == NOTE or set(line) == {"-"}:
            continue
        heading = re.match(r"#{2,3}\s+(.*)", line) or re.fullmatch(r"\*\*(.+?):?\*\*", line)
        if heading:
            current = heading.group(1).strip()
            if current != "Progress":
                sections.setdefault(current, [])
            continue
        item = re.sub(r"^(?:[-*]\s+(?:\[[ xX]\]\s+)?|\d+\.\s+)", "", line)
        if item and item != "(none)":
            sections.setdefault(current, []).append(item)
    return sections


def _merge(*lists: list[str]) -> list[str]:
    return list(dict.fromkeys(item for items in lists for item in items))


def _merge_sections(
    first: dict[str, list[str]], second: dict[str, list[str]]
) -> dict[str, list[str]]:
    merged = {name: _merge(items, second.get(name, [])) for name, items in first.items()}
    merged.update({name: items for name, items in second.items() if name not in merged})
    return merged


def _describe(call: _Call) -> str:
    subject = f"`{call.path}`" if call.path else _short(call.text, 160)
    return f"{call.name} {subject}" if call.path else subject


def _failed(call: _Call) -> bool:
    # Tools report failure at the start or the end of their output; a match in the middle is
    # more likely content than status.
    lines = (call.result or "").strip().splitlines()
    return call.name != "read" and any(_ERROR.search(line) for line in lines[:1] + lines[-1:])


def _files(facts: _Facts) -> tuple[list[str], list[str]]:
    modified = sorted({c.path for c in facts.calls if c.path and c.name in ("write", "edit")})
    read = sorted({c.path for c in facts.calls if c.path and c.name == "read"} - set(modified))
    return read, modified


def _stopped_at(facts: _Facts) -> str:
    if facts.last_label == "User" and facts.requests:
        return "the user's last message, which has no reply yet"
    if facts.last_label == "Assistant" and facts.replies:
        return "the assistant's reply: " + _short(facts.replies[-1])
    if facts.calls:
        return "the tool call " + _describe(facts.calls[-1])
    return "the end of the recorded messages"


def _sections(
    facts: _Facts, previous: dict[str, list[str]], extra: list[str]
) -> dict[str, list[str]]:
    read, modified = _files(facts)
    goal = [_short(facts.requests[0])] if facts.requests else []
    done = [_describe(c) for c in facts.calls if not _failed(c)] + facts.commands
    blocked = [f"{_describe(c)} failed" for c in facts.calls if _failed(c)]
    answered = facts.last_label == "Assistant"
    open_now = [_short(facts.requests[-1])] if facts.requests and not answered else []
    steps = [f"Work stopped at {_stopped_at(facts)}"]
    if facts.requests:
        steps.insert(0, "Finish the last request: " + _short(facts.requests[-1]))
    critical = [f"Files read: {', '.join(f'`{p}`' for p in read)}"] if read else []
    critical += [f"Files modified: {', '.join(f'`{p}`' for p in modified)}"] if modified else []
    critical += [f"Error seen: {line}" for line in dict.fromkeys(facts.errors)]
    critical += extra
    if facts.last_label == "User" and facts.requests:
        critical.append("Unanswered (verbatim): " + facts.requests[-1].strip())
    new = {
        "Goal": goal,
        "Constraints & Preferences": facts.rules,
        "Done": done,
        "In Progress": open_now,
        "Blocked": blocked,
        "Key Decisions": facts.decisions,
        "Next Steps": steps,
        "Critical Context": critical,
    }
    merged = _merge_sections(previous, new)
    merged["In Progress"] = [i for i in merged["In Progress"] if i not in merged["Done"]]
    merged["Next Steps"] = steps  # Rewritten, never carried over: a stale next step misleads.
    return merged


def _capped(items: list[str], cap: int, keep_newest: bool) -> list[str]:
    if len(items) <= cap:
        return items
    omitted = f"… ({len(items) - cap} more items omitted)"
    return [omitted, *items[-cap:]] if keep_newest else [*items[:cap], omitted]


def _layout(sections: dict[str, list[str]], cap: int, names: tuple[str, ...]) -> str:
    marks = {"Done": "- [x] ", "In Progress": "- [ ] "}
    lines = [NOTE]
    extras = [k for k in sections if k not in names and k not in _SECTION_ORDER]
    for name in [*names, *extras]:
        if name == "Done":
            lines += ["", "## Progress"]
        items = _capped(sections.get(name, []), cap, keep_newest=name in ("Done", "Blocked"))
        level = "###" if name in ("Done", "In Progress", "Blocked") else "##"
        lines += ([] if level == "###" else [""]) + [f"{level} {name}"]
        if name == "Next Steps":
            lines += [f"{n}. {item}" for n, item in enumerate(items, start=1)]
        else:
            lines += [marks.get(name, "- ") + item for item in items] or ["(none)"]
    return "\n".join(lines)


def _fit(render: Callable[[int], str], max_tokens: int) -> str:
    limit = max(len(NOTE), max_tokens * 4)
    for cap in (12, 6, 3, 1):
        text = render(cap)
        if len(text) <= limit:
            return text
    return text[: limit - 1] + "…"


def _turn_prefix(facts: _Facts) -> dict[str, list[str]]:
    read, modified = _files(facts)
    context = [f"Files read: {', '.join(read)}"] if read else []
    context += [f"Files modified: {', '.join(modified)}"] if modified else []
    context += [f"Error seen: {line}" for line in dict.fromkeys(facts.errors)]
    context += [f"Last assistant text: {_short(facts.replies[-1])}"] if facts.replies else []
    done = [_describe(c) + (" (failed)" if _failed(c) else "") for c in facts.calls]
    return {
        "Original Request": [_short(r) for r in facts.requests[:1]],
        "Early Progress": done + facts.commands + facts.decisions,
        "Context for Suffix": context,
    }


def _short_summary(facts: _Facts, previous: dict[str, list[str]]) -> str:
    goal = (previous.get("Goal") or [_short(r) for r in facts.requests[:1]] or ["the task"])[0]
    listed = [i for i in previous.get("Critical Context", []) if i.startswith("Files modified: ")]
    changed = _merge(
        [p.strip() for item in listed for p in item.removeprefix("Files modified: ").split(",")],
        [f"`{path}`" for path in _files(facts)[1]],
    )
    sentences = [f"I worked on: {goal.rstrip('.')}."]
    if changed:
        sentences.append(f"I changed {', '.join(changed)}.")
    else:
        sentences.append("I have not changed any files yet.")
    return f"{NOTE}\n\n" + " ".join(sentences)


def _split_prompt(prompt: str) -> tuple[str, str]:
    # The conversation runs to the last closing tag: the text after it is ours (blocks and
    # instructions), while the conversation itself may quote anything.
    start = prompt.find("<conversation>\n")
    end = prompt.rfind("\n</conversation>")
    if start == -1 or end < start:
        return "", prompt
    return prompt[start + len("<conversation>\n") : end], prompt[end:]


def summarize(request: ModelRequest) -> str:
    """The offline summary for a summary request (pure; see the module docstring).

    Raises:
        ModelError: the request is a chat turn, which this route cannot answer.
    """
    if request.purpose == "chat":
        raise ModelError("the offline summarizer only writes summaries", kind="fatal")
    conversation, rest = _split_prompt(request.prompt)
    facts = _read(conversation)
    previous: dict[str, list[str]] = {}
    for text in [*facts.embedded, _block(rest, "previous-summary") or ""]:
        previous = _merge_sections(previous, _parse_summary(text))
    context = _block(rest, "additional-context") or ""
    extra = [line.removeprefix("- ") for line in context.splitlines()]
    focus = re.search(r"\n\nAdditional focus: (.*)\Z", rest, re.DOTALL)
    extra += [f"Requested focus: {_short(focus.group(1))}"] if focus else []
    if request.purpose == "short":
        return _fit(lambda cap: _short_summary(facts, previous), request.max_tokens)
    if request.purpose == "turn_prefix":
        sections = _turn_prefix(facts)
        names: tuple[str, ...] = tuple(sections)
    else:
        sections = _sections(facts, previous, [e for e in extra if e])
        names = _SECTION_ORDER[:-1] if request.purpose == "branch" else _SECTION_ORDER
    return _fit(lambda cap: _layout(sections, cap, names), request.max_tokens)


class OfflineSummarizer:
    """A :class:`~orchestrator._model.Model` that summarizes without calling any model."""

    name = "offline/extractive"
    context_window = 1_000_000

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Summarize ``request`` extractively.

        Raises:
            ModelError: the request is a chat turn (``kind="fatal"``).
        """
        text = summarize(request)
        prompt_chars = len(request.system) + len(request.prompt)
        usage = Usage(input=math.ceil(prompt_chars / 4), output=math.ceil(len(text) / 4))
        return ModelResponse(
            text=text, usage=usage, model="extractive", provider="offline", stop_reason="stop"
        )
