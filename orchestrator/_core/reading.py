"""The pass over a session file's lines: decode each, check its id, note its links and usage.

:mod:`~orchestrator._core.loading` decides what a file is (header, version, migration, which
problems stop a write); this module reads its entries, in one pass. On a big file every pass
per entry counts, and a pass over entries decoded long before is a cache miss per entry (each
entry's dictionaries are cold by then): so while an entry is fresh from its line, the pass also
notes whether its parent is the entry before it (the usual case: only the others are looked up
afterwards, :func:`link_problems`) and checks its usage counts
(:func:`~orchestrator._core.usage_check.entry_usage_problems`). Both notes hold for the entries
as read; a migration that rewrites them has the loader check them again from scratch.

Held for long (a server keeps an open session's entries), the entries of a big file are mostly
small strings that say the same thing: the decoder makes a new ``"message"``, ``"assistant"``,
``"text"``, provider and model name for every line, and a new copy of each parent's id. Of a
200,000-entry session's 390 MB of objects, about 85 MB were such copies (issue 35). So the pass
makes each entry's ``parentId`` the very string of the id before it (one store, when the entry
follows its parent), and, in a file of :data:`SHARE_FROM_BYTES` or more, makes each message's
words one string each (:func:`share_words`). Only the objects change, never a value: the entries
compare, print and encode exactly as before. The words cost about a fifth more CPU than the
decode alone (1.1 µs an entry), which a small file, whose memory hardly matters, is spared.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import Entry
from orchestrator._core.json_lines import BadLine
from orchestrator._core.load_result import Problem
from orchestrator._core.usage_check import entry_usage_problems

_MISSING = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadEntries:
    """What :func:`read_entries` found.

    Attributes:
        entries: The objects read, in file order (checked for a usable id when asked).
        numbers: Each entry's 1-based line.
        line_of: Each id's line (empty when ids were not checked).
        irregular: Indices of the entries whose parent is not the entry before (ids checked).
        usage_problems: The ``bad_usage`` problems of the entries, in line order.
        by_id: Each entry by its id (empty when ids were not checked).
    """

    entries: list[Entry]
    numbers: list[int]
    line_of: dict[str, int]
    irregular: list[int]
    usage_problems: list[Problem]
    by_id: dict[str, Entry]

    def linear(self) -> bool:
        """Each entry's parent is the entry before it, and the first is a root (ids checked)."""
        if not self.irregular:
            return True
        if self.irregular != [0]:
            return False
        parent = self.entries[0].get("parentId")  # a root, as the tree sees one
        return not isinstance(parent, str) or parent == self.entries[0]["id"]


def read_entries(
    batches: Iterable[tuple[int, list[bytes]]],
    problems: list[Problem],
    decode: Callable[[bytes], Any],
    *,
    with_ids: bool,
    outline: bool = False,
    taken: Callable[[Entry], Entry] | None = None,
) -> ReadEntries:
    """Decode the lines of ``batches`` (``(index of the first, lines)``) into entries.

    Lines that cannot be entries are reported in ``problems`` and skipped. Flat lists rather
    than a tuple per entry, and the id checks of :func:`with_usable_ids` done in the same pass
    when ``with_ids``. ``outline`` (with ids only): keep of each entry only what the load's
    checks and the tree read (:func:`outline_of`), once its line has been checked whole.
    ``taken`` (with ``outline``) makes the outlines instead: it is handed each whole entry, in
    file order, and returns what to keep of it (at least what :func:`outline_of` keeps), so a
    caller reads what it needs of each entry while the pass lets the rest go (``plan``).
    """
    entries: list[Entry] = []
    numbers: list[int] = []
    first_line: dict[str, int] = {}
    by_id: dict[str, Entry] = {}
    irregular: list[int] = []
    usage: list[Problem] = []
    previous: object = None  # before the first entry: a null parent is a root either way
    for index, lines in batches:
        number = index
        for raw in lines:
            number += 1
            if not raw or raw.isspace():
                continue
            try:
                value = decode(raw)
            except BadLine as bad:
                problems.append(Problem(line=number, code=bad.code, message=bad.message))
                continue
            kind = value.get("type") if type(value) is dict else _NOT_AN_OBJECT
            if kind == "session" or kind is _NOT_AN_OBJECT:
                problems.append(_not_an_entry(value, number))
                continue
            if with_ids:
                entry_id = value.get("id")
                if type(entry_id) is not str or not entry_id or entry_id in first_line:
                    problems.append(_id_problem(value, number, first_line))
                    continue
                first_line[entry_id] = number
                if value.get("parentId", _MISSING) != previous:
                    irregular.append(len(entries))
                else:  # one string for the id and the links to it (None stays None)
                    value["parentId"] = previous
                by_id[entry_id] = value
                previous = entry_id
            usage += _usage_problems(value, number) if kind == "message" else ()
            if outline:  # with ids: ``by_id`` holds the outline too
                value = by_id[entry_id] = _outlined(value, taken)
            entries.append(value)
            numbers.append(number)
    return ReadEntries(
        entries=entries,
        numbers=numbers,
        line_of=first_line,
        irregular=irregular,
        usage_problems=usage,
        by_id=by_id,
    )


_NOT_AN_OBJECT = object()

SHARE_FROM_BYTES = 16 << 20
"""Files this big or bigger have their messages' words shared (:func:`share_words`)."""
_MESSAGE_WORDS = ("role", "api", "provider", "model", "stopReason", "toolName")
_BLOCK_WORDS = ("type", "name")
_intern = sys.intern


def share_words(entry: Entry) -> None:
    """Make the words a session repeats in each message one string each (see the module doc).

    The entry's type, its message's role, provider, model, API, stop reason and tool name, and
    each content block's type and tool name. ``sys.intern``: an interned string lives only as
    long as something holds it, so a file of a million different model names costs nothing
    after it is closed.
    """
    entry["type"] = "message"
    message = entry.get("message")
    if type(message) is not dict:
        return
    for key in _MESSAGE_WORDS:
        word = message.get(key)
        if type(word) is str:
            message[key] = _intern(word)
    content = message.get("content")
    if type(content) is list:
        for block in content:
            if type(block) is dict:
                for key in _BLOCK_WORDS:
                    word = block.get(key)
                    if type(word) is str:
                        block[key] = _intern(word)


def sharing_words(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``decode``, with :func:`share_words` done on each message entry it decodes."""

    def decoded(raw: bytes) -> Any:
        value = decode(raw)
        if type(value) is dict and value.get("type") == "message":
            share_words(value)
        return value

    return decoded


OUTLINE_KEYS = frozenset({"type", "id", "parentId", "firstKeptEntryId", "targetId"})
"""What an outlined entry keeps: its place in the tree and the references the load checks."""


def _outlined(entry: Entry, taken: Callable[[Entry], Entry] | None) -> Entry:
    return outline_of(entry) if taken is None else taken(entry)


def outline_of(entry: Entry) -> Entry:
    """The fields of ``entry`` named in :data:`OUTLINE_KEYS` that it has, in a new dict.

    ``check`` reads only the problems and the tree's size: an entry's message, summary and
    details are decoded (the line must be checked whole, D3: a skipping parser would pass a
    number beyond a double's range or invalid UTF-8 in the text it skips) but let go at once,
    so a 200,000-entry file is checked in a fraction of the memory its full load takes.
    """
    return {key: value for key, value in entry.items() if key in OUTLINE_KEYS}


def _not_an_entry(value: object, number: int) -> Problem:
    """The problem of a line that is JSON but no entry: not an object, or a second header."""
    if type(value) is not dict:
        message = f"a JSON {_json_kind(value)}, not an object; skipped"
        return Problem(line=number, code="not_object", message=message)
    return Problem(line=number, code="bad_header", message="a second session header; skipped")


def _usage_problems(entry: Entry, number: int) -> list[Problem]:
    message = entry.get("message")
    counts = message.get("usage") if type(message) is dict else None
    return entry_usage_problems(entry, number, counts) if type(counts) is dict else []


def _id_problem(entry: Entry, number: int, first_line: dict[str, int]) -> Problem:
    entry_id = entry.get("id")
    if type(entry_id) is str and entry_id in first_line:
        message = (
            f"entry id {entry_id!r} was already used on line {first_line[entry_id]}; "
            "this later entry is skipped"
        )
        return Problem(line=number, code="duplicate_id", message=message)
    kind = entry.get("type")
    what = f"a {kind!r} entry" if isinstance(kind, str) else "an entry"
    return Problem(line=number, code="no_id", message=f"{what} without an id; skipped")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "array"


def with_usable_ids(
    entries: list[Entry], numbers: list[int], problems: list[Problem]
) -> tuple[list[Entry], list[int], dict[str, int]]:
    """Drop entries without a usable id or with a used one; map each id to its line."""
    first_line: dict[str, int] = {}
    kept: list[Entry] = []
    kept_numbers: list[int] = []
    for entry, number in zip(entries, numbers, strict=True):
        entry_id = entry.get("id")
        if type(entry_id) is not str or not entry_id or entry_id in first_line:
            problems.append(_id_problem(entry, number, first_line))
            continue
        first_line[entry_id] = number
        kept.append(entry)
        kept_numbers.append(number)
    return kept, kept_numbers, first_line


def _irregular(entries: Sequence[Entry]) -> list[int]:
    """Indices of the entries whose parent is not the entry before them in the file."""
    found: list[int] = []
    previous: object = None
    for k, entry in enumerate(entries):
        if entry.get("parentId", _MISSING) != previous:
            found.append(k)
        previous = entry["id"]
    return found


def link_problems(
    entries: list[Entry],
    numbers: list[int],
    line_of: dict[str, int],
    irregular: Sequence[int] | None = None,
) -> list[Problem]:
    """Report parents that do not exist and parent chains that loop.

    Only the entries whose parent is not the entry before them in the file are looked at
    (``irregular``, found here when not given): an earlier line, no lookup in a dictionary of
    every id (on a big file, a cache miss per entry). Most entries are the other kind.

    Every cycle has a member whose parent comes later in the file (line numbers cannot fall all
    the way round a loop), so the cycle walk starts only from such forward links. pi writes a
    child after its parent, so on its files there are none and no walk happens at all.
    """
    problems: list[Problem] = []
    forward: list[str] = []
    for k in _irregular(entries) if irregular is None else irregular:
        entry, number = entries[k], numbers[k]
        entry_id, parent = entry["id"], entry.get("parentId", _MISSING)
        if parent is None or parent == entry_id:
            continue  # a root, as pi's getTree sees it
        if type(parent) is str:
            parent_line = line_of.get(parent)
            if parent_line is not None:
                if parent_line > number:
                    forward.append(entry_id)
                continue
        if parent is _MISSING:
            message = f"entry {entry_id!r} has no parentId field; kept as a root"
        else:
            shown = repr(parent) if isinstance(parent, str) else f"{json.dumps(parent)} (not an id)"
            message = f"parent {shown} of entry {entry_id!r} does not exist; kept as a root"
        problems.append(Problem(line=number, code="unknown_parent", message=message))
    if forward:
        parent_of = {
            entry["id"]: entry["parentId"]
            for entry in entries
            if type(entry.get("parentId")) is str
            and entry["parentId"] in line_of
            and entry["parentId"] != entry["id"]
        }
        problems.extend(_cycles(forward, parent_of, line_of))
    return problems


def _cycles(starts: list[str], parent_of: dict[str, str], line_of: dict[str, int]) -> list[Problem]:
    # Each entry has at most one parent, so the graph is a functional graph: walking parents
    # from any entry either ends or enters exactly one cycle. Colouring makes it linear.
    done: set[str] = set()
    problems: list[Problem] = []
    for start in starts:
        walk: list[str] = []
        on_walk: set[str] = set()
        node: str | None = start
        while node is not None and node not in done and node not in on_walk:
            walk.append(node)
            on_walk.add(node)
            node = parent_of.get(node)
        if node is not None and node in on_walk:
            members = walk[walk.index(node) :]
            first = min(members, key=line_of.__getitem__)
            # Name the members in chain order starting from the one earliest in the file.
            at = members.index(first)
            ordered = members[at:] + members[:at]
            chain = " -> ".join(repr(member) for member in [*ordered, first])
            message = f"entries form a parent cycle ({chain}); each has a parent but none is a root"
            problems.append(Problem(line=line_of[first], code="cycle", message=message))
        done.update(walk)
    return problems
