"""Heartbeats of a long activity: how a dead worker is noticed and a cancel delivered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio import activity

HEARTBEAT_EVERY = timedelta(seconds=0.5)
"""How often a working activity heartbeats, and how often its worker sends one at most (the
SDK's throttle, 0.8 of the heartbeat timeout by default, would leave little margin)."""


@contextlib.asynccontextmanager
async def heartbeating(every_s: float = HEARTBEAT_EVERY.total_seconds()) -> AsyncIterator[None]:
    """Heartbeat while the body awaits, so a dead worker is noticed and a cancel delivered.

    A local activity has no heartbeat: it runs inside its workflow task, whose timeout notices
    a dead worker, and its cancel comes with the task.
    """
    if activity.info().is_local:
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    task = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
