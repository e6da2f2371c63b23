"""The garbage-collection policy of a long-running process that holds many sessions (issue 9).

Theory of operation. CPython's cyclic collector walks every container object of a generation
on each of its passes. A server holding a thousand open sessions keeps millions of dicts and
lists alive for good, and each full collection walks all of them again (seconds at a thousand
sessions, during which the event loop stands still). None of those objects ever take part in a
cycle that dies: they are JSON values, freed by reference counting when a session closes.

The policy: right after a full collection, :func:`gc.freeze` moves every survivor to the
permanent generation, which the collector never walks. Freezing right after a collection is what
makes it safe: what is frozen was reachable a moment ago, so no garbage is frozen with it, and
the next full collection walks only what was allocated since (and comes later, since CPython
waits for the survivors of the young generations to grow by a quarter of the frozen size).
Reference counting still frees frozen objects as usual; only a cycle that dies after being
frozen waits, so :meth:`GcPolicy.released` (a server calls it when it closes a session) unfreezes
everything, and the next full collection, whenever CPython runs it, collects such cycles and
freezes the survivors again. The server does so only when the closed session is still alive at
its next opening or close: that collection walks every session still open (0.65 s with
200,000 entries open).

The policy also runs full collections a tenth as often: CPython's third threshold goes from
10 to :data:`FULL_EVERY` young-generation collections. With a thousand operations in flight,
every full collection walks all of their objects (tens of milliseconds of the loop each, three
in a second of compactions), and none of them is cyclic garbage: ended operations and turns
hold no reference cycle (issue 9). Cyclic garbage, when some program makes it, then waits ten
times longer for the collector.

Nothing here runs unless a program asks: a library must not change its host's collector.
``orchestrator serve`` installs it; an embedding server can call
:func:`freeze_after_full_collections`.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from orchestrator._core.loading import FREEZING

FULL_EVERY = 100
"""Young-generation collections between two full ones under the policy (CPython's default: 10)."""


class GcPolicy:
    """Freeze the survivors of every full collection; unfreeze when sessions are released."""

    def __init__(self) -> None:
        self.installed = False
        self.freezes = 0
        self._thresholds: tuple[int, int, int] | None = None
        self._closed: list[weakref.ref[Any]] = []  # closed sessions not freed when closed

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            gc.freeze()
            self.freezes += 1

    def install(self) -> None:
        """Start freezing after each full collection, and collect fully less often (idempotent)."""
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True
            FREEZING[0] = True  # the loader must not thaw what this policy froze
            young, middle, full = self._thresholds = gc.get_threshold()
            gc.set_threshold(young, middle, max(full, FULL_EVERY))

    def uninstall(self) -> None:
        """Stop, and give every frozen object back to the collector (idempotent)."""
        if self.installed:
            gc.callbacks.remove(self._callback)
            self.installed = False
            FREEZING[0] = False
            gc.unfreeze()
            if self._thresholds is not None:
                gc.set_threshold(*self._thresholds)
                self._thresholds = None

    def settle(self) -> None:
        """Freeze what is alive now (after opening a session, or many at once).

        The loader freezes what it parsed (``gc_paused``), but the runtime then builds the
        session's context: a few containers as long as the session (its path, its messages,
        the index by id), young. Any collection that includes them visits every item of each,
        twice: 45 to 95 ms of every thread stopped for 200,000 entries, on the event loop,
        which is where a collection here used to run (issue 35: the other clients waited that
        long when a big session was opened). Freezing them moves them without a look. Cyclic
        garbage made since the last freeze is frozen with them, as the loader's is, until a
        session closes (:meth:`released`).
        """
        if self.installed:
            self._review(collect=True)
            gc.freeze()
            self.freezes += 1

    def released(self, closed: weakref.ref[Any] | None = None) -> None:
        """A session was closed: let the next full collection find it if a cycle holds it.

        Unfreezing sends every open session to the next full collection (0.65 s of every
        thread stopped with 200,000 entries open), and a closed session is nearly always freed
        by reference counting, frozen or not (its entries are JSON values; its runtime holds
        no cycle). So with ``closed``, a weak reference to what was closed, nothing is
        unfrozen now: the next close or opening looks again, and only if it is still alive
        then (a request that held it has ended by then) is everything unfrozen. Without it,
        everything is unfrozen at once.
        """
        if not self.installed:
            return
        self._review(collect=False)
        if closed is None:
            gc.unfreeze()
        elif closed() is not None:
            self._closed.append(closed)

    def _review(self, *, collect: bool) -> None:
        """Unfreeze everything if a session closed before is still alive; ``collect`` now."""
        alive = [ref for ref in self._closed if ref() is not None]
        self._closed = []
        if alive:
            gc.unfreeze()
            if collect:  # about to freeze again: find the cycle first
                gc.collect()


POLICY = GcPolicy()
"""The process's policy (the collector is one per process)."""


def freeze_after_full_collections() -> GcPolicy:
    """Install the policy for this process and return it (see the module comment)."""
    POLICY.install()
    return POLICY
