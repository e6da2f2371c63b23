"""What the offline summarizer reads out of a serialized conversation.

Theory of operation. :mod:`orchestrator._core.serialize` flattens a conversation into labelled
paragraphs (``[User]: ...``). Not every ``[User]`` paragraph is the user asking for something:
pi's ``convertToLlm`` also turns shell runs and the two kinds of summaries into user messages.
So I sort them here, once: a summary wrapper (``prompts/compaction_context.md`` or
``prompts/branch_context.md``) is context and goes to :attr:`Evidence.embedded`; a shell run
(``Ran `cmd```) is work; only what is left is a request. A request counts as answered when
assistant text follows it before the next request, which is the one rule that tells a pending
question from a handled one without understanding either.

Everything keeps its order (calls carry a sequence number), because the merge rules in
:mod:`orchestrator._models.offline` ask "was this file edited, and did a test run pass *after* it?".

A branch summary request carries no tool results (pi leaves them out to save room), so there a
call's outcome is what the assistant said next: the first assistant text after a call is its
*report*, and a report that names a failure marks the call failed. The report is evidence, not
proof, so the summary quotes it as the assistant's words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from orchestrator._core.prompts import render

ITEM_CHARS = 300
_LABELS = ("User", "Assistant thinking", "Assistant tool calls", "Assistant", "Tool result")
_HEADS = tuple((label, f"{label}]: ") for label in _LABELS)
RULE = re.compile(
    r"\b(must|never|always|don'?t|do not|prefer|please use|avoid|make sure|should(?:n'?t| not)?"
    r"|only use|instead of)\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(I'll|I will|I decided|decided|let's|we'll|instead|chose|going to|the plan is"
    r"|rather than)\b",
    re.IGNORECASE,
)
# "I'll read the file" is a step, not a decision: intentions to look at something are left out.
_JUST_LOOKING = re.compile(
    r"\b(?:I'll|I will|let's|we'll|going to)\s+(?:start by |first |now )?(?:read|look|check|run"
    r"|open|inspect|search|see|examine|explore|view|list|grep|find|review|verify|investigate)"
    r"(?:ing)?\b",
    re.IGNORECASE,
)
ERROR = re.compile(
    r"(?i:\b(error|exception|traceback|failed|failure|fatal|panic|denied|not found|ENOENT"
    r"|EACCES|no such file)\b)|\b\w+(Error|Exception)\b|Command exited with code"
)
_ERROR_WORDS = (
    "error",
    "exception",
    "traceback",
    "fail",
    "fatal",
    "panic",
    "denied",
    "not found",
    "enoent",
    "eacces",
    "no such file",
    "command exited with code",
)
"""What a line :data:`ERROR` finds holds, lower-cased: one of these (``fail`` for ``failed`` and
``failure``; ``error`` and ``exception`` for ``...Error`` and ``...Exception`` too)."""


def reports_error(line: str) -> bool:
    """Whether :data:`ERROR` finds something in ``line``.

    An ASCII line without any of :data:`_ERROR_WORDS` is answered without the regular
    expression, which tries its dozen alternatives at every position of the line (40 us for a
    line of 150 characters; most lines of tool output report no error, issue 9). Outside ASCII,
    case-insensitive matching knows more than ``str.lower`` (``ſ`` matches ``s``), so the
    expression decides.
    """
    if line.isascii():
        lower = line.lower()
        if not any(word in lower for word in _ERROR_WORDS):
            return False
    return ERROR.search(line) is not None


TEST_RUN = re.compile(
    r"\b(pytest|py\.test|unittest|tox|nox|jest|vitest|mocha|rspec|phpunit|ctest"
    r"|(?:npm|yarn|pnpm|bun|cargo|go|make|mix|dotnet|mvn|gradle|deno)\s+(?:run\s+)?test)\b"
)
# A commit hash or a URL: identifiers a reader may need to quote back exactly.
_REFERENCE = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b|https?://\S+")
_ACK = re.compile(
    r"^(?:(?:good|great|thanks|thank you|ok|okay|nice|perfect|cool|yes|sure|excellent)"
    r"[.!,]*\s+)+",
    re.IGNORECASE,
)
_SLASH_COMMAND = re.compile(r"/[\w:.-]+")
# What an assistant says about an outcome ("all 54 tests pass", "the build failed"), and the
# failure words among them; "no failures" and "0 failed" are not failures.
_OUTCOME = re.compile(
    r"(?i:\b(pass(?:es|ed|ing)?|fail\w*|succeed\w*|errors?|green|broke\w*|works?|wrong"
    r"|\d+ tests?)\b)|\b\w+(?:Error|Exception)\b"
)
_FAILURE = re.compile(
    r"(?i:\b(fail\w*|errors?|broke\w*|wrong|exception|traceback|(?:does|did) ?n[o']t work)\b)"
    r"|\b\w+(?:Error|Exception)\b"
)
_NO_FAILURE = re.compile(
    r"(?i)\b(?:no|0|zero|without|none of the)\s+(?:\w+\s+)?(?:fail\w*|errors?)\b"
)
ANSWER_CHARS = 200


def short(text: str, limit: int = ITEM_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def block(text: str, tag: str) -> str | None:
    """The body of the first ``<tag>`` block of ``text``, if any."""
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, re.DOTALL)
    return match.group(1) if match else None


def split_top(text: str, separator: str) -> list[str]:
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


def sentences(text: str) -> list[str]:
    """The sentences (and lines) of ``text``."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def gist(request: str, limit: int = 160) -> str:
    """A request without its leading acknowledgement ("Good. Now ..."), cut short."""
    return short(_ACK.sub("", request.strip()) or request, limit)


@dataclass(slots=True)
class Call:
    """A tool call (or a shell run) and its result, in conversation order."""

    name: str
    text: str
    seq: int
    path: str | None = None
    command: str | None = None
    result: str | None = None
    report: str | None = None
    """The assistant's next text, when the result is not shown (see the module docstring)."""

    def settled(self) -> bool:
        """Whether the call's outcome is known: its result, or else the assistant's report."""
        return self.result is not None or self.report is not None

    def reported(self) -> str | None:
        """The sentence of the report that speaks of an outcome, if any."""
        found = (s for s in sentences(self.report or "") if _OUTCOME.search(s))
        return next(found, None)

    def describe(self) -> str:
        """How the call is listed: ``edit `a.py```, ``Ran `pytest```, or the call itself."""
        if self.command is not None:
            return f"Ran `{short(self.command, 160)}`"
        return f"{self.name} `{self.path}`" if self.path else short(self.text, 160)

    def failed(self) -> bool:
        """Whether the result reports a failure (at its start or end, where tools say so)."""
        if self.result is None:
            said = self.reported()
            return said is not None and bool(_FAILURE.search(_NO_FAILURE.sub("", said)))
        lines = self.result.strip().splitlines()
        if self.name == "read":
            # A file's contents may mention errors anywhere; only a one-line answer is status.
            return len(lines) == 1 and len(lines[0]) <= 200 and reports_error(lines[0])
        return any(reports_error(line) for line in lines[:1] + lines[-1:])

    def outcome(self) -> str:
        """The call as a Done item: a command gets its last output line when that is short.

        Without a result, a command gets the assistant's report instead, quoted as such.
        """
        said = self.reported() if self.result is None else None
        if said is not None and self.command is not None:
            return f"{self.describe()} (the assistant reported: {short(said, ANSWER_CHARS)})"
        lines = [ln.strip() for ln in (self.result or "").splitlines() if ln.strip("` \t")]
        tail = lines[-1] if lines else ""
        if self.command is not None and tail and len(tail) <= 80:
            return f"{self.describe()}: {tail}"
        return self.describe()

    def failure(self) -> str:
        """The call as a Blocked item."""
        said = self.reported() if self.result is None else None
        if said is not None:
            return f"{self.describe()} failed (the assistant reported: {short(said, ANSWER_CHARS)})"
        return f"{self.describe()} failed"

    def is_test_run(self) -> bool:
        """Whether the call runs a test suite."""
        return self.command is not None and bool(TEST_RUN.search(self.command))


def _argument(value: str) -> str | None:
    try:
        decoded = json.loads(value)
    except ValueError:
        decoded = value
    return decoded if isinstance(decoded, str) and decoded else None


def parse_call(text: str, seq: int) -> Call:
    """A ``name(key=<json>, ...)`` tool call as the serializer writes it."""
    name, _, rest = text.partition("(")
    call = Call(name=name.strip(), text=text, seq=seq)
    for pair in split_top(rest.removesuffix(")"), ", "):
        key, _, value = pair.partition("=")
        if key in ("path", "file_path"):
            call.path = _argument(value)
        elif key in ("command", "cmd") and call.name in ("bash", "shell", "exec"):
            call.command = _argument(value)
    return call


@dataclass(slots=True)
class Request:
    """Something the user asked, and whether assistant text followed it."""

    text: str
    answered: bool = False
    answer: str | None = None
    """The assistant's first reply to a question (one with a question mark)."""


@dataclass(slots=True)
class Evidence:
    """What the conversation says, in order of appearance."""

    requests: list[Request] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    embedded: list[tuple[str, str]] = field(default_factory=list)
    """Summaries met in the conversation: ``("compaction" | "branch", summary text)``."""
    last: str = ""
    """What the conversation ends with: "request", "reply", "call" or "" (nothing of note)."""
    answers_earlier: bool = False
    """Assistant text comes before any request: it answers what the previous summary left open."""
    settled_upto: int = 0
    """Every call before this index is settled: a reply or a result looks only after it (each
    call is passed once over the whole conversation, not once per reply)."""

    def unsettled(self) -> Iterator[Call]:
        """The calls still waiting for their outcome, oldest first."""
        calls = self.calls
        while self.settled_upto < len(calls) and calls[self.settled_upto].settled():
            self.settled_upto += 1
        return (call for call in calls[self.settled_upto :] if not call.settled())

    def files(self) -> tuple[list[str], list[str]]:
        """Paths read (and not changed) and paths changed, each sorted."""
        changed = {c.path for c in self.calls if c.path and c.name in ("write", "edit")}
        read = {c.path for c in self.calls if c.path and c.name == "read"} - changed
        return sorted(read), sorted(changed)

    def last_open(self) -> str | None:
        """The last request, verbatim, when no assistant text followed it."""
        last = self.requests[-1] if self.requests else None
        return last.text.strip() if last is not None and not last.answered else None

    def answered(self) -> list[tuple[str, str]]:
        """Questions and the assistant's answers to them, in order."""
        return [(r.text.strip(), r.answer) for r in self.requests if r.answer]

    def passed_over(self) -> list[str]:
        """Questions that got no answer before the user went on to something else."""
        return [r.text.strip() for r in self.requests[:-1] if not r.answered and "?" in r.text]


def _wrapper_lead(name: str) -> str:
    return render(name, summary="\x00").partition("\x00")[0].partition("<summary>")[0].strip()


def _paragraphs(conversation: str) -> Iterator[tuple[str, str]]:
    """``(label, text)`` of each paragraph: ``[Label]: `` at the start or after a blank line.

    Found with ``str.find`` at each blank line before a ``[``, the label checked there: a
    regular expression tried at every position of the text was a third of the offline summary
    of a split turn's prefix, which a server without a model writes on its event loop (issue 9).
    """
    heads: list[tuple[str, int, int]] = []  # label, where its marker starts, where text starts
    # `at` is where a "\n\n[" starts; a marker at the very start has no blank line before it,
    # so it is taken as one starting at -2 (its bracket at 0, like any other's at `at` + 2).
    at = -2 if conversation.startswith("[") else conversation.find("\n\n[")
    while at != -1:
        bracket = at + 3
        for label, head in _HEADS:
            if conversation.startswith(head, bracket):
                heads.append((label, max(at, 0), bracket + len(head)))
                break
        at = conversation.find("\n\n[", max(at + 1, 0))
    for index, (label, _, start) in enumerate(heads):
        end = heads[index + 1][1] if index + 1 < len(heads) else len(conversation)
        yield label, conversation[start:end]


def error_lines(text: str) -> list[str]:
    """Lines of ``text`` that report errors, exactly (only the ends trimmed)."""
    lines = (line.strip() for line in text.splitlines() if reports_error(line))
    return [line if len(line) <= ITEM_CHARS else line[: ITEM_CHARS - 1] + "…" for line in lines]


def _read_user(facts: Evidence, text: str) -> None:
    summary = block(text, "summary")
    if summary is not None:
        kind = "branch" if text.startswith(_wrapper_lead("branch_context")) else "compaction"
        facts.embedded.append((kind, summary))
    elif text.startswith("Ran `"):
        command = text.removeprefix("Ran `").partition("`\n")[0]
        call = Call(name="shell", text=text, seq=len(facts.calls), command=command)
        call.result = text.partition("\n")[2]
        facts.calls.append(call)
        facts.errors.extend(error_lines(call.result))
    elif not _SLASH_COMMAND.fullmatch(text.strip()):
        facts.requests.append(Request(text=text))
        facts.last = "request"
        facts.rules.extend(short(s) for s in sentences(text) if RULE.search(s))
        facts.references.extend(short(s) for s in sentences(text) if _REFERENCE.search(s))


def _read_assistant(facts: Evidence, text: str) -> None:
    facts.replies.append(text)
    facts.last = "reply"
    for call in facts.unsettled():
        call.report = text
    if facts.requests:
        request = facts.requests[-1]
        if not request.answered and "?" in request.text and text.strip():
            request.answer = " ".join(sentences(text)[:2])
        request.answered = True
    else:
        facts.answers_earlier = True
    for sentence in sentences(text):
        if _DECISION.search(sentence) and not _JUST_LOOKING.search(sentence):
            facts.decisions.append(short(sentence))
        if _REFERENCE.search(sentence):
            facts.references.append(short(sentence))


def _read_tool_result(facts: Evidence, text: str) -> None:
    waiting = next(facts.unsettled(), None)
    if waiting is not None:
        waiting.result = text
    # A file's contents are not errors, even when the code in it mentions some.
    if waiting is None or waiting.name != "read" or waiting.failed():
        facts.errors.extend(error_lines(text))


def read_conversation(conversation: str) -> Evidence:
    """Read a serialized conversation (see the module docstring)."""
    facts = Evidence()
    for label, text in _paragraphs(conversation):
        if label == "User":
            _read_user(facts, text)
        elif label == "Assistant":
            _read_assistant(facts, text)
        elif label == "Assistant tool calls":
            for call in split_top(text, "; "):
                facts.calls.append(parse_call(call, len(facts.calls)))
            facts.last = "call"
        elif label == "Tool result":
            _read_tool_result(facts, text)
    return facts
