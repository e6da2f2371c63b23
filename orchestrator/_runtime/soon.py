"""Plain callbacks on the event loop, where a task would cost more than the work (issue 9).

A task in anyio is a coroutine, a cancel scope and the task group's bookkeeping; a callback on
asyncio's loop is one handle. For the two timings the runtime needs often (the next pass of the
loop; a deadline) asyncio gets callbacks and trio, which has no timed callbacks, keeps tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def next_pass(callback: Callable[[], None]) -> None:
    """Call ``callback`` in the event loop's next pass, not in this one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: trio, the other backend anyio runs on
        import trio

        trio.lowlevel.current_trio_token().run_sync_soon(callback)
    else:
        loop.call_soon(callback)


def on_asyncio() -> bool:
    """Whether the running event loop is asyncio's (not trio's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def call_later(seconds: float, callback: Callable[[], None]) -> Callable[[], None] | None:
    """Call ``callback`` after ``seconds`` on asyncio's loop; the canceller, or ``None`` on trio.

    ``None`` tells the caller to run its own timer task: trio has no timed callbacks.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(seconds, callback).cancel
