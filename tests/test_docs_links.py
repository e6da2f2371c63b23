"""Every relative link in README.md and docs/*.md points at a file that exists and, when it has a
``#anchor``, at a heading of that file, so splitting the README into pages cannot rot.

Anchors follow GitHub's rules: the heading's text, lowercased, spaces to ``-``, every other
character dropped except letters, digits, ``-`` and ``_``; a repeated heading gets ``-1``,
``-2``... Links inside fenced code blocks and inline code are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)([^`].*?)\1", re.S)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a fence's own lines included as blank)."""
    lines, fence = [], ""
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence:
            if match and match.group(1) == fence:
                fence = ""
            lines.append("")
        elif match:
            fence = match.group(1)
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return "".join(c for c in text.replace(" ", "-") if c.isalnum() or c in "-_")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link in a page's prose (a link's text may wrap)."""
    prose = "\n".join(prose_lines(path.read_text(encoding="utf-8")))
    # Blank out code spans, keeping the newlines so that offsets still give line numbers.
    prose = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)
    out = []
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # https:, mailto: ...
        out.append((prose.count("\n", 0, match.start(1)) + 1, target))
    return out


def broken(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page: Path) -> None:
    assert broken(page) == []


def test_the_pages_are_there_and_the_readme_is_short() -> None:
    names = {path.name for path in PAGES}
    assert {"machines.md", "sessions.md", "server.md", "decisions.md", "benchmarks.md"} <= names
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 500


def test_a_wrapped_link_and_a_code_span_are_read_as_github_reads_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\nSee [the\ntop](#top), `[not](#a-link)`, [gone](#gone).\n")
    assert links(page) == [(4, "#top"), (4, "#gone")]


def test_the_slug_follows_githubs_rules() -> None:
    assert slug("Models, retries and failures") == "models-retries-and-failures"
    scaling = "Scaling, 1k to 1M entries (`bench_core.py`)"
    assert slug(scaling) == "scaling-1k-to-1m-entries-bench_corepy"
    assert slug("Tree navigator (TUI)") == "tree-navigator-tui"
    assert slug("`turn`") == "turn"
    assert slug("D27. One writer per session") == "d27-one-writer-per-session"
