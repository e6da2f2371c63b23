"""Reading earlier summaries back for the offline summarizer: previous, compaction and branch.

Theory of operation. An update starts from what earlier summaries said. They come in several
shapes: our own offline output, a model's Markdown, a split-turn summary (a history summary, a
separator, then ``Original Request`` / ``Early Progress`` / ``Context for Suffix``), and branch
summaries that open with a preamble. I fold them all into the eight sections of the compaction
layout, so that nothing accumulates in side sections from one compaction to the next:

* a turn prefix's Early Progress joins Done (its failed steps join Blocked) and its Context for
  Suffix joins Critical Context, minus the "Last assistant text", which is stale by now;
* a preamble, or any lead-in line before the first heading that ends with a colon, is framing,
  never an item;
* file lists (the ``Files read:`` / ``Files modified:`` items and the D16 tags) become path
  sets, so they are merged as sets and shown once;
* an "N more items omitted" marker becomes a count, so the next marker can add to it;
* a branch summary becomes one Critical Context line (what the abandoned branch tried, did
  and hit); its decisions and constraints are still lessons, so they are kept as such, while
  its file lists are not this branch's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orchestrator._core.prompts import render
from orchestrator._models.offline_evidence import short

NOTE = "_Extractive summary generated offline (no model was called)._"
"""First line of every offline summary."""

FILES_READ = "Files read: "
FILES_MODIFIED = "Files modified: "
BRANCH_LEAD = "An abandoned branch tried: "
UNANSWERED = "Unanswered (verbatim): "
STILL_OPEN = "Question still open (verbatim): "
LATEST = "Latest request: "
ASKED = "Asked: "
# Lines that describe one request, not the session: a later update drops them.
_STALE = ("Last assistant text: ", "Requested focus: ", "On the focus (verbatim): ")
_MARKER = re.compile(r"… \((\d+) more items omitted\)")
_TAGS = re.compile(r"<(read-files|modified-files)>\n?(.*?)\n?</\1>", re.DOTALL)
_PREAMBLE = re.compile(r"explored a different .*before (?:returning|coming back)", re.IGNORECASE)
_FOLD = {"Early Progress": "Done", "Context for Suffix": "Critical Context"}


@dataclass(slots=True)
class Parsed:
    """A summary read back: section items, omitted counts and file sets."""

    sections: dict[str, list[str]] = field(default_factory=dict)
    omitted: dict[str, int] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)
    modified: set[str] = field(default_factory=set)

    def items(self, name: str) -> list[str]:
        """The items of section ``name`` (empty when absent)."""
        return self.sections.get(name, [])

    def add(self, name: str, item: str) -> None:
        """Append ``item`` to section ``name`` unless it is already there."""
        items = self.sections.setdefault(name, [])
        if item not in items:
            items.append(item)

    def merge(self, other: Parsed) -> None:
        """Add ``other``'s items, counts and files after this one's."""
        for name, items in other.sections.items():
            for item in items:
                self.add(name, item)
        for name, count in other.omitted.items():
            self.omitted[name] = self.omitted.get(name, 0) + count
        self.read |= other.read
        self.modified |= other.modified


def _framing() -> set[str]:
    return {line.strip() for line in render("branch_preamble").splitlines() if line.strip()}


def _paths(listing: str) -> set[str]:
    quoted = re.findall(r"`([^`]+)`", listing)
    listed = quoted or [p.strip() for p in re.sub(r"\(\+\d+ more\)", "", listing).split(",")]
    return {p for p in listed if p}


def _file_tags(parsed: Parsed, text: str) -> str:
    for tag, body in _TAGS.findall(text):
        paths = {p.strip() for p in body.splitlines() if p.strip() and not p.startswith("… (")}
        (parsed.read if tag == "read-files" else parsed.modified).update(paths)
    return _TAGS.sub("", text)


def _file_item(parsed: Parsed, item: str) -> bool:
    if item.startswith(FILES_READ):
        parsed.read |= _paths(item.removeprefix(FILES_READ))
    elif item.startswith(FILES_MODIFIED):
        parsed.modified |= _paths(item.removeprefix(FILES_MODIFIED))
    else:
        return False
    return True


def _heading(line: str) -> str | None:
    match = re.match(r"#{1,3}\s+(.*)", line) or re.fullmatch(r"\*\*(.+?):?\*\*:?", line)
    return match.group(1).strip().rstrip(":") if match else None


def _item(parsed: Parsed, section: str, item: str) -> None:
    marker = _MARKER.fullmatch(item)
    if marker:
        parsed.omitted[section] = parsed.omitted.get(section, 0) + int(marker.group(1))
    elif section == "Done" and item.endswith(" (failed)"):
        parsed.add("Blocked", item.removesuffix(" (failed)") + " failed")
    elif section == "Critical Context" and (_file_item(parsed, item) or item.startswith(_STALE)):
        return
    elif item != "(none)":
        parsed.add(section, item)


def parse_summary(text: str) -> Parsed:
    """Read a Markdown summary back into sections (see the module docstring)."""
    parsed = Parsed()
    framing = _framing()
    section: str | None = None
    # OMP glues the branch preamble to the summary without a line break ("...exploration:## Goal").
    text = re.sub(r":(#{2,3} )", r":\n\1", text)
    for raw in _file_tags(parsed, text).splitlines():
        line = raw.strip()
        if not line or line == NOTE or set(line) == {"-"} or line in framing:
            continue
        heading = _heading(line)
        if heading is not None:
            section = _FOLD.get(heading, heading)
            continue
        if section is None and (line.endswith(":") or _PREAMBLE.search(line)):
            continue  # a lead-in before the first heading frames the summary; it is no item
        item = re.sub(r"^(?:[-*]\s+(?:\[[ xX]\]\s+)?|\d+\.\s+)", "", line)
        loose = section in (None, "Progress", "Turn Context (split turn)")
        _item(parsed, "Critical Context" if loose or section is None else section, item)
    return parsed


def branch_lesson(text: str) -> Parsed:
    """An embedded branch summary, as what it leaves for this branch (see the docstring)."""
    branch = parse_summary(text)
    # Its files stay out: the file lists describe this branch's work (pi's file operations do
    # not count branch summaries either), and the lesson line says what the branch changed.
    kept = Parsed()
    for name in ("Constraints & Preferences", "Key Decisions"):
        for item in branch.items(name):
            kept.add(name, item)
    tried = "; ".join(branch.items("Goal")) or "; ".join(branch.items("Critical Context"))
    parts = [tried.rstrip(".") + "." if tried else "(no goal recorded)."]
    for label, name in (("It did", "Done"), ("It left unfinished", "In Progress")):
        if branch.items(name):
            parts.append(f"{label}: {'; '.join(branch.items(name)).rstrip('.')}.")
    if branch.items("Blocked"):
        parts.append(f"It hit: {'; '.join(branch.items('Blocked')).rstrip('.')}.")
    kept.add("Critical Context", short(BRANCH_LEAD + " ".join(parts), 400))
    return kept
