"""What compaction planning reads of a context: :class:`ContextIndex`, a fixed-length view.

The :class:`~orchestrator._core.context.ContextBuilder` keeps, up to date as the context grows,
the path position of every context message, running sums of the estimates, the last
compaction, the file operations of every assistant tool call (and where each path was first
touched), and what a summary request needs of each message (its serialized length, shape and
parts, measured on first need: :mod:`~orchestrator._core.measures`). Its lists only grow until
a compaction starts new ones, so a view with fixed lengths never changes; planning reads it in
O(kept + summarized range), never walking the window (issue 9).
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from orchestrator._core.entries import Entry, Message
from orchestrator._core.measured_messages import MeasuredMessages
from orchestrator._core.measures import Measures, OnDemand
from orchestrator._core.window import Window

T = TypeVar("T")


class Snapshot(Sequence[T], Generic[T]):
    """A read-only view of the first ``length`` items of an append-only list.

    The builder only ever appends to its lists (a compaction starts new ones), so a view with a
    fixed length never changes: it is as immutable as a tuple, without the O(n) copy. That is
    what keeps "context after one more entry" O(1).
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: Sequence[T], length: int | None = None) -> None:
        self._items = items
        self._length = len(items) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            return tuple(self._items[start:stop:step])
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("snapshot index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[T]:
        return itertools.islice(self._items, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Snapshot | tuple | list):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=False)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Snapshot({list(self)!r})"


FILE_TOOLS = frozenset({"read", "write", "edit"})
"""Tools whose ``path`` argument counts as a file operation (as pi tracks them, D16)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextIndex:
    """What planning needs about a context and its path, as of one moment (a fixed length).

    The builder only appends to the lists referenced here until the next compaction, which
    starts new ones, so a view with fixed lengths never changes.

    Attributes:
        path: The builder's path (append-only); only ``path[:path_length]`` belongs to this view.
        path_length: Entries on the path at this moment.
        position: Path position of each id on the path (append-only; bounded by ``path_length``).
        positions: Path position of each context message.
        prefix: ``prefix[k] - prefix[0]`` is the sum of the first ``k`` estimates. The kept
            budget counts every message after the compaction's own (pi 1.x counts custom
            messages and branch summaries too), so it reads these sums from ``base``.
        count: Context messages at this moment.
        base: Messages the latest compaction gives (its system checkpoint, if any, and its
            summary): 0 without a compaction.
        last_compaction: Path position of the last compaction, ``-1`` if none.
        context_start: Path position of the first entry the context takes (the compaction's
            first kept entry, or 0).
        last_invalidating: Path position of the last compaction or context edit, ``-1`` if none:
            a provider usage recorded at or before it no longer describes the context (pi 1.x).
        system: Indices of the context's system messages, ascending.
        event_message: For each file operation, the context message (index) that made it.
        event_kind: For each file operation, the tool (``read``, ``write``, ``edit``).
        event_path: For each file operation, the path argument.
        events: File operations at this moment.
        first_seen: Per tool, each path with the first context message (index) that used it, in
            that order (append-only: a path is added once).
        late: Indices of the messages of a role measured late (summaries), ascending.
        measures: The serialized lengths, shapes and parts of the messages, measured on first
            need (:mod:`~orchestrator._core.measures`): read them through :attr:`serial`,
            :attr:`shapes` and :attr:`parts`, which measure this view's messages first.

    The running sums start where the sums they were cut from stood, not at 0: a compaction's
    restart keeps the kept messages' sums as they were (a slice, copied in C) instead of
    subtracting the dropped part from each (issue 9). Only differences are read.
    """

    path: list[Entry] = field(repr=False)
    path_length: int
    position: dict[str, int] = field(repr=False)
    positions: Sequence[int] = field(repr=False)
    prefix: Sequence[int] = field(repr=False)
    count: int
    base: int
    last_compaction: int
    context_start: int
    last_invalidating: int
    system: Sequence[int] = field(repr=False)
    event_message: Sequence[int] = field(repr=False)
    event_kind: list[str] = field(repr=False)
    event_path: list[str] = field(repr=False)
    events: int
    first_seen: dict[str, dict[str, int]] = field(repr=False)
    late: Sequence[int] = field(repr=False)
    measures: Measures = field(repr=False)

    @property
    def serial(self) -> Sequence[int]:
        """Running sums of the messages' serialized lengths, measured first.

        ``serial[k] - serial[0]`` is the sum of ``serial_step`` of the serialized lengths of the
        first ``k`` messages (see :class:`MeasuredMessages`), those in ``late`` counting 0.
        """
        self.measures.upto(self.count)
        return self.measures.serial

    @property
    def shapes(self) -> Sequence[int]:
        """Each message's shape (``SHAPE_*`` of ``_core.serialize``), measured first.

        A summary request writes the usual shapes without checking them again.
        """
        self.measures.upto(self.count)
        return self.measures.shapes

    @property
    def parts(self) -> Sequence[Any]:
        """Two items per message, measured first: what a summary request writes it from.

        Its text and tool call (``measure_shaped`` of ``_core.serialize``); ``None`` for other
        shapes.
        """
        self.measures.upto(self.count)
        return self.measures.parts

    def matches(self, path: Sequence[Entry]) -> bool:
        """True when ``path`` is the path this view was built from (same length, same ends)."""
        if len(path) != self.path_length:
            return False
        return not path or (
            path[-1] is self.path[-1 + self.path_length] and path[0] is self.path[0]
        )

    def position_of(self, entry_id: object) -> int | None:
        """Path position of an entry id, ``None`` when it is not on the path (by this moment)."""
        if not isinstance(entry_id, str):
            return None
        at = self.position.get(entry_id)
        return at if at is not None and at < self.path_length else None

    def estimate_before(self, index: int) -> int:
        """Sum of the estimates of the context messages before ``index``."""
        return self.prefix[index] - self.prefix[0]

    def messages_between(self, start: int, end: int) -> tuple[int, int]:
        """Context message indices ``[lo, hi)`` of the path positions ``[start, end)``."""
        lo = bisect.bisect_left(self.positions, start, self.base, self.count)
        hi = bisect.bisect_left(self.positions, end, lo, self.count)
        return lo, hi

    def budget_position(self, keep_recent_tokens: int) -> int | None:
        """Path position where the newest messages reach ``keep_recent_tokens`` (pi's budget).

        pi counts every message after the compaction's own, newest first, passing those that
        count 0. From the running sums, the answer is the newest message whose sum to the end
        reaches the budget: a binary search, not a walk of the kept part (issue 9).
        """
        totals = self.prefix
        if keep_recent_tokens > 0:
            # The newest k with totals[k] <= total - keep: message k - 1 then counts more than 0
            # and the sum from it to the end reaches the budget.
            k = bisect.bisect_right(
                totals, totals[self.count] - keep_recent_tokens, self.base, self.count
            )
            return self.positions[k - 1] if k > self.base else None
        for k in range(self.count, self.base, -1):  # a budget of 0: the newest that counts
            if totals[k] > totals[k - 1]:
                return self.positions[k - 1]
        return None

    def file_operations(self, lo: int, hi: int) -> dict[str, set[str]]:
        """Paths per tool for the tool calls of context messages ``[lo, hi)``.

        From the first message after the summary (what planning asks for), this costs the
        number of distinct paths, not of tool calls.
        """
        found: dict[str, set[str]] = {"read": set(), "write": set(), "edit": set()}
        if lo <= self.base:  # every tool call is at or after the base: a prefix of first uses
            for kind, first_seen in self.first_seen.items():
                # First uses are in message order, so the paths first used before `hi` are a
                # prefix of the keys (issue 9). Usually all of them: then the set is made from
                # the dict itself, with the hashes it keeps, never reading the paths.
                if not first_seen or next(reversed(first_seen.values())) < hi:
                    found[kind] = set(first_seen)
                else:
                    used = bisect.bisect_left(list(first_seen.values()), hi)
                    found[kind] = set(itertools.islice(first_seen, used))
            return found
        first = bisect.bisect_left(self.event_message, lo, 0, self.events)
        last = bisect.bisect_left(self.event_message, hi, first, self.events)
        kinds, paths = self.event_kind, self.event_path
        for i in range(first, last):
            found[kinds[i]].add(paths[i])
        return found

    def conversation(self, lo: int, hi: int) -> range | list[int]:
        """Indices of context messages ``[lo, hi)`` that a summary reads: all but system ones.

        System messages are prompt state, not conversation (pi 1.x leaves them out of what it
        summarizes). Usually there are none in the range, or only the session's first at its
        start: then it is a range, and windows on it are not copied.
        """
        system = self.system
        first = bisect.bisect_left(system, lo)
        last = bisect.bisect_left(system, hi, first)
        while first < last and system[first] == lo:
            first, lo = first + 1, lo + 1
        if first == last:
            return range(lo, hi)
        skipped = set(system[first:last])
        return [k for k in range(lo, hi) if k not in skipped]

    def measured(self, messages: Sequence[Message], chosen: range | list[int]) -> MeasuredMessages:
        """The context messages at ``chosen`` (:meth:`conversation`), their lengths known.

        For a range it is a window, not copied (O(1)). ``messages`` are the context's
        messages (this view's ``count`` of them).
        """
        late = self.late
        if isinstance(chosen, range):
            lo, hi = chosen.start, chosen.stop
            first = bisect.bisect_left(late, lo)
            last = bisect.bisect_left(late, hi, first)
            measures, count = self.measures, self.count
            serial: Sequence[int] = measures.serial
            shapes: Sequence[int] = measures.shapes
            parts: Sequence[Any] = measures.parts
            if len(shapes) < count:  # read when a summary request is made, not when planned
                serial = OnDemand(measures, count, "serial")
                shapes = OnDemand(measures, count, "shapes")
                parts = OnDemand(measures, count, "parts")
            return MeasuredMessages.window(
                _underlying(messages),
                lo,
                hi,
                serial,
                (late[i] - lo for i in range(first, last)),
                shapes,
                parts,
            )
        # Some system messages in the middle: the run is made of the others, its sums too.
        serial, shapes, parts = self.serial, self.shapes, self.parts
        late_set = set(late)
        sums = array("q", [0])
        for k in chosen:
            sums.append(sums[-1] + serial[k + 1] - serial[k])
        return MeasuredMessages.window(
            [messages[k] for k in chosen],
            0,
            len(chosen),
            sums,
            [j for j, k in enumerate(chosen) if k in late_set],
            array("b", (shapes[k] for k in chosen)),
            [part for k in chosen for part in (parts[2 * k], parts[2 * k + 1])],
        )


def chosen(items: Sequence[T], at: range | list[int]) -> Sequence[T]:
    """The items of a context's sequence at :meth:`ContextIndex.conversation`'s indices."""
    if isinstance(at, range):
        return window(items, at.start, at.stop)
    return tuple(items[k] for k in at)


def window(items: Sequence[T], lo: int, hi: int) -> Window[T]:
    """``items[lo:hi]`` of a context's sequence (``messages``, ``entry_ids``...), not copied."""
    return Window(_underlying(items), lo, hi - lo)


def _underlying(items: Sequence[T]) -> Sequence[T]:
    # A snapshot's list only grows, so a window may read it directly (one indirection less).
    return items._items if isinstance(items, Snapshot) else items
