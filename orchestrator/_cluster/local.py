"""Local activities: the short, idempotent phases, one history event each (issue 36).

A local activity runs in the worker that holds the workflow, inside the workflow task that
asked for it: its result is recorded as one marker event, where a regular activity costs three
(scheduled, started, completed) and a workflow task's three more. Planning, hooks, the commit,
the journal writes and the worker's settings are local: none needs durability of its own in the
history, all are idempotent (or, for the hooks, consulted afresh), and each is short. The model
calls and the agent's run stay regular activities: they heartbeat, so a dead worker's call
fails over within seconds, and a call whose answer was recorded is never made again.

A local activity lost with its worker is run again by the worker that takes the workflow task
over, after the task's timeout (10 s), from its first attempt; its journal lines may be written
already, so its writer always checks (:func:`~orchestrator._cluster.delivery.redelivered`).

Temporal raises a local activity's failure as the failure itself (an ``ApplicationError``, a
``TimeoutError``), not wrapped in an ``ActivityError`` as a regular activity's:
:func:`run_local` wraps it, so the flows judge both alike
(:func:`~orchestrator._cluster.operation.flow.infrastructure`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError
from temporalio.workflow import ActivityCancellationType


async def run_local(
    activity: str,
    *args: Any,
    limit: timedelta,
    retry: RetryPolicy | None = None,
    result_type: type | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
) -> Any:
    """Run the local activity ``activity``; its failure raised as an ``ActivityError``.

    Raises:
        ActivityError: It failed (its cause says why), as a regular activity's failure.
    """
    try:
        return await workflow.execute_local_activity(
            activity,
            args=args,
            start_to_close_timeout=limit,
            retry_policy=retry,
            result_type=result_type,
            cancellation_type=cancellation_type,
        )
    except ActivityError:
        raise
    except FailureError as failure:
        raise ActivityError(
            f"local activity {activity} failed",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=activity,
            activity_id="",
            retry_state=None,
        ) from failure
