"""A worker: polls the session task queue, runs session workflows and their activities.

Any number of workers, on any number of machines, may poll the same queue against the same
Temporal server and store: Temporal hands each workflow task and activity to one of them, and
when a worker dies its workflows continue on another (replayed from their history) and its
activities fail over after the heartbeat timeout, as the operation table decides.

The workflow sandbox re-imports workflow code for every run, to catch non-determinism. The
orchestrator's own modules (and the libraries they use) are deterministic where the workflow
uses them, so they are passed through: imported once, shared. The machine tables are loaded
here, before the first workflow, so the workflow never reads a file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from orchestrator._cluster.client import connect_temporal
from orchestrator._cluster.contract import TASK_QUEUE
from orchestrator._cluster.heartbeat import HEARTBEAT_EVERY
from orchestrator._cluster.operation.activities import SessionActivities
from orchestrator._cluster.stores import shown
from orchestrator._cluster.versioning import WorkerVersion, promote
from orchestrator._cluster.workflow import SessionWorkflow
from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._process.signals import stop_signals

STICKY_TIMEOUT = timedelta(seconds=1)
"""How long a workflow task waits for the worker that holds its workflow in memory (its sticky
queue) before any worker may take it (replaying the history). A dead worker's workflows wait
this long; Temporal's default is 10 s."""
PASSED_THROUGH = ("orchestrator", "transitions", "anyio", "sniffio", "tenacity")
"""Modules the workflow sandbox shares instead of re-importing."""


def load_tables() -> None:
    """Load (and cache) every shipped machine table, outside any workflow."""
    for name in shipped_machines():
        load_machine(name)


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox the session workflow runs in (also used to replay histories)."""
    load_tables()
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)
    return SandboxedWorkflowRunner(restrictions=restrictions)


class SessionWorker(Worker):
    """A Temporal worker that closes its activities' pool and cache when it stops.

    Temporal stops a worker through :meth:`run` (``async with`` runs it too), which returns
    only once every activity has ended; the stores are closed after that, never under an
    activity still using them.
    """

    def __init__(self, client: Client, activities: SessionActivities, **kwargs: Any) -> None:
        super().__init__(client, activities=list(activities.all()), **kwargs)
        self.session_activities = activities

    async def run(self) -> None:
        """Work until shut down; then close the activities' stores."""
        try:
            await super().run()
        finally:
            await asyncio.to_thread(self.session_activities.close)


def build_worker(
    client: Client,
    activities: SessionActivities,
    *,
    task_queue: str = TASK_QUEUE,
    version: WorkerVersion | None = None,
) -> SessionWorker:
    """A worker for the session workflow and ``activities`` (closes them when it stops).

    With a ``version``, the worker polls as that version of its deployment and every workflow
    run it starts stays pinned to it (:mod:`~orchestrator._cluster.versioning`); without one it
    is unversioned, and takes the runs no versioned deployment owns.
    """
    versioning: dict[str, Any] = {}
    if version is not None:
        versioning["deployment_config"] = version.config()
    return SessionWorker(
        client,
        activities,
        **versioning,
        task_queue=task_queue,
        workflows=[SessionWorkflow],
        workflow_runner=workflow_runner(),
        # Activities wait on models; many may be in flight at once.
        max_concurrent_activities=1000,
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        max_heartbeat_throttle_interval=HEARTBEAT_EVERY,
        default_heartbeat_throttle_interval=HEARTBEAT_EVERY,
    )


async def run_worker(
    address: str,
    activities: SessionActivities,
    *,
    task_queue: str = TASK_QUEUE,
    version: WorkerVersion | None = None,
    make_current: bool = True,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Connect to Temporal at ``address`` and work until cancelled.

    Args:
        address: Temporal's ``HOST:PORT``.
        activities: What the worker runs.
        task_queue: The queue it polls.
        version: Its build in Temporal's worker versioning; ``None``: unversioned.
        make_current: Make ``version`` its deployment's current one before saying ready, so
            new sessions start on it (:func:`~orchestrator._cluster.versioning.promote`).
        ready: Told one line once the worker works.

    Raises:
        UnavailableError: Temporal cannot be reached at ``address``, or did not take the
            version as current.
    """
    client = await connect_temporal(address)
    worker = build_worker(client, activities, task_queue=task_queue, version=version)
    async with worker:
        build = ""
        if version is not None:
            if make_current:
                await promote(client, version, task_queue=task_queue)
            state = "current" if make_current else "not made current"
            build = f", build {version.build_id} ({state})"
        if ready is not None:
            ready(
                f"worker on {address}, task queue {task_queue}, "
                f"store {shown(activities.database)}{build}"
            )
        await _stop_signal()
    # Leaving the block shut the worker down: it stopped polling, cancelled the activities it
    # ran and reported each as failed, so the workflows retry them on another worker now, not
    # after their heartbeat timeout (a killed worker's calls wait for that).


async def _stop_signal() -> None:
    """Wait for the first of :func:`stop_signals`; a second one stops the process at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    watched = stop_signals()
    for number in watched:
        loop.add_signal_handler(number, stop.set)
    try:
        await stop.wait()
    finally:
        # Back to the default actions: if shutting down hangs, a second signal ends the process.
        for number in watched:
            loop.remove_signal_handler(number)
