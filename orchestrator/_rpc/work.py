"""What heavy work hands back and reads: an answer encoded in pieces, and a stop flag.

Nothing here knows about connections or sessions; :mod:`orchestrator._rpc.fair` runs the work
and :mod:`orchestrator._rpc.protocol` writes an :class:`Encoded` or :class:`Streamed` result
into its answer as it is.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator._core.errors import Cancelled
from orchestrator._core.json_floats import compact
from orchestrator._core.utf16 import escape_lone_surrogates

STEP = 2000
"""Most items of a large list encoded per step (a few milliseconds for context messages)."""
PIECE_BYTES = 1024 * 1024
"""About the most bytes one step encodes: the items per step shrink below :data:`STEP` when
they are large, so a piece is about this size whatever the items (one item larger than this is
a piece of its own)."""
SMALL_PIECE = 64 * 1024
"""Pieces smaller than this (keys, scalars, short lists) are joined with the next one."""

Pieces = Generator[bytes, None, None]
"""The JSON text of a streamed result, made as it is asked for."""
Pull = Callable[[], bytes | None]
"""One step of a streamed answer: its next piece, ``None`` after the last."""
Step = Callable[[Pull], Awaitable[bytes | None]]
"""Runs one step off the event loop (the server's: in a worker thread, among its heavy jobs)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A result already encoded as JSON (UTF-8, lone surrogates escaped), in pieces.

    A small heavy answer, kept with its session (``answers.py``), is one: the answer is written
    around its pieces as they are, never joined into one string.

    Attributes:
        pieces: The JSON text of the result, in order.
    """

    pieces: tuple[bytes, ...]

    def value(self) -> Any:
        """The result as a JSON value (for a caller in the same process)."""
        return json.loads(b"".join(self.pieces))


class Streamed:
    """A result encoded as it is written: a generator of JSON pieces, run a step at a time.

    Nothing is encoded until the connection's writer reaches the answer; it then takes one
    piece at a time (:meth:`next`, each a step in a worker thread), and the next is made only
    when it is about to be written: the answer is never whole in memory, whatever its size.

    Args:
        pieces: The JSON text of the result, made lazily (nothing runs until the first step).
        step: How one step runs (the server's: in a worker thread, among its heavy jobs).

    Attributes:
        request_id: The id of the request it answers (named when it fails).
        head: The answer's bytes before the result (``{"jsonrpc":"2.0","id":...,"result":``),
            written with the first piece: an encoding that fails before its first piece can
            still be answered with an error in its place, as the line has not begun.
        tail: The answer's bytes after the result (``}``), written after the last piece.
    """

    def __init__(self, pieces: Pieces, step: Step) -> None:
        self._pieces = pieces
        self._step = step
        self.request_id: Any = None
        self.head = b""
        self.tail = b""

    async def next(self) -> bytes | None:
        """The next piece (made off the loop), ``None`` after the last.

        Raises:
            Exception: whatever the encoding raised (the answer cannot be completed).
        """
        return await self._step(self._pull)

    def _pull(self) -> bytes | None:
        return next(self._pieces, None)

    def close(self) -> None:
        """Stop the encoding where it is (never while a step runs: the caller awaits steps)."""
        self._pieces.close()

    async def value(self) -> Any:
        """The result as a JSON value (for a caller in the same process: it is whole then)."""
        pieces: list[bytes] = []
        try:
            while (piece := await self.next()) is not None:
                pieces.append(piece)
        finally:
            self.close()
        return json.loads(b"".join(pieces))


class Stop:
    """A flag that work running in a thread reads between its steps (set from the loop).

    Attributes:
        stopped: Whether the work should give up (its client is gone).
    """

    def __init__(self) -> None:
        self.stopped = False

    def check(self) -> None:
        """Raise :class:`Cancelled` when the work should give up.

        Raises:
            Cancelled: the client the work was for is gone.
        """
        if self.stopped:
            raise Cancelled("Cancelled: the client left")


def pieces_of(value: Mapping[str, Any]) -> Pieces:
    """``value`` (an object) encoded as the server encodes answers, a piece per step.

    The lists (and iterators, taken as lists) in it are encoded at most :data:`STEP` items and
    about :data:`PIECE_BYTES` at a time: one ``json.dumps`` of 100 MB holds the interpreter for
    most of a second, during which the event loop cannot answer anyone, and the whole text at
    once is what a large answer must never be.
    """
    return _joined(_object_pieces(value))


def _object_pieces(value: Mapping[str, Any]) -> Iterator[bytes]:
    if not value:
        yield b"{}"
        return
    for index, (key, item) in enumerate(value.items()):
        yield (b"{" if index == 0 else b",") + _encoded(key) + b":"
        if isinstance(item, list | Iterator):
            yield from _list_pieces(item)
        else:
            yield _encoded(item)
    yield b"}"


def _list_pieces(items: Iterable[Any]) -> Iterator[bytes]:
    iterator = iter(items)
    first = True
    count = 8  # grows (at most fourfold a step) while the items are small
    while batch := list(itertools.islice(iterator, count)):
        text = _encoded(batch)[1:-1]
        yield (b"[" if first else b",") + text
        first = False
        count = max(1, min(STEP, 4 * count, count * PIECE_BYTES // max(len(text), 1)))
    yield b"[]" if first else b"]"


def _joined(pieces: Iterator[bytes]) -> Pieces:
    """``pieces``, the small ones joined to the next (a write per key costs more than it sends)."""
    held: list[bytes] = []
    size = 0
    for piece in pieces:
        held.append(piece)
        size += len(piece)
        if size >= SMALL_PIECE:
            yield held[0] if len(held) == 1 else b"".join(held)
            held, size = [], 0
    if held:
        yield b"".join(held)


def _encoded(value: Any) -> bytes:
    """As :func:`~orchestrator._rpc.protocol.encode` (which this must match), as UTF-8.

    By msgspec, six times faster (64 contexts of 200,000 entries took 52 s of the standard
    library's encoding), with Python's floats put back; the standard library for what msgspec
    refuses (:func:`~orchestrator._core.json_floats.compact`).
    """
    data = compact(value)
    if data is not None:
        return data
    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False
    )
    return escape_lone_surrogates(text).encode("utf-8")
