"""A read-only window on part of an append-only sequence, made in O(1).

A compaction plan names the summarized range of a context: its entry ids and its messages. At
100k entries that range holds nearly everything, and copying it into tuples, and later freeing
the copies, cost milliseconds per compaction (issue 9). The context's lists only ever grow (a
compaction starts new ones), so a window with a fixed start and length never changes: it is as
immutable as the tuple it replaces, without the copy.

A window compares equal to any sequence with the same items (a tuple, a list, another window),
hashes as the tuple of its items, and a slice of it is a tuple.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class ComparesAsTuple(Sequence[T], Generic[T]):
    """A read-only sequence compared and hashed by its items.

    It equals any sequence with the same items (a tuple, a list, another such view), and hashes
    as the tuple of its items.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class Window(ComparesAsTuple[T]):
    """``items[start:start + length]``, without copying; ``items`` must only ever grow.

    Args:
        items: The sequence (a list, a tuple, an array).
        start: Index of the first item in the window.
        length: How many items (default: all from ``start``, as of now).
    """

    __slots__ = ("_items", "_start", "_length")

    def __init__(self, items: Sequence[T] = (), start: int = 0, length: int | None = None) -> None:
        self._items = items
        self._start = start
        self._length = len(items) - start if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step == 1:
                return tuple(self._items[self._start + start : self._start + max(start, stop)])
            return tuple(self._items[self._start + i] for i in range(start, stop, step))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("window index out of range")
        return self._items[self._start + index]

    def __iter__(self) -> Iterator[T]:
        return map(self._items.__getitem__, range(self._start, self._start + self._length))
