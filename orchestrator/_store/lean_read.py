"""Read a session file into a lean context of its last entry, in one pass (``plan``, issue 37).

A compaction plan reads of each message its estimate, its role and the last reply's usage
(:mod:`~orchestrator._core.lean`). On a linear file, the usual one (each entry's parent is the
entry before it), the active path is every entry in file order, so the file can be read once in
outline (as ``check`` reads it: every line checked whole, the same problems as a full load) while
each entry, whole, goes into a lean context on its way: the process never holds the messages'
text. ``plan --json`` at 40,000 entries held 111 MB; this way 63 MB. Small files are loaded
whole all the same (:data:`LEAN_FROM_BYTES`).

Anything else gives ``None``, and the caller loads the whole file as before: a file that
branches (it stops reading at the first entry whose parent is not the one before), one that
migrates (versions 1 and 2, which are not outlined), one without a header, and a path whose
context must be measured again (:class:`~orchestrator._core.lean.BodiesNeeded`: a context edit
of a message already in it, a compaction after a system message or an edit). What was read
by then is the cost of trying.
"""

from __future__ import annotations

import os

from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.entries import Entry
from orchestrator._core.lean import BodiesNeeded
from orchestrator._core.load_result import Problem
from orchestrator._core.loading import gc_paused
from orchestrator._store.jsonl_io import read_outline

_MISSING = object()

LEAN_FROM_BYTES = 16 << 20
"""Files from this size on are worth a lean read (16 MiB: about 25,000 entries of a coding
session). Letting each entry's text go costs its freeing, about a sixth more CPU time than a
whole load, which keeps everything until the process exits; below this size the whole load
holds under 80 MB anyway, and above it the lean read saves hundreds (tests/bench/bench_vs_pi.py:
at 200,000 entries 221 MB against 468 MB)."""


def worth_reading_lean(path: str) -> bool:
    """Whether the file at ``path`` is big enough for :func:`read_lean` (see its size above)."""
    try:
        return os.stat(path).st_size >= LEAN_FROM_BYTES
    except OSError:
        return False  # the whole load reports why it cannot read it


class _Branched(Exception):
    """The file is not linear: its last entry's path is not every entry."""


class _Linear:
    """Takes each entry of a linear file into a lean context; stops at the first branch."""

    def __init__(self) -> None:
        self.builder = ContextBuilder(lean=True)
        self.count = 0
        self._previous: object = None

    def take(self, entry: Entry) -> Entry:
        """Push ``entry``; what the context keeps of it is the outline the load keeps too."""
        # Irregular as the loader counts it (``reading.read_entries``): a later entry whose
        # parent is not the entry before. The first entry's root is the loader's to judge.
        if self.count and entry.get("parentId", _MISSING) != self._previous:
            raise _Branched
        self.count += 1
        self._previous = entry["id"]
        return self.builder.push(entry)


def read_lean(path: str) -> tuple[list[Problem], SessionContext] | None:
    """The load problems of the session file at ``path`` and the lean context of its last entry.

    ``None`` when the file cannot be read that way (see the module comment): load it whole.

    Raises:
        SessionError: The file cannot be read (permissions, a folder...).
    """
    linear = _Linear()
    try:
        with gc_paused():
            result = read_outline(path, taken=linear.take)
    except (_Branched, BodiesNeeded):
        return None
    index = result.index
    if result.header is None or index is None or not index.linear:
        return None
    if result.migrated or linear.count != len(result.entries):
        return None
    return result.problems, linear.builder.context()
