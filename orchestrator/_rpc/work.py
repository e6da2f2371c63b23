"""What heavy work hands back and reads: an answer encoded in pieces, and a stop flag.

Nothing here knows about connections or sessions; :mod:`orchestrator._rpc.fair` runs the work
and :mod:`orchestrator._rpc.protocol` writes an :class:`Encoded` result into its answer as it is.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator._core.errors import Cancelled
from orchestrator._core.utf16 import escape_lone_surrogates

STEP = 500
"""Items of a large list encoded per step (about 2 ms each for context messages)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A result already encoded as JSON (UTF-8, lone surrogates escaped), in pieces.

    A handler returns one for a large result it encoded off the event loop; the answer is
    written around its pieces as they are, never joined into one string.

    Attributes:
        pieces: The JSON text of the result, in order.
    """

    pieces: tuple[bytes, ...]

    def value(self) -> Any:
        """The result as a JSON value (for a caller in the same process)."""
        return json.loads(b"".join(self.pieces))


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


def encode_in_steps(value: dict[str, Any], stop: Stop) -> Encoded:
    """``value`` (an object) encoded as the server encodes answers, a step at a time.

    The lists (and iterators, taken as lists) in it are encoded :data:`STEP` items at a time,
    and ``stop`` is checked between steps: one ``json.dumps`` of 100 MB holds the interpreter
    for most of a second, during which the event loop cannot answer anyone.

    Raises:
        Cancelled: ``stop`` was set.
    """
    pieces: list[bytes] = []
    for index, (key, item) in enumerate(value.items()):
        pieces.append((b"{" if index == 0 else b",") + _dumps(key).encode() + b":")
        if isinstance(item, list | Iterator):
            pieces += _list_pieces(item, stop)
        else:
            pieces.append(_dumps(item).encode("utf-8"))
    pieces.append(b"}" if pieces else b"{}")
    return Encoded(tuple(pieces))


def _list_pieces(items: Iterable[Any], stop: Stop) -> Iterator[bytes]:
    iterator = iter(items)
    first = True
    while True:
        stop.check()
        batch = list(itertools.islice(iterator, STEP))
        if not batch:
            break
        yield (b"[" if first else b",") + _dumps(batch)[1:-1].encode("utf-8")
        first = False
    yield b"[]" if first else b"]"


def _dumps(value: Any) -> str:
    """As :func:`~orchestrator._rpc.protocol.encode` (which this must match)."""
    return escape_lone_surrogates(
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    )
