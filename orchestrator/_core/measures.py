"""What a summary request needs of each context message, measured on first need.

A summary request serializes the newest messages that fit its budget, and the context keeps,
per message, its serialized length (as running sums), its shape and the parts it is written
from (see :class:`~orchestrator._core.measured_messages.MeasuredMessages`). Measuring them at
every push cost a fifth to a third of building a context, and most contexts are never
summarized: an inspection command (``plan``, ``context``) builds one and prints it. So
:class:`Measures` holds the numbers of the first ``measured`` messages and measures the rest
when asked, in order.

A process that will summarize (the runtime, on opening a session) asks for every message once;
the builder then measures each message as it takes it in (``eager``), as it always did, so a
compaction never waits for a backlog.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from orchestrator._core.entries import Message
from orchestrator._core.serialize import LATE_ROLES, SHAPE_OTHER, measure_shaped, serial_step


class Measures:
    """Running sums of serialized lengths, shapes and parts of a list of messages.

    ``messages`` only grows (a compaction starts a new list and a new ``Measures``), so the
    first ``len(shapes)`` entries never change once measured. ``serial`` has one more item than
    ``shapes``: the sum before the first message. Messages of the roles in
    :data:`~orchestrator._core.serialize.LATE_ROLES` count 0 (they are measured when planned).
    """

    __slots__ = ("eager", "messages", "parts", "serial", "shapes")

    def __init__(self, messages: Sequence[Message], serial: array[int] | None = None) -> None:
        self.messages = messages
        self.serial: array[int] = array("q", [0]) if serial is None else serial
        self.shapes: array[int] = array("b")
        self.parts: list[Any] = []
        self.eager = False

    def measured(self) -> int:
        """How many messages are measured."""
        return len(self.shapes)

    def skip(self) -> None:
        """Count the next message 0, unmeasured (a compaction's head: never summarized)."""
        self.serial.append(self.serial[-1])
        self.shapes.append(SHAPE_OTHER)
        self.parts += (None, None)

    def take(self, message: Message) -> tuple[int, int]:
        """Measure the next message (at :meth:`measured`).

        Returns:
            Its estimate, from the same walk, and its shape.
        """
        estimate, units, shape, text, call = measure_shaped(message)
        self.serial.append(self.serial[-1] + serial_step(units))
        self.shapes.append(shape)
        self.parts.append(text)
        self.parts.append(call)
        return estimate, shape

    def upto(self, count: int) -> None:
        """Measure the messages before index ``count`` that are not measured yet."""
        shapes, serial, parts, messages = self.shapes, self.serial, self.parts, self.messages
        total = serial[-1]
        for k in range(len(shapes), count):
            message = messages[k]
            if message.get("role") in LATE_ROLES:
                shapes.append(SHAPE_OTHER)
                parts += (None, None)
            else:
                _, units, shape, text, call = measure_shaped(message)
                total += serial_step(units)
                shapes.append(shape)
                parts.append(text)
                parts.append(call)
            serial.append(total)

    def kept(self, messages: Sequence[Message], first: int, count: int, head: int) -> Measures:
        """The measures of a restarted context: ``head`` heads, then messages ``[first, count)``.

        ``messages`` is the restarted context's list. What is measured of the kept messages is
        copied (slices, in C); the sums go on from where they stood (only differences are read),
        the heads adding nothing.
        """
        upto = min(self.measured(), count)
        base = self.serial[first] if upto >= first else 0
        kept = Measures(messages, array("q", [base] * (head + 1)))
        kept.shapes.extend(array("b", [SHAPE_OTHER] * head))
        kept.parts += [None] * (2 * head)
        if upto > first:
            kept.serial.extend(self.serial[first + 1 : upto + 1])
            kept.shapes.extend(self.shapes[first:upto])
            kept.parts += self.parts[2 * first : 2 * upto]
        return kept


class OnDemand(Sequence[Any]):
    """``serial``, ``shapes`` or ``parts`` of a :class:`Measures`, measured on first read.

    Measured through ``count``: a plan hands these to its summary runs, which only a summary
    request reads.
    """

    __slots__ = ("_count", "_items", "_measures", "_name")

    def __init__(self, measures: Measures, count: int, name: str) -> None:
        self._measures, self._count, self._name = measures, count, name
        self._items: Sequence[Any] | None = None

    def _resolved(self) -> Sequence[Any]:
        if self._items is None:
            self._measures.upto(self._count)
            self._items = getattr(self._measures, self._name)
        return self._items

    def __getitem__(self, index: Any) -> Any:
        return self._resolved()[index]

    def __len__(self) -> int:
        return len(self._resolved())
