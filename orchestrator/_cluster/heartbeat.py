"""Heartbeats of a long activity: how a dead worker is noticed and a cancel delivered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity


@contextlib.asynccontextmanager
async def heartbeating(every_s: float = 1.0) -> AsyncIterator[None]:
    """Heartbeat while the body awaits, so a dead worker is noticed and a cancel delivered."""

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
