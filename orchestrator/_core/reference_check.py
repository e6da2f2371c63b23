"""Name the compactions and context edits whose reference is not on their path (D3).

A compaction's ``firstKeptEntryId`` names the first entry it keeps from before it, so it must be
an ancestor of the compaction; pi 1.x's retain-none compaction names the compaction itself, which
is valid. A ``context_edit``'s ``targetId`` names the earlier entry it omits or replaces, so it
too must be an ancestor. pi never writes anything else; a damaged or hand-made file can. What
the context does then: a compaction keeps nothing from before it (pi's fallback), and an edit
whose target is missing or on another branch changes nothing. ``check`` says so with the line,
as ``kept_off_path`` and ``edit_target_off_path``; the entries are kept verbatim (D2), so a
rewrite is not refused.

Ancestry is answered by the entry and exit times of one depth-first walk over the whole tree,
so a file with many edits costs one linear pass, not a walk up the path per edit; and a file
with none (most) costs only the pass that looks for them. An entry in a parent cycle is never
reached from a root: it is reported as ``cycle`` already, and not here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator._core.entries import COMPACTION, CONTEXT_EDIT, Entry
from orchestrator._core.load_result import Problem


def reference_problems(
    entries: Sequence[Entry], numbers: Sequence[int], line_of: Mapping[str, int]
) -> list[Problem]:
    """A problem for each compaction or context edit whose reference is not on its path.

    Args:
        entries: The entries read, in file order, each with a string id.
        numbers: Each entry's 1-based line.
        line_of: Each id's line.
    """
    references = _references(entries, numbers)
    if not references:
        return []
    enter, leave = _walk_times(entries, line_of)
    problems: list[Problem] = []
    for entry, number, target in references:
        here = entry["id"]
        if here not in enter:
            continue  # in a parent cycle: reported as such
        if target not in line_of:
            where = "no entry has that id"
        elif target in enter and enter[target] < enter[here] and leave[here] < leave[target]:
            continue  # an ancestor: as pi writes it
        elif target in enter and enter[here] < enter[target] and leave[target] < leave[here]:
            where = "it comes after it"
        else:
            where = "it is on another branch"
        problems.append(_problem(entry, number, target, where))
    return problems


def _references(entries: Sequence[Entry], numbers: Sequence[int]) -> list[tuple[Entry, int, str]]:
    """Each compaction and context edit with the id it names, and its line."""
    references: list[tuple[Entry, int, str]] = []
    for entry, number in zip(entries, numbers, strict=True):
        kind = entry.get("type")
        if kind == COMPACTION:
            kept = entry.get("firstKeptEntryId")
            if isinstance(kept, str) and kept != entry["id"]:  # its own id: retain-none
                references.append((entry, number, kept))
        elif kind == CONTEXT_EDIT:
            target = entry.get("targetId")
            if isinstance(target, str):
                references.append((entry, number, target))
    return references


def _problem(entry: Entry, number: int, target: str, where: str) -> Problem:
    if entry.get("type") == COMPACTION:
        message = (
            f"compaction {entry['id']!r} keeps from {target!r}, which is not on its path "
            f"({where}); its context keeps nothing from before it"
        )
        return Problem(line=number, code="kept_off_path", message=message)
    effect = "it changes nothing" if where != "it comes after it" else "pi edits earlier entries"
    message = (
        f"context edit {entry['id']!r} targets {target!r}, which is not on its path "
        f"({where}); {effect}"
    )
    return Problem(line=number, code="edit_target_off_path", message=message)


def _walk_times(
    entries: Sequence[Entry], line_of: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Entry and exit times of a depth-first walk from every root (pi's roots: see loading)."""
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for entry in entries:
        entry_id, parent = entry["id"], entry.get("parentId")
        if type(parent) is str and parent != entry_id and parent in line_of:
            children.setdefault(parent, []).append(entry_id)
        else:
            roots.append(entry_id)
    enter: dict[str, int] = {}
    leave: dict[str, int] = {}
    clock = 0
    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            clock += 1
            if done:
                leave[node] = clock
                continue
            enter[node] = clock
            stack.append((node, True))
            stack.extend((child, False) for child in children.get(node, ()))
    return enter, leave
