"""Events the runtime emits, and the bus that delivers them.

Payloads follow pi's AgentSession events: ``auto_compaction_start {reason}``,
``auto_compaction_end {result, aborted, willRetry, errorMessage?}``,
``auto_retry_start {attempt, maxAttempts, delayMs, errorMessage}``,
``auto_retry_end {success, attempt, finalError?}``, plus ACP's
``compaction_update {id, status: in_progress | completed | skipped | failed | cancelled}``, and
``hook_error``, ``session_compact {entryId, fromExtension, reason, willRetry}``,
``session_compact_failed {reason, errorMessage?, aborted, willRetry, fromExtension}``,
``session_tree``, ``message``, ``turn_end``,
``transition``. Payloads are plain JSON values so that the RPC server can forward them as is.

Listeners are called synchronously in the order they subscribed; an async consumer uses
:meth:`EventBus.stream`, which buffers without bound so that a slow reader never blocks the
session (events are small and a session emits few of them). A listener is called from inside a
machine's step: an exception it raises would end the step half-done (a turn stopped before its
user message was written), so it is logged, with its traceback, on the ``orchestrator.events``
logger, and the other listeners still get the event (as a hook's exception never breaks the
flow, D25).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One event: a ``type`` and its JSON payload."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """``{"type": ..., **payload}``, the wire form."""
        return {"type": self.type, **self.payload}


Listener = Callable[[Event], None]

_log = logging.getLogger("orchestrator.events")


class EventBus:
    """Delivers events to listeners and async streams."""

    def __init__(self) -> None:
        # Each listener with the event types it ignores.
        self._listeners: list[tuple[Listener, frozenset[str]]] = []
        self._streams: list[MemoryObjectSendStream[Event]] = []

    def subscribe(
        self, listener: Listener, *, ignoring: Collection[str] = ()
    ) -> Callable[[], None]:
        """Call ``listener`` for every event; returns a function that unsubscribes it.

        Args:
            listener: Called with each event, synchronously.
            ignoring: Event types it never wants: they are not built for it (a machine step's
                ``transition`` comes with every step, issue 9).
        """
        entry = (listener, frozenset(ignoring))
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry)

    def wants(self, type_: str) -> bool:
        """Whether anyone would receive an event of this type (an emitter may skip building it)."""
        return bool(self._streams) or any(type_ not in ignored for _, ignored in self._listeners)

    def emit(self, type_: str, **payload: Any) -> Event:
        """Emit an event to every listener and stream."""
        event = Event(type=type_, payload=payload)
        for listener, ignored in list(self._listeners):
            if type_ not in ignored:
                try:
                    listener(event)
                except Exception:  # noqa: BLE001 - a listener's bug must not break the step
                    _log.exception("event listener %r failed on a %s event", listener, type_)
        for stream in list(self._streams):
            try:
                stream.send_nowait(event)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._streams.remove(stream)
        return event

    @asynccontextmanager
    async def stream(self) -> AsyncIterator[AsyncIterator[Event]]:
        """An async iterator of the events emitted while the block is open."""
        send, receive = anyio.create_memory_object_stream[Event](max_buffer_size=float("inf"))
        self._streams.append(send)
        try:
            async with receive:
                yield receive
        finally:
            if send in self._streams:
                self._streams.remove(send)
            send.close()
