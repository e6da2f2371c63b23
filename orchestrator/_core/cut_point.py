"""Where a compaction cuts the path (pi 1.x's findProjectedCutPoint; decisions D9, D10).

Theory of operation. A compaction keeps the newest ``keep_recent_tokens`` of the window verbatim
and summarizes the rest. The first kept entry must be a *valid cut point*: an entry the context
can start with. A tool result never is, because it must follow the assistant message that made
the call; otherwise the kept context would open with an orphan result.

pi 1.x decides on the *projection* of the path: each entry with the messages it gives the
context once context edits are applied (an omitted entry gives none), the latest compaction and
the system messages it kept left out. A :class:`Projection` answers that for path positions.
:func:`find_cut_point` walks the window newest-first and adds the estimates of every entry's
messages until the budget is spent, then picks a cut point near there:

* D9 (pi 1.x does it too): when the budget runs out inside trailing tool results (no cut point
  at or after the position), cut at the last cut point before it, the assistant that made the
  calls, rather than keeping everything.
* pi 1.x: a cut followed only by an omitted attempt and its edits (what overflow recovery leaves)
  moves past the visible input to the omitted attempt.
* The cut is pulled back over entries that give no message (model or thinking changes, labels,
  omitted entries) so they stay with what they describe. D10: pi then asks "does the cut start
  a turn?" of the pulled entry, answers no, and turns the whole previous turn into a "turn
  prefix". I look past the pulled entries at the first one that gives a message instead.

I also report a turn as split only when its prefix is non-empty. pi can say "split" with an empty
prefix (a cut on a custom message, a branch summary or a bash execution); its executor treats that
exactly like an unsplit turn, so the flag carried no information, only noise in plans.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.context import ContextBuilder, ContextIndex
from orchestrator._core.entries import (
    COMPACTION,
    CONTEXT_EDIT,
    Entry,
    Message,
    entry_message,
    is_system_entry,
    role_of,
)
from orchestrator._core.tokens import estimate_tokens

CUT_ROLES = frozenset(
    {
        "user",
        "assistant",
        "bashExecution",
        "branchSummary",
        "compactionSummary",
        "custom",
        "hookMessage",
    }
)
"""Message roles a kept region may start with (never ``toolResult`` or ``system``)."""

TURN_START_ROLES = frozenset(
    {"user", "bashExecution", "custom", "hookMessage", "branchSummary", "compactionSummary"}
)
"""Message roles that open a turn."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CutPoint:
    """The result of :func:`find_cut_point`, as indices into the path.

    Attributes:
        first_kept_index: Index of the first entry kept verbatim.
        turn_start_index: Index of the entry that opens the split turn, ``-1`` when not split.
        is_split_turn: True when the cut falls inside a turn whose beginning is summarized
            separately (the entries ``[turn_start_index, first_kept_index)``).
    """

    first_kept_index: int
    turn_start_index: int
    is_split_turn: bool


class Projection:
    """The projection of a path as one context sees it, by path position (pi 1.x).

    Args:
        path: The root-first path.
        view: The index of the context built from ``path``.
        messages: That context's messages.
    """

    __slots__ = ("_path", "_view", "_messages")

    def __init__(self, path: Sequence[Entry], view: ContextIndex, messages: Sequence[Message]):
        self._path, self._view, self._messages = path, view, messages

    @classmethod
    def of(cls, path: Sequence[Entry], end: int) -> Projection:
        """The projection of ``path[:end]``, built here."""
        context = ContextBuilder(path[:end]).context()
        assert context.index is not None  # the builder always indexes
        return cls(path, context.index, context.messages)

    def present(self, at: int) -> bool:
        """Whether the entry at ``at`` is in the projection's window at all."""
        view = self._view
        last = view.last_compaction
        if at == last or at < view.context_start:
            return False
        return not (at < last and is_system_entry(self._path[at]))

    def messages(self, at: int) -> Sequence[Message]:
        """The messages the entry at ``at`` gives the context (none when absent or omitted)."""
        view = self._view
        lo = bisect.bisect_left(view.positions, at, view.base, view.count)
        hi = bisect.bisect_right(view.positions, at, lo, view.count)
        return self._messages[lo:hi] if lo < hi else ()

    def _roles(self, at: int, roles: frozenset[str]) -> bool:
        if not self.present(at) or self._path[at].get("type") == COMPACTION:
            return False
        return any(message.get("role") in roles for message in self.messages(at))

    def is_cut_point(self, at: int) -> bool:
        """True when a kept region may start at ``at`` (pi's valid cut points)."""
        return self._roles(at, CUT_ROLES)

    def starts_turn(self, at: int) -> bool:
        """True when the entry at ``at`` opens a turn (a user message, a custom message...)."""
        return self._roles(at, TURN_START_ROLES)


def is_cut_point(entry: Mapping[str, Any]) -> bool:
    """True when a kept region may start at ``entry`` of a path without context edits."""
    if entry.get("type") == COMPACTION:
        return False
    message = entry_message(entry)
    return message is not None and message.get("role") in CUT_ROLES


def valid_cut_points(
    entries: Sequence[Entry], start: int, end: int, projection: Projection | None = None
) -> list[int]:
    """Indices in ``[start, end)`` where a kept region may start, ascending."""
    seen = projection or Projection.of(entries, end)
    return [i for i in range(start, end) if seen.is_cut_point(i)]


def find_turn_start_index(
    entries: Sequence[Entry], index: int, start: int, projection: Projection | None = None
) -> int:
    """Index of the turn start at or before ``index`` (not before ``start``), ``-1`` if none."""
    seen = projection or Projection.of(entries, index + 1)
    for i in range(index, start - 1, -1):
        if seen.starts_turn(i):
            return i
    return -1


def _budget_index(seen: Projection, start: int, end: int, keep_recent_tokens: int) -> int | None:
    # Newest first, every message of the window counts: the position where the budget runs out.
    accumulated = 0
    for i in range(end - 1, start - 1, -1):
        if not seen.present(i):
            continue
        tokens = sum(map(estimate_tokens, seen.messages(i)))
        if tokens == 0:
            continue
        accumulated += tokens
        if accumulated >= keep_recent_tokens:
            return i
    return None


def _omitted_attempt_follows(
    entries: Sequence[Entry], seen: Projection, cut: int, end: int
) -> bool:
    """Pi 1.x: after the cut, only an omitted assistant attempt and what hides it (no input).

    Overflow recovery omits the failed reply with a context edit before compacting: the cut may
    then pass the last visible input, or the input would be kept with nothing answering it. Not
    when an edit after the cut replaces something other than what it omits.
    """
    omitted: set[str] = set()
    replaced: list[object] = []
    attempt = False
    for i in range(cut + 1, end):
        if not seen.present(i):
            continue
        entry = entries[i]
        kind = entry.get("type")
        if kind == COMPACTION:
            return False
        if kind == CONTEXT_EDIT:
            if entry.get("replacement") is not None:
                replaced.append(entry.get("targetId"))
            continue
        if entry_message(entry) is None:
            continue  # gives no message even unedited: metadata
        if seen.messages(i):
            return False  # something the model sees
        omitted.add(entry["id"])
        attempt = attempt or role_of(entry) == "assistant"
    return attempt and all(target in omitted for target in replaced)


def _first_cut_point(seen: Projection, index: int, end: int) -> int | None:
    return next((i for i in range(index, end) if seen.is_cut_point(i)), None)


def _last_cut_point(seen: Projection, index: int, start: int) -> int | None:
    return next((i for i in range(index - 1, start - 1, -1) if seen.is_cut_point(i)), None)


def _pull_back(entries: Sequence[Entry], seen: Projection, cut: int, start: int) -> int:
    # Keep entries that give no message with the turn they precede. Stops at messages and at an
    # older compaction kept in the range; entries outside the projection are passed over.
    at = cut - 1
    while at >= start:
        if seen.present(at):
            if entries[at].get("type") == COMPACTION or seen.messages(at):
                break
            cut = at
        at -= 1
    return cut


_UNSET: object = object()


def find_cut_point(
    entries: Sequence[Entry],
    start: int,
    end: int,
    keep_recent_tokens: int,
    *,
    spent_at: int | None | object = _UNSET,
    projection: Projection | None = None,
) -> CutPoint:
    """Find the first kept entry of the window ``entries[start:end]`` (pi's cut point).

    Args:
        entries: The root-first path.
        start: First index of the window (the previous compaction's first kept entry, or 0).
        end: One past the last index of the window.
        keep_recent_tokens: Estimated tokens of recent messages to keep verbatim.
        spent_at: Where the budget runs out, when the caller knows it already (planning reads
            it from the context's running sums); by default it is counted here.
        projection: The path's projection, when the caller has its context; else built.

    Returns:
        The cut. With no valid cut point the whole window is kept (``first_kept_index=start``).
    """
    seen = projection or Projection.of(entries, end)
    if spent_at is _UNSET:
        spent_at = _budget_index(seen, start, end, keep_recent_tokens)
    if isinstance(spent_at, int):
        cut = _first_cut_point(seen, spent_at, end)
        if cut is None:  # D9: trailing tool results; keep the call that made them
            cut = _last_cut_point(seen, spent_at, start)
        if cut is not None and _omitted_attempt_follows(entries, seen, cut, end):
            cut = next(i for i in range(cut + 1, end) if seen.present(i))
    else:
        cut = _first_cut_point(seen, start, end)
    if cut is None:
        return CutPoint(first_kept_index=start, turn_start_index=-1, is_split_turn=False)
    cut = _pull_back(entries, seen, cut, start)
    # D10: judge the first entry at or after the cut that gives a message, not what was pulled.
    shown = next((i for i in range(cut, end) if seen.present(i) and seen.messages(i)), None)
    if shown is not None and seen.starts_turn(shown):
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    turn_start = find_turn_start_index(entries, cut, start, seen)
    if turn_start == -1 or turn_start == cut:
        return CutPoint(first_kept_index=cut, turn_start_index=-1, is_split_turn=False)
    return CutPoint(first_kept_index=cut, turn_start_index=turn_start, is_split_turn=True)
