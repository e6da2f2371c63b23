"""How many operations start at once on one event loop: the loop-lag bound (issue 9).

Starting an operation is a stretch of work that never waits: planning, the first steps and
their journal records, up to the first model call (about a millisecond for a small session).
An event loop runs every task that is ready in one pass, so a thousand compactions asked for at
once would start in one pass and hold the loop for a second: no other session, request or
timer would be served meanwhile. An operation therefore takes one of :data:`STARTS_AT_ONCE`
slots before planning and gives it back as soon as it first waits for something slow (a model,
a hook, a retry wait) or ends; the others queue, first come first served, and each pass of
the loop starts at most that many. The same goes for each stretch after a wait (a thousand
answers arriving together would otherwise all commit in one pass): the operation takes a slot
again when its wait ends. It bounds the loop's lag, not the work: every operation still goes
on as soon as a slot frees, and one alone never waits.
"""

from __future__ import annotations

import anyio
from anyio.lowlevel import RunVar

from orchestrator._runtime.soon import next_pass

STARTS_AT_ONCE = 8

_SLOTS: RunVar[anyio.Semaphore] = RunVar("orchestrator_starts")


class Slot:
    """A held start slot; :meth:`release` is idempotent."""

    __slots__ = ("_semaphore",)

    def __init__(self, semaphore: anyio.Semaphore | None) -> None:
        self._semaphore = semaphore

    def release(self) -> None:
        """Give the slot back (the operation now waits, or has ended), from the next pass on.

        Not at once: a start stretch is synchronous, so a slot freed now would go to the next
        operation in this very pass, and a pass would still start them all. Handed back by
        the loop's next pass, a slot starts at most one operation per pass.
        """
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            next_pass(semaphore.release)


async def start_slot() -> Slot:
    """Wait for a start slot on this event loop; at once, without yielding, when one is free."""
    try:
        semaphore = _SLOTS.get()
    except LookupError:
        semaphore = anyio.Semaphore(STARTS_AT_ONCE)
        _SLOTS.set(semaphore)
    try:
        semaphore.acquire_nowait()  # refused while others queue: first come, first served
    except anyio.WouldBlock:
        await semaphore.acquire()
    return Slot(semaphore)
