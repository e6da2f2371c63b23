"""The summary quality gate: what a summary must be before it is committed (D32).

Theory of operation. A summarizer's answer that is not empty and not cut off by the length limit
(D15) can still be useless: an apology, a provider's error page passed through as text, a
ramble without the sections the next model reads, a text longer than the conversation it was
meant to replace, or file lists it mangled. Every other system commits such a text, and the
session then continues from it. This module only *judges*: :func:`check_summary` is a pure
function of the text and a :class:`GateSpec` (what this request asked for), and names the first
check that failed. Running it is the ``check_summary`` effect of the operation table; what a
refusal leads to (the same candidate again with the failure named, the next candidate, the
offline summarizer) is the table's rows.

The required sections are read from the prompt files themselves (their ``##`` / ``###``
headings after "Use exactly this layout:"), so a prompt edit moves the gate with it. A request
whose prompt a hook or the user replaced requires no sections: we do not know what it asked.

A summary a hook supplied (``session_before_compact``'s ``compaction``) is checked as a hook's
text (purpose ``hook``): an error or a refusal, cut off, longer than what it replaces. Not the
sections, the file lists or the focus: a hook writes its own format, and may keep its own file
lists. (An empty one never gets here: the hook's result is refused whole before, and the
compaction is summarized as without the hook.)

The checks are heuristics, and I chose them to refuse only what is clearly broken: a refusal or
an error is recognised by its opening words, not anywhere in the text (a summary may quote an
error message, and Critical Context asks it to); "shorter than its input" allows
:data:`MIN_ROOM` characters whatever the input, because the empty layout alone is about half of
that and a tiny conversation is no reason to fail a compaction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.prompts import render
from orchestrator._core.summary_request import upsert_file_tags

CHECKS = (
    "error_text",
    "refusal",
    "truncated",
    "short_shape",
    "sections",
    "too_long",
    "file_lists",
    "focus",
)
"""Every check, in the order they run; a refusal names the first that failed."""

MIN_ROOM = 2400
"""A summary of up to this many characters is never refused as longer than its input."""

SHORT_MAX_CHARS = 1200
"""A short summary longer than this is not two or three sentences."""

SHORT_MAX_LINES = 4

_LAYOUT = "Use exactly this layout:"
_HEADING = re.compile(r"^(#{2,3})\s+(.+?)\s*$", re.MULTILINE)
_LINE_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)[\s:#*]*$")

_REFUSALS = re.compile(
    r"^\W*(?:i'?m sorry|i am sorry|sorry,|i apologi[sz]e|unfortunately,? i|as an ai\b|"
    r"i (?:can ?not|can't|won't|am unable to|am not able to|'m unable to|'m not able to) "
    r"(?:help|assist|comply|provide|do that|summari[sz]e|fulfil))",
    re.IGNORECASE,
)
_ERRORS = re.compile(
    r"^\W*(?:error\b|upstream (?:request )?(?:failed|error|connect)|internal server error|"
    r"bad gateway|service unavailable|gateway time-?out|too many requests|rate limit|"
    r"\d{3} (?:bad gateway|service unavailable|internal server error|gateway time-?out|"
    r"too many requests|not found|unauthorized|forbidden)|<!doctype html|<html|<head|<body|"
    r"traceback \(most recent call last\))",
    re.IGNORECASE,
)
_DANGLING = re.compile(
    r"(?:[,;(\[{]|\b(?:and|or|the|to|of|with|because))\s*$",
    re.IGNORECASE,
)
_WORD = re.compile(r"[A-Za-z0-9_./-]{4,}")
_STOP = frozenset(
    "about after also especially from have into keep more most only please preserve should "
    "summary summarize that their them then there these they this those what when where which "
    "while with would your detail details important".split()
)
_TAGS = ("read-files", "modified-files")
_PREVIOUS = "previous-summary>"  # what both tags of the previous summary hold
_OPENS = "<previous-summary>\n"
_CLOSES = "\n</previous-summary>"


@dataclass(frozen=True, slots=True, kw_only=True)
class GateSpec:
    """What one summary request asked for: what its answer is checked against.

    Attributes:
        purpose: ``history``, ``turn_prefix``, ``short``, ``branch``, or ``hook`` (a summary a
            hook supplied: only the checks that do not assume our prompt's format).
        headings: The sections the prompt asked for, in order (empty: none required).
        input_chars: The size of what the summary replaces (the serialized conversation and
            any previous summary, as sent); 0 when unknown.
        focus: The focus the user asked for, to be named in the summary.
        read_files: The read-files list our code appends (D16).
        modified_files: The modified-files list our code appends (D16).
    """

    purpose: str
    headings: tuple[str, ...] = ()
    input_chars: int = 0
    focus: str | None = None
    read_files: tuple[str, ...] = ()
    modified_files: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The spec as plain JSON (it travels with a Temporal activity's report)."""
        return {
            "purpose": self.purpose,
            "headings": list(self.headings),
            "inputChars": self.input_chars,
            "focus": self.focus,
            "readFiles": list(self.read_files),
            "modifiedFiles": list(self.modified_files),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateSpec:
        """The spec :meth:`as_json` wrote."""
        return cls(
            purpose=str(data["purpose"]),
            headings=tuple(data.get("headings", ())),
            input_chars=int(data.get("inputChars", 0)),
            focus=data.get("focus"),
            read_files=tuple(data.get("readFiles", ())),
            modified_files=tuple(data.get("modifiedFiles", ())),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the gate found.

    Attributes:
        check: The first check that failed (one of :data:`CHECKS`), or ``None``: it passed.
        reason: What was wrong, in one line a model can be told.
    """

    check: str | None = None
    reason: str = ""

    @property
    def passed(self) -> bool:
        """Whether the summary may be committed."""
        return self.check is None


PASSED = Verdict()


@functools.cache
def layout_headings(*names: str) -> tuple[str, ...]:
    """The headings the named prompts ask for ("Use exactly this layout:" and what follows)."""
    found: list[str] = []
    for name in names:
        text = render(name)
        at = text.find(_LAYOUT)
        if at >= 0:
            found.extend(match.group(2) for match in _HEADING.finditer(text, at))
    return tuple(found)


@functools.cache
def prompt_hash(*names: str) -> str:
    """A short hash of the shipped prompt files ``names`` (which prompts wrote a summary)."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + render(name).encode() + b"\0")
    return digest.hexdigest()[:16]


def text_hash(text: str) -> str:
    """A short hash of ``text`` (the summarized input, for provenance)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def replaced_input(prompt: str) -> str:
    """What a summary replaces: the prompt's conversation and any previous summary.

    The instructions and context blocks are not replaced by the summary, so they do not count.
    """
    start, end = prompt.find("<conversation>\n"), prompt.rfind("\n</conversation>")
    conversation = prompt[start + len("<conversation>\n") : end] if 0 <= start < end else ""
    previous = ""
    opened, closed = prompt.find("<previous-summary>\n"), prompt.find("\n</previous-summary>")
    if 0 <= opened < closed:
        previous = prompt[opened + len("<previous-summary>\n") : closed]
    return conversation + previous


def replaced_measure(prompt: str) -> tuple[int, str]:
    """``len`` and :func:`text_hash` of :func:`replaced_input` of ``prompt``, copying less.

    A summary request's prompt at 10k entries is 750,000 characters. :func:`replaced_input`
    searches it twice for the previous summary's tags, copies the conversation out of it, and
    :func:`text_hash` encodes that copy: about a millisecond and a half of the event loop's time
    after every answer, and two copies of fresh memory. Here the two tags are found in one
    pass (they share ``previous-summary>``) and an ASCII prompt is encoded once and hashed by
    slices of it. The result is the same for every prompt, tags quoted in the conversation
    included (``tests/test_gate_measure.py`` compares the two).
    """
    start, end = prompt.find("<conversation>\n"), prompt.rfind("\n</conversation>")
    spans = [(start + len("<conversation>\n"), end)] if 0 <= start < end else []
    opened, closed = _previous_tags(prompt)
    if 0 <= opened < closed:
        spans.append((opened + len("<previous-summary>\n"), closed))
    spans = [(a, b) for a, b in spans if a < b]
    if not prompt.isascii():  # character offsets are not byte offsets: the plain way
        replaced = "".join(prompt[a:b] for a, b in spans)
        return len(replaced), text_hash(replaced)
    data = memoryview(prompt.encode("ascii"))
    digest = hashlib.sha256()
    for a, b in spans:
        digest.update(data[a:b])
    return sum(b - a for a, b in spans), digest.hexdigest()[:16]


def _previous_tags(prompt: str) -> tuple[int, int]:
    """Where the previous summary's opening and closing tags first occur (-1: nowhere)."""
    opened = closed = -1
    at = prompt.find(_PREVIOUS)
    while at != -1 and (opened < 0 or closed < 0):
        if opened < 0 and at >= 1 and prompt.startswith(_OPENS, at - 1):
            opened = at - 1
        if closed < 0 and at >= 3 and prompt.startswith(_CLOSES, at - 3):
            closed = at - 3
        at = prompt.find(_PREVIOUS, at + 1)
    return opened, closed


def feedback_line(verdict: Verdict) -> str:
    """The line added to the instructions when the same candidate is asked again."""
    return (
        f"Your previous answer was refused ({verdict.check}): {verdict.reason}. "
        "Write the summary again and avoid that."
    )


def check_summary(text: str, spec: GateSpec) -> Verdict:
    """Judge a summary before it is committed (pure).

    Args:
        text: The summarizer's text, before our file lists are appended.
        spec: What the request asked for.

    Returns:
        :data:`PASSED`, or the first failed check with its reason.
    """
    body = text.strip()
    for verdict in (_error_text(body), _refusal(body), _truncated(body, spec.headings)):
        if verdict is not None:
            return verdict
    if spec.purpose == "hook":
        return _too_long(body, spec) or PASSED
    shape = _short_shape(body) if spec.purpose == "short" else _sections(body, spec.headings)
    if shape is not None:
        return shape
    for verdict in (_too_long(body, spec), _file_lists(body, spec), _focus(body, spec.focus)):
        if verdict is not None:
            return verdict
    return PASSED


def _error_text(body: str) -> Verdict | None:
    if _ERRORS.match(body):
        return Verdict(check="error_text", reason=f"it is an error message: {_first_line(body)}")
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except ValueError:
            return None
        if isinstance(data, dict) and ("error" in data or "errors" in data):
            return Verdict(check="error_text", reason="it is a JSON error object")
    return None


def _refusal(body: str) -> Verdict | None:
    if _REFUSALS.match(body.replace("\u2019", "'")):
        return Verdict(check="refusal", reason=f"it is a refusal: {_first_line(body)}")
    return None


def _truncated(body: str, headings: Sequence[str]) -> Verdict | None:
    if body.count("```") % 2:
        return Verdict(check="truncated", reason="it ends inside an unclosed code block")
    last = body.splitlines()[-1] if body else ""
    if not _DANGLING.search(last) or _LINE_HEADING.match(last):
        return None
    # A last item may quote the user word for word ("... and the"): with the layout complete
    # up to its last section, that is a quotation, not a text cut off.
    if headings and _heading_at(body, headings[-1]):
        return None
    return Verdict(check="truncated", reason="it ends mid-sentence, before the layout's end")


def _heading_at(body: str, heading: str) -> bool:
    wanted = _norm(heading)
    for line in body.splitlines():
        match = _LINE_HEADING.match(line)
        if match and _norm(match.group(1)) == wanted:
            return True
    return False


def _short_shape(body: str) -> Verdict | None:
    lines = [line for line in body.splitlines() if line.strip()]
    if any(_LINE_HEADING.match(line) for line in lines):
        return Verdict(check="short_shape", reason="a short summary has no headings")
    if len(lines) > SHORT_MAX_LINES or len(body) > SHORT_MAX_CHARS:
        return Verdict(
            check="short_shape",
            reason=f"a short summary is two or three sentences (at most {SHORT_MAX_CHARS} "
            f"characters), not {len(body)} characters on {len(lines)} lines",
        )
    return None


def _sections(body: str, headings: Sequence[str]) -> Verdict | None:
    if not headings:
        return None
    found: list[tuple[str, int, int]] = []  # (heading, line index, depth) of every heading line
    lines = body.splitlines()
    for index, line in enumerate(lines):
        # A heading line has its "#" within its first four characters: the others, most of a
        # summary, are not matched at all (the gate runs on every answer, D32).
        match = _LINE_HEADING.match(line) if "#" in line[:4] else None
        if match:
            stripped = line.lstrip()
            found.append((_norm(match.group(1)), index, len(stripped) - len(stripped.lstrip("#"))))
    wanted = _wanted(tuple(headings))
    names = {name for name, _, _ in found}
    missing = [h for h, w in zip(headings, wanted, strict=True) if w not in names]
    if missing:
        return Verdict(check="sections", reason=f"sections missing: {', '.join(missing)}")
    empty: list[str] = []
    for position, (name, index, depth) in enumerate(found):
        if name not in wanted:
            continue
        after = found[position + 1] if position + 1 < len(found) else None
        end = after[1] if after is not None else len(lines)
        content = any(line.strip() for line in lines[index + 1 : end])
        # A section whose sub-sections follow at once (Progress, then Done) has them as content.
        nested = after is not None and after[2] > depth
        if not content and not nested:
            empty.append(headings[wanted.index(name)])
    if empty:
        return Verdict(check="sections", reason=f"sections empty: {', '.join(empty)}")
    return None


@functools.lru_cache(maxsize=64)
def _wanted(headings: tuple[str, ...]) -> tuple[str, ...]:
    """The headings a layout asks for, as :func:`_norm` compares them (the same every answer)."""
    return tuple(_norm(h) for h in headings)


def _too_long(body: str, spec: GateSpec) -> Verdict | None:
    if spec.input_chars and len(body) > max(spec.input_chars, MIN_ROOM):
        return Verdict(
            check="too_long",
            reason=f"it is {len(body)} characters, longer than the {spec.input_chars} it replaces",
        )
    return None


def _file_lists(body: str, spec: GateSpec) -> Verdict | None:
    # Our code appends the lists (D16): whatever the model wrote, the text it ends up with
    # must hold each list once, as we wrote it, and no stray tag of its own.
    final = upsert_file_tags(body, spec.read_files, spec.modified_files)
    expected = upsert_file_tags("", spec.read_files, spec.modified_files)
    for tag, files in zip(_TAGS, (spec.read_files, spec.modified_files), strict=True):
        want = 1 if files else 0
        opened, closed = final.count(f"<{tag}>"), final.count(f"</{tag}>")
        if opened != want or closed != want:
            return Verdict(
                check="file_lists",
                reason=f"the <{tag}> list is mangled (an unclosed or stray tag in the text)",
            )
    if expected and not final.endswith(expected):
        return Verdict(check="file_lists", reason="the tracked file lists were not kept intact")
    return None


def _focus(body: str, focus: str | None) -> Verdict | None:
    if not focus or not focus.strip():
        return None
    text = " ".join(body.casefold().split())
    if " ".join(focus.casefold().split()) in text:
        return None
    words = {w.casefold() for w in _WORD.findall(focus)} - _STOP
    named = [w for w in words if w in text]
    if not words or len(named) * 2 >= len(words):
        return None
    return Verdict(check="focus", reason=f"it does not address the requested focus: {focus}")


def _norm(heading: str) -> str:
    return " ".join(heading.replace("*", "").strip().rstrip(":").casefold().split())


def _first_line(body: str) -> str:
    line = body.splitlines()[0] if body else ""
    return line if len(line) <= 120 else line[:117] + "..."
