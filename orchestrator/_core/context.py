"""The context the model sees on a path (pi's buildSessionContext).

:func:`build_context` is pi's ``buildSessionContext`` over a root-first path. The same logic is
exposed incrementally as :class:`ContextBuilder`: feed it entries one at a time and it keeps the
messages, their token estimates, the model and the thinking level current. Appending a message
costs O(1); appending a compaction costs O(kept entries), never a walk of the whole path.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from orchestrator._core.entries import (
    COMPACTION,
    MESSAGE,
    MODEL_CHANGE,
    THINKING_LEVEL_CHANGE,
    Entry,
    Message,
    compaction_message,
    entry_message,
)
from orchestrator._core.tokens import ContextTokens, estimate_context_tokens, estimate_tokens

T = TypeVar("T")


class Snapshot(Sequence[T], Generic[T]):
    """A read-only view of the first ``length`` items of an append-only list.

    The builder only ever appends to its lists (a compaction starts new ones), so a view with a
    fixed length never changes: it is as immutable as a tuple, without the O(n) copy. That is
    what keeps "context after one more entry" O(1).
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[T], length: int | None = None) -> None:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """The model a path selects: ``provider`` and ``modelId``."""

    provider: str
    model_id: str

    def as_json(self) -> dict[str, str]:
        """The inspection-JSON shape."""
        return {"provider": self.provider, "modelId": self.model_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionContext:
    """What the model sees: messages in order, with bookkeeping.

    Attributes:
        messages: Context messages (pi ``AgentMessage`` shapes, verbatim where stored).
        entry_ids: For each message, the id of the entry it came from.
        estimates: For each message, :func:`estimate_tokens`.
        thinking_level: Restored from the path (default ``"off"``).
        model: Restored from the path (last ``model_change`` or assistant wins).
        fresh_from: Index of the first message written after the latest compaction; the
            summary and the kept messages come before it (0 without a compaction).
    """

    messages: Sequence[Message]
    entry_ids: Sequence[str]
    estimates: Sequence[int]
    thinking_level: str
    model: ModelRef | None
    fresh_from: int = 0

    def tokens(self) -> ContextTokens:
        """The context's token count, anchored on the last valid usage (as in pi).

        ``stale_usage`` says whether that usage predates the latest compaction (D29).
        """
        return estimate_context_tokens(self.messages, self.estimates, fresh_from=self.fresh_from)


def _model_from_change(entry: Entry) -> ModelRef | None:
    # D1: both shapes. pi: provider + modelId. OMP: model "provider/id" with a role; only the
    # default role selects the session's model.
    provider, model_id = entry.get("provider"), entry.get("modelId")
    if isinstance(provider, str) and isinstance(model_id, str):
        return ModelRef(provider=provider, model_id=model_id)
    combined = entry.get("model")
    if isinstance(combined, str) and entry.get("role") in (None, "default"):
        provider, _, model_id = combined.partition("/")
        if model_id:
            return ModelRef(provider=provider, model_id=model_id)
    return None


class ContextBuilder:
    """Builds a :class:`SessionContext` one path entry at a time."""

    def __init__(self, path: Iterable[Entry] = ()) -> None:
        self._path: list[Entry] = []
        self._position: dict[str, int] = {}
        self._messages: list[Message] = []
        self._entry_ids: list[str] = []
        self._estimates: list[int] = []
        self._fresh_from = 0
        self.thinking_level = "off"
        self.model: ModelRef | None = None
        for entry in path:
            self.push(entry)

    def push(self, entry: Entry) -> None:
        """Add the next entry of the path."""
        self._position[entry["id"]] = len(self._path)
        self._path.append(entry)
        kind = entry.get("type")
        if kind == THINKING_LEVEL_CHANGE:
            level = entry.get("thinkingLevel")
            self.thinking_level = level if isinstance(level, str) and level else "off"
        elif kind == MODEL_CHANGE:
            self.model = _model_from_change(entry) or self.model
        elif kind == MESSAGE:
            self._take_model_from_assistant(entry.get("message"))
        if kind == COMPACTION:
            self._restart_at(entry)
        else:
            self._emit(entry)

    def _take_model_from_assistant(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("role") == "assistant":
            provider, model_id = message.get("provider"), message.get("model")
            if isinstance(provider, str) and isinstance(model_id, str):
                self.model = ModelRef(provider=provider, model_id=model_id)

    def _emit(self, entry: Entry) -> None:
        message = entry_message(entry)
        if message is not None:
            self._messages.append(message)
            self._entry_ids.append(entry["id"])
            self._estimates.append(estimate_tokens(message))

    def _restart_at(self, compaction: Entry) -> None:
        # Summary first, then the kept entries from firstKeptEntryId up to the compaction. If the
        # kept id is not on the path before the compaction, nothing before it is kept (pi).
        summary = compaction_message(compaction)
        self._messages = [summary]
        self._entry_ids = [compaction["id"]]
        self._estimates = [estimate_tokens(summary)]
        here = len(self._path) - 1
        start = self._position.get(compaction.get("firstKeptEntryId", ""), here)
        for entry in self._path[min(start, here) : here]:
            self._emit(entry)
        self._fresh_from = len(self._messages)

    def context(self) -> SessionContext:
        """The context as of the last pushed entry."""
        return SessionContext(
            messages=Snapshot(self._messages),
            entry_ids=Snapshot(self._entry_ids),
            estimates=Snapshot(self._estimates),
            thinking_level=self.thinking_level,
            model=self.model,
            fresh_from=self._fresh_from,
        )


def build_context(path: Sequence[Entry]) -> SessionContext:
    """Build the context for a root-first path (pi ``buildSessionContext``)."""
    return ContextBuilder(path).context()
