"""Which build a worker is, and pinning each session workflow to the build it started on (issue 36).

Theory of operation. A workflow's history is only valid for the code and tables that made it:
a worker whose operation table lacks a row replays a running workflow into a nondeterminism
error (``Activity type of scheduled event 'call_model' does not match 'commit'``), the request
hangs and the paid summary is lost. So a worker says which build it is, and Temporal's worker
versioning keeps each workflow run on the build it started on:

* **The build id is computed, not chosen.** :func:`build_id` is the package version and a digest
  of everything the worker runs: every module of the package and every shipped table and
  prompt. Change one row of a table and the build id changes; reinstall the same release and it
  does not. Nobody has to remember to bump anything.
* **Pinned runs.** A versioned worker polls as version ``(deployment, build id)`` with the
  *pinned* behaviour: a workflow run started on that version gets every later task (updates,
  signals, a replay after its worker died) on that version only. A worker of another build
  never sees it, so it can never replay it with other tables.
* **The newest started build takes new sessions.** A versioned worker makes its version the
  deployment's current one once Temporal knows it (:func:`promote`), so new workflow runs start
  there; runs pinned to an older build finish on that build's workers. A session workflow ends
  after five idle minutes and a busy one continues as new past its history bound, moving to the
  current build then (``AUTO_UPGRADE``, :mod:`~orchestrator._cluster.workflow`): an old build's
  workers may stop once its runs have drained. ``--no-promote`` starts a build without making it
  current (promote it later with ``temporal worker deployment set-current-version``).

``orchestrator worker`` names the deployment after its task queue unless told otherwise
(``--deployment``), so two fleets on two queues never promote over each other; one deployment may
serve several queues (the tests share one, the dev server allowing 100 per namespace). Workers built
into a program (:func:`~orchestrator._cluster.worker.build_worker`) are unversioned unless given a
:class:`WorkerVersion`; ``orchestrator worker`` is versioned unless started with ``--unversioned``.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from orchestrator._core.errors import UnavailableError
from orchestrator._core.resources import data_dir

PROMOTE_WITHIN_S = 60.0
"""How long :func:`promote` waits for Temporal to know a new worker's version."""
_PROMOTE_EVERY_S = 0.1
_ASK_AGAIN = (
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.UNAVAILABLE,
)

_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class WorkerVersion:
    """A worker's place in Temporal's worker versioning.

    Attributes:
        deployment: The worker deployment's name (``orchestrator worker`` uses the task queue).
        build_id: The build (:func:`build_id`).
    """

    deployment: str
    build_id: str

    def config(self) -> WorkerDeploymentConfig:
        """The worker's deployment configuration: this version, its workflow runs pinned."""
        return WorkerDeploymentConfig(
            version=WorkerDeploymentVersion(self.deployment, self.build_id),
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        )


def build_id(
    package: Path = _PACKAGE, *, machines: Path | None = None, prompts: Path | None = None
) -> str:
    """The build this process runs: ``<version>-<digest>``, 12 hex digits of digest.

    The digest covers every ``*.py`` file of the package and every file of the shipped
    ``machines`` and ``prompts`` folders, each by its relative path and bytes, in a fixed order.

    Args:
        package: The package folder.
        machines: The machine tables' folder; the shipped one by default.
        prompts: The prompts' folder; the shipped one by default.
    """
    digest = hashlib.sha256()
    folders = (
        ("package", package, "*.py"),
        ("machines", machines or data_dir("machines"), "*"),
        ("prompts", prompts or data_dir("prompts"), "*"),
    )
    for label, folder, pattern in folders:
        for path in sorted(p for p in folder.rglob(pattern) if p.is_file()):
            if "__pycache__" in path.parts:
                continue
            digest.update(f"{label}/{path.relative_to(folder).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return f"{_version()}-{digest.hexdigest()[:12]}"


def _version() -> str:
    try:
        return metadata.version("session-orchestrator")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


async def promote(
    client: Client,
    version: WorkerVersion,
    *,
    task_queue: str,
    within_s: float = PROMOTE_WITHIN_S,
) -> None:
    """Make ``version`` its deployment's current one: new workflow runs start on it.

    Temporal knows a version only once one of its workers has polled, a moment after the
    worker starts, so a refusal that says it does not know it yet is asked again. Returns once
    ``task_queue`` (the one the worker polls) routes new runs to the version.

    Raises:
        UnavailableError: Temporal did not accept it within ``within_s`` (the last reason).
    """
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=version.deployment,
        build_id=version.build_id,
    )
    describe = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within_s
    pause = _PROMOTE_EVERY_S
    asked = False
    while True:
        reason = f"task queue {task_queue} still routes to another build"
        # Ready means the queue routes new runs to this build: already so when a worker of the
        # same build made it current (a fleet starting), else once the change has reached it.
        try:
            routed = (
                await client.workflow_service.describe_task_queue(describe)
            ).versioning_info.current_deployment_version
        except RPCError as error:
            if error.status not in _ASK_AGAIN:
                raise _refused(version, error.message) from None
            routed = None
        if routed is not None and (routed.deployment_name, routed.build_id) == (
            version.deployment,
            version.build_id,
        ):
            return
        if not asked:
            try:
                await client.workflow_service.set_worker_deployment_current_version(request)
                asked = True
            except RPCError as error:
                # Not known yet (no poll seen), or Temporal's rate limit on deployment changes.
                if error.status not in _ASK_AGAIN:
                    raise _refused(version, error.message) from None
                reason = error.message
        if loop.time() >= give_up:
            raise _refused(version, reason)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


def _refused(version: WorkerVersion, reason: str) -> UnavailableError:
    return UnavailableError(
        f"Temporal did not make build {version.build_id} current in deployment "
        f"{version.deployment}: {reason}"
    )
