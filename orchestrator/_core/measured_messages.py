"""A run of context messages whose serialized lengths are known: a summary request's conversation.

The summary request serializes the messages it summarizes (:mod:`~orchestrator._core.serialize`
writes each one). A context measures each message's serialized length as it grows
(:mod:`~orchestrator._core.measures`), so a request that must fit a budget finds the oldest
message it needs by a binary search over running sums, and writes only from there
(:class:`MeasuredMessages`), instead of writing the whole conversation and cutting it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator._core.entries import Message
from orchestrator._core.serialize import (
    ASSISTANT_LABEL,
    CALLS_AFTER_TEXT,
    PARAGRAPH_SEPARATOR,
    SHAPE_SHORT_RESULT,
    SHAPE_TEXT_AND_CALL,
    SHAPE_USER_TEXT,
    TOOL_RESULT_LABEL,
    USER_LABEL,
    serial_step,
    serialize_message,
    serialize_shaped,
    serialized_length,
)
from orchestrator._core.utf16 import utf16_len
from orchestrator._core.window import Window


class MeasuredMessages(Window[Message]):
    """Consecutive context messages whose serialized lengths are already known.

    It compares, hashes and iterates as the tuple of its messages (see :class:`Window`).
    ``sums`` are running sums of :func:`serial_step` of the serialized lengths, kept by the
    context as it grows: message ``k`` of this run is between ``sums[start + k]`` and
    ``sums[start + k + 1]``, except the messages listed in ``late`` (of a role in
    :data:`LATE_ROLES`), which count 0 there and are measured here. Without sums it is a plain
    run whose conversation is serialized whole.

    The serialized text of each message is made at most once, and only for the messages asked
    for: :meth:`suffix` finds the oldest message it needs from the sums (a binary search), and
    serializes from there to the newest, keeping those pieces for the next call.
    """

    __slots__ = ("sums", "start", "shapes", "parts", "_late_at", "_late", "_from", "_pieces")

    sums: Sequence[int] | None
    start: int
    shapes: Sequence[int] | None
    parts: Sequence[Any] | None

    def __init__(
        self,
        messages: Iterable[Message] = (),
        sums: Sequence[int] | None = None,
        start: int = 0,
        late: Iterable[int] = (),
    ) -> None:
        items = tuple(messages)
        self._setup(items, 0, len(items), sums, start, late)

    @classmethod
    def window(
        cls,
        items: Sequence[Message],
        lo: int,
        hi: int,
        sums: Sequence[int],
        late: Iterable[int],
        shapes: Sequence[int] | None = None,
        parts: Sequence[Any] | None = None,
    ) -> MeasuredMessages:
        """Messages ``items[lo:hi]`` of a context, not copied (``items`` must only grow).

        ``sums`` are the context's running sums (the run starts at ``lo`` there too); ``late``
        indexes the run; ``shapes`` are the context's message shapes (indexed as ``items``) and
        ``parts`` what :func:`shaped_parts` reads of each (two items per message).
        """
        run = cls.__new__(cls)
        run._setup(items, lo, hi - lo, sums, lo, late)
        run.shapes = shapes
        run.parts = parts if shapes is not None else None
        return run

    def _setup(
        self,
        items: Sequence[Message],
        at: int,
        length: int,
        sums: Sequence[int] | None,
        start: int,
        late: Iterable[int],
    ) -> None:
        Window.__init__(self, items, at, length)
        self.sums = sums
        self.start = start
        self.shapes: Sequence[int] | None = None
        self.parts: Sequence[Any] | None = None
        self._late_at = tuple(late)
        self._late: dict[int, int] | None = None
        self._from = length  # messages [_from, len) are serialized, in _pieces
        self._pieces: list[str] = []

    def _late_steps(self) -> dict[int, int]:
        # Measured on first use, not when a plan is made: `plan --json` never reads templates.
        if self._late is None:
            self._late = {k: serial_step(serialized_length(self[k])) for k in self._late_at}
        return self._late

    def _pieces_from(self, first: int) -> list[str]:
        """:func:`serialize_message` of messages ``[first, len)``, each made once."""
        if first < self._from:
            at = self._start
            items = self._items[at + first : at + self._from]
            if self.shapes is None:
                made = list(map(serialize_message, items))
            else:
                shapes = self.shapes[at + first : at + self._from]
                parts = self.parts[2 * (at + first) : 2 * (at + self._from)] if self.parts else None
                made = serialize_shaped(items, shapes, parts)
            made.extend(self._pieces)
            self._pieces, self._from = made, first
        return self._pieces[first - self._from :]

    def fragments_from(self, first: int) -> tuple[list[str], bool] | None:
        """The text of messages ``[first, len)`` as strings to join, and whether all are ASCII.

        ``"".join(fragments)`` is ``PARAGRAPH_SEPARATOR.join`` of their non-empty paragraphs,
        but no paragraph is made: a message's label, its text and its call go in as they are, so
        a prompt joining them copies each text once (a paragraph per message was a second copy
        of the newest 750,000 characters at 10k entries, fresh memory the kernel faults in page
        by page, issue 9). ``None`` when the context did not keep the messages' shapes.
        """
        if self.shapes is None or self.parts is None or first >= len(self):
            return None
        at, end = self._start + first, self._start + len(self)
        items = self._items[at:end]
        shapes = self.shapes[at:end]
        pairs = iter(self.parts[2 * at : 2 * end])
        out: list[str] = []
        ascii_only = True
        for message, shape, text, call in zip(items, shapes, pairs, pairs, strict=True):
            if shape == SHAPE_USER_TEXT:
                out += (USER_LABEL, text, PARAGRAPH_SEPARATOR)
                ascii_only = ascii_only and text.isascii()
            elif shape == SHAPE_SHORT_RESULT:
                out += (TOOL_RESULT_LABEL, text, PARAGRAPH_SEPARATOR)  # ASCII by its shape
            elif shape == SHAPE_TEXT_AND_CALL:
                out += (ASSISTANT_LABEL, text, CALLS_AFTER_TEXT, call, PARAGRAPH_SEPARATOR)
                ascii_only = ascii_only and text.isascii() and call.isascii()
            else:
                paragraph = serialize_message(message)
                if paragraph:
                    out += (paragraph, PARAGRAPH_SEPARATOR)
                    ascii_only = ascii_only and paragraph.isascii()
        if out:
            out.pop()  # no separator after the last paragraph
        return out, ascii_only

    def first_needed(self, units: int) -> int:
        """The newest message from which the text holds ``units`` units and a separator.

        :meth:`suffix_pieces` starts there (it needs the running sums).
        """
        assert self.sums is not None
        # The run from message k to the end shrinks as k grows: the newest k whose run holds
        # `units` and the separator before the text that follows is where the suffix starts.
        enough = units + len(PARAGRAPH_SEPARATOR)
        count = bisect.bisect_right(range(len(self)), -enough, key=lambda k: -self._run_units(k))
        return max(0, count - 1)

    def units_from(self, first: int) -> int:
        """``utf16_len`` of the text of messages ``[first, len)`` (it needs the running sums)."""
        return max(0, self._run_units(first) - len(PARAGRAPH_SEPARATOR))

    def units(self) -> int:
        """``utf16_len(serialize_conversation(self))``."""
        if self.sums is None:
            return utf16_len(self.text())
        total = self.sums[self.start + len(self)] - self.sums[self.start]
        return max(0, total + sum(self._late_steps().values()) - len(PARAGRAPH_SEPARATOR))

    def text(self) -> str:
        """``serialize_conversation(self)``."""
        return PARAGRAPH_SEPARATOR.join(filter(None, self._pieces_from(0)))

    def _run_units(self, first: int) -> int:
        """What messages ``[first, len)`` add to the sums (separators included), late ones too."""
        assert self.sums is not None
        start = self.start
        units = self.sums[start + len(self)] - self.sums[start + first]
        for k, step in self._late_steps().items():
            if k >= first:
                units += step
        return units

    def suffix(self, units: int) -> str:
        """A suffix of :meth:`text` of at least ``units`` units (or all of it), newest first.

        It starts at the newest message boundary that leaves enough, and needs the running sums;
        without them it is the text.
        """
        return PARAGRAPH_SEPARATOR.join(self.suffix_pieces(units))

    def suffix_pieces(self, units: int) -> list[str]:
        """The paragraphs :meth:`suffix` joins (the non-empty ones), each as it was made."""
        if self.sums is None:
            return list(filter(None, self._pieces_from(0)))
        return list(filter(None, self._pieces_from(self.first_needed(units))))
