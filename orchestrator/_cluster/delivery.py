"""How an activity's store work is delivered: heartbeating, and transient failures retried.

Theory of operation. Temporal notices a dead worker only by its silence. An activity scheduled
with a heartbeat timeout that stops heartbeating fails as timed out within that timeout, and
under a retry policy it is delivered again, to whichever worker polls; without one it waits out
its whole start-to-close timeout (a minute, for a step that takes milliseconds). So every
activity heartbeats while it works, store work included: a read queued behind another
writer's lock may take longer than the heartbeat timeout, and must not be taken for a death.

The activities that may be delivered again are idempotent (``prepare`` reads; the commit, the
appends and the journal writes find what an earlier delivery wrote, by id or by step number), so
a retry is delivery, never a decision: the tables still decide everything that costs a model
call. Two things make a redelivery safe:

* A journal line an earlier attempt may have written is skipped: an attempt after the first is
  a resend (:func:`redelivered`), exactly as when the workflow resends lines after a lost
  activity.
* A store error is *transient* when the connection failed under the work (psycopg's
  ``OperationalError``: the server restarted, the backend was terminated, the network dropped)
  or none could be had (:class:`~orchestrator._core.errors.StoreUnavailableError`): asking
  again may work, so the activity fails retryable (``StoreUnavailable``) and Temporal asks
  again. A commit whose connection died keeps its paid-for summary this way. Any other error is
  the same at every attempt: ``once`` work (planning) fails for good at the first.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from orchestrator._cluster.calls import STORE_UNAVAILABLE, Call, NavCall, TurnCall
from orchestrator._cluster.heartbeat import heartbeating
from orchestrator._core.errors import StoreUnavailableError

T = TypeVar("T")
C = TypeVar("C", Call, TurnCall, NavCall)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a connection failing, not a refusal."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, StoreUnavailableError) or _lost_connection(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _lost_connection(error: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the cluster extra installs it
        return False
    return isinstance(error, psycopg.OperationalError)


async def store_work(work: Callable[..., T], *args: Any, once: bool = False) -> T:
    """Run blocking store ``work`` in a thread, heartbeating, its failures classified.

    Args:
        work: The blocking function.
        *args: Its arguments.
        once: Any failure but a transient one is final (no retry by the activity's policy).

    Raises:
        ApplicationError: ``StoreUnavailable`` (retryable) for a transient store failure; with
            ``once``, any other failure, not retryable.
    """
    try:
        async with heartbeating():
            return await asyncio.to_thread(work, *args)
    except ApplicationError:
        raise
    except Exception as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if transient(error):
            raise ApplicationError(message, type=STORE_UNAVAILABLE) from error
        if once:
            kind = type(error).__name__
            raise ApplicationError(message, type=kind, non_retryable=True) from error
        raise


def redelivered(call: C) -> C:
    """``call`` as a resend when its lines may be written already.

    So it is after a first attempt, and for a local activity at every attempt: one lost with
    its worker is run again, from attempt 1, by the worker that takes the workflow task over
    (its result was never recorded), and nothing tells that run from the first.
    """
    info = activity.info()
    if (info.attempt > 1 or info.is_local) and not call.resend:
        return dataclasses.replace(call, resend=True)
    return call
