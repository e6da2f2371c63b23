"""The client side of the cluster: how a server asks the session workflows for work.

A request for a session goes to the workflow whose id is the session id, started when none is
running (update-with-start, ``USE_EXISTING``), so two servers asking at once reach the same
workflow and it decides: one compaction at a time per session, in the whole fleet.

A request waits as long as its work takes. The server answers an update-with-start only once a
worker has accepted the update, and gives up after its own deadline when every worker is busy
(a thousand sessions asked at once): the request is then sent again under the same update id,
which the server attaches to the update already admitted, if any, so the work is asked for once.

A Temporal server that cannot be reached is an :class:`UnavailableError` naming it, never a
hang: a connection attempt gives up after :data:`CONNECT_TIMEOUT`, and a call the client
retries (the server went away) after :data:`GIVE_UP_AFTER` of retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import RetryConfig, RPCError, RPCStatusCode

from orchestrator._cluster.contract import (
    AGENT_RAISED,
    BUSY_TYPE,
    HISTORY_BOUND,
    NO_AGENT_TYPE,
    TASK_QUEUE,
    UNAVAILABLE,
    AgentRaisedError,
    CompressRequest,
    CompressResult,
    ForkDone,
    ForkRequest,
    NavigateRequest,
    NavigateResult,
    PromptRequest,
    PromptResult,
    SessionStart,
)
from orchestrator._cluster.operation.flow import infrastructure, lost_reason
from orchestrator._cluster.workflow import SessionWorkflow
from orchestrator._core.errors import (
    BusyError,
    ConflictError,
    NoAgentError,
    OutcomeUnknownError,
    SessionError,
    UnavailableError,
)

T = TypeVar("T")

QUERY_TIMEOUT = timedelta(seconds=10)
"""How long a state query may wait for a worker to answer."""
CONNECT_TIMEOUT = timedelta(seconds=5)
"""How long one TCP connection attempt to the Temporal server may take."""
GIVE_UP_AFTER = timedelta(seconds=10)
"""How long a call retries a Temporal server that does not answer before it fails (the
Temporal client's own default, named here because docs/scale-out.md promises it)."""


async def connect_temporal(address: str, *, give_up_after: timedelta = GIVE_UP_AFTER) -> Client:
    """A Temporal client connected to ``address`` (``HOST:PORT``).

    Raises:
        UnavailableError: Nothing answers there as a Temporal server (one line, naming it).
    """
    retry = RetryConfig(max_elapsed_time_millis=int(give_up_after.total_seconds() * 1000))
    try:
        return await Client.connect(
            address, connect_timeout=CONNECT_TIMEOUT, retry_config=retry, runtime=_runtime()
        )
    except RuntimeError as error:  # the SDK's connection failure, a Rust error as text
        raise UnavailableError(f"the Temporal server at {address} {_unreachable(error)}") from None


@functools.cache
def _runtime() -> Runtime:
    """The Temporal SDK's runtime for this process, its log lines sent to Python's logging.

    By default the SDK's core writes its warnings (a retried call, say) to standard output,
    which is ``serve``'s JSON-RPC channel; forwarded, they reach standard error as any Python
    warning does (logger ``temporalio.core``), and a program may route them elsewhere.
    """
    forwarding = LogForwardingConfig(logger=logging.getLogger("temporalio.core"))
    logs = LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"), forwarding=forwarding
    )
    return Runtime(telemetry=TelemetryConfig(logging=logs))


def _unreachable(error: BaseException) -> str:
    """The words "cannot be reached (why)", the why picked out of the SDK's Rust error text."""
    text = str(error)
    found = re.search(r'(?:message|error): "([^"]+)"', text)
    reason = found.group(1) if found else " ".join(text.split())
    return f"cannot be reached ({reason})"


class ClusterClient:
    """Talks to the session workflows through Temporal.

    Args:
        client: A connected Temporal client.
        task_queue: Where the workers poll.
        idle_s: How long a session workflow waits for more work before completing.
        rpc_timeout: How long one update-with-start call waits for a worker to accept the
            update before it is sent again (``None``: the server's own deadline).
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = TASK_QUEUE,
        idle_s: float = 300.0,
        history_bound: int = HISTORY_BOUND,
        rpc_timeout: timedelta | None = None,
    ):
        self.client = client
        self.task_queue = task_queue
        self.idle_s = idle_s
        self.history_bound = history_bound
        self.rpc_timeout = rpc_timeout

    @classmethod
    async def connect(
        cls, address: str, *, give_up_after: timedelta = GIVE_UP_AFTER, **kwargs: Any
    ) -> ClusterClient:
        """Connect to the Temporal server at ``address`` (``HOST:PORT``).

        Raises:
            UnavailableError: It cannot be reached.
        """
        return cls(await connect_temporal(address, give_up_after=give_up_after), **kwargs)

    async def compress(
        self,
        session_id: str,
        focus: str | None = None,
        *,
        reason: str = "manual",
        operation_id: str | None = None,
    ) -> CompressResult:
        """Compact ``session_id`` through its workflow and wait for the outcome.

        ``operation_id`` names the update (default: a fresh one): asked again under the same
        id, the workflow attaches to the update already admitted, and :meth:`recall` finds it.

        Raises:
            BusyError: The session machine refused it (a compaction or a navigation runs).
            SessionError: The workflow refused the request (the message says why).
        """
        request = CompressRequest(focus=focus, reason=reason)
        return await self._update(session_id, "compress", request, CompressResult, operation_id)

    async def prompt(self, session_id: str, text: str) -> PromptResult:
        """Run a turn for ``text`` in ``session_id``'s workflow and wait for its end.

        Raises:
            NoAgentError: The worker has no agent.
            BusyError: The session machine refused it (a navigation runs).
            AgentRaisedError: The agent raised; the turn settled through the abort row.
        """
        return await self._update(session_id, "prompt", PromptRequest(text=text), PromptResult)

    async def navigate(
        self, session_id: str, request: NavigateRequest, *, operation_id: str | None = None
    ) -> NavigateResult:
        """Navigate ``session_id``'s tree through its workflow and wait for the outcome.

        ``operation_id`` names the update, as for :meth:`compress`.

        Raises:
            BusyError: A navigation is already running.
            SessionError: The target is unknown.
            ConflictError: The leaf move met another writer's change (D27).
        """
        return await self._update(session_id, "navigate", request, NavigateResult, operation_id)

    async def fork(self, session_id: str, request: ForkRequest) -> ForkDone:
        """Fork ``session_id`` before a user message into a new session in the store.

        Raises:
            SessionError: Not a user message, an unknown id, or the new id is taken.
        """
        return await self._update(session_id, "fork", request, ForkDone)

    async def _update(
        self,
        session_id: str,
        name: str,
        argument: Any,
        result_type: type[T],
        operation_id: str | None = None,
    ) -> T:
        """Update-with-start ``name``; sent again, same update id, when the server gave up.

        The update id is ``NAME:OPERATION_ID`` (:func:`update_id`), so that :meth:`recall`
        knows the result's type from the id alone.
        """
        update_id = update_id_of(name, operation_id or uuid.uuid4().hex)
        while True:
            start = WithStartWorkflowOperation(
                SessionWorkflow.run,
                SessionStart(
                    session_id=session_id, idle_s=self.idle_s, history_bound=self.history_bound
                ),
                id=session_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
            try:
                result: T = await self.client.execute_update_with_start_workflow(
                    name,
                    argument,
                    start_workflow_operation=start,
                    id=update_id,
                    result_type=result_type,
                    rpc_timeout=self.rpc_timeout,
                )
            except WorkflowUpdateFailedError as error:
                raise _refusal(error) from None
            except RPCError as error:
                with contextlib.suppress(Exception):
                    await start.workflow_handle()  # failed with the call: read, not reported
                # Sent or not, taken or not: only the cluster knows now (recall asks it later).
                raise self._unavailable(error, lost=True) from None
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                # The start's own outcome is settled by now; read it, so that a start that
                # failed with the call is not reported later as an exception nobody read.
                with contextlib.suppress(Exception):
                    await start.workflow_handle()
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the caller cancelled: not a timeout
                continue  # no worker accepted it in time: ask again for the same update
            return result

    async def recall(self, session_id: str, name: str, operation_id: str) -> Recalled | None:
        """The update ``name`` asked for under ``operation_id``: still running, or its outcome.

        Temporal keeps an update's outcome with its workflow run (after the run completed too,
        for the namespace's retention), so any server finds it, whoever asked for it. The
        session's current run is asked first, then its earlier runs (a run that idled out or
        continued as new), newest first, :data:`RUNS_ASKED` at most.

        Returns:
            ``None`` when no run of the session's workflow knows the update; else
            ``Recalled(done=False)`` while it runs, or its result (or the error it failed
            with, as :meth:`compress` and :meth:`navigate` raise it) once it ended.

        Raises:
            UnavailableError: The Temporal server cannot be reached.
        """
        update_id = update_id_of(name, operation_id)
        result_type = _RESULT_TYPES[name]
        try:
            found = await self._poll_update(session_id, "", update_id, result_type)  # current
            query = f"WorkflowId = '{_quoted(session_id)}'"
            if found is None:
                async for run in self.client.list_workflows(query, limit=RUNS_ASKED):
                    found = await self._poll_update(session_id, run.run_id, update_id, result_type)
                    if found is not None:
                        break
        except RPCError as error:
            raise self._unavailable(error) from None
        return found

    async def _poll_update(
        self, session_id: str, run_id: str, update_id: str, result_type: type[Any]
    ) -> Recalled | None:
        """What one run knows of the update (``None``: nothing), asked without waiting."""
        request = PollWorkflowExecutionUpdateRequest(
            namespace=self.client.namespace,
            update_ref=UpdateRef(
                workflow_execution=WorkflowExecution(workflow_id=session_id, run_id=run_id),
                update_id=update_id,
            ),
            identity=self.client.identity,
            wait_policy=WaitPolicy(lifecycle_stage=_ADMITTED),
        )
        try:
            answer = await self.client.workflow_service.poll_workflow_execution_update(
                request, retry=True, timeout=QUERY_TIMEOUT
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        if not answer.HasField("outcome"):
            return Recalled(done=False)
        converter = self.client.data_converter
        if answer.outcome.HasField("failure"):
            failure = await converter.decode_failure(answer.outcome.failure)
            return Recalled(done=True, error=_refusal(WorkflowUpdateFailedError(failure)))
        [result] = await converter.decode(answer.outcome.success.payloads, [result_type])
        return Recalled(done=True, result=result)

    async def state(self, session_id: str) -> dict[str, Any] | None:
        """What the session's workflow is doing, or ``None`` when none is running.

        A closed workflow is not asked: a query on one needs a worker to replay it, and the
        answer would only say "idle".
        """
        handle = self.client.get_workflow_handle(session_id)
        try:
            described = await handle.describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                return None
            state: dict[str, Any] = await handle.query(
                SessionWorkflow.state, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            if error.status == RPCStatusCode.UNAVAILABLE:
                raise self._unavailable(error) from None
            raise SessionError(
                f"session {session_id}: its workflow did not answer ({error.message}); "
                "is a worker running?"
            ) from None
        return state

    async def events(self, session_id: str, after: int) -> tuple[str, list[dict[str, Any]]]:
        """The workflow run's id and its events numbered after ``after`` (``session.event``).

        Raises:
            RPCError: No worker answered (or no workflow runs); the caller asks again later.
        """
        handle = self.client.get_workflow_handle(session_id)
        answer: dict[str, Any] = await handle.query(
            SessionWorkflow.events, after, rpc_timeout=QUERY_TIMEOUT
        )
        return str(answer["run"]), list(answer["events"])

    async def abort(self, session_id: str) -> bool:
        """Stop the session's turn, compaction or navigation; returns whether one was busy."""
        state = await self.state(session_id)
        if not state or not state.get("busy"):
            return False
        await self.client.get_workflow_handle(session_id).signal(SessionWorkflow.abort)
        return True

    def _unavailable(self, error: RPCError, *, lost: bool = False) -> Exception:
        """A call's failure: the server not answering as :class:`UnavailableError`.

        ``lost``: the call asked for work, which may have been taken: an
        :class:`OutcomeUnknownError`, so that its outcome is asked for later.
        """
        if error.status != RPCStatusCode.UNAVAILABLE:
            return error
        config = self.client.service_client.config
        retry = config.retry_config or RetryConfig()
        asked = (retry.max_elapsed_time_millis or 0) / 1000
        kind = OutcomeUnknownError if lost else UnavailableError
        return kind(
            f"the Temporal server at {config.target_host} {_unreachable(error)}; "
            f"tried for {asked:g} s"
        )


RUNS_ASKED = 20
"""The most runs of a session's workflow :meth:`ClusterClient.recall` asks, newest first."""
_ADMITTED = UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
_RESULT_TYPES: dict[str, type[Any]] = {"compress": CompressResult, "navigate": NavigateResult}
"""The updates :meth:`ClusterClient.recall` finds, and the type of each one's result."""


def update_id_of(name: str, operation_id: str) -> str:
    """The update id of the operation ``operation_id`` asked for as update ``name``."""
    return f"{name}:{operation_id}"


def _quoted(text: str) -> str:
    """``text`` inside a visibility query's single quotes."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


@dataclass(frozen=True, slots=True)
class Recalled:
    """What :meth:`ClusterClient.recall` found of an update.

    Attributes:
        done: It ended (else it still runs).
        result: Its result, when it ended with one.
        error: What it failed with, as the call that asked for it raises it.
    """

    done: bool
    result: Any = None
    error: Exception | None = None


_BY_TYPE: dict[str, Callable[[str], Exception]] = {
    "Conflict": ConflictError,
    BUSY_TYPE: BusyError,
    NO_AGENT_TYPE: NoAgentError,
    UNAVAILABLE: UnavailableError,
}
"""The error each application error type of a failed update is raised as (by type, not words)."""


def _refusal(error: WorkflowUpdateFailedError) -> Exception:
    """What a failed update is raised as: its application error's type decides."""
    cause = _application_error(error)
    message = cause.message if cause is not None else str(error.cause or error)
    kind = cause.type if cause is not None else None
    if kind in _BY_TYPE:
        return _BY_TYPE[kind](message)
    if cause is not None and kind == AGENT_RAISED:
        raised = str(cause.details[0]) if cause.details else "Exception"
        return AgentRaisedError(raised, message)
    lost = _lost_activity(error)
    if lost is not None:
        return UnavailableError(f"Cluster unavailable: {lost}")
    return SessionError(message)


def _lost_activity(error: WorkflowUpdateFailedError) -> str | None:
    """Why an activity failed under the update for the cluster's sake (``None``: not that)."""
    cause: BaseException | None = error.cause
    while cause is not None and not isinstance(cause, ActivityError):
        cause = getattr(cause, "cause", None)
    if isinstance(cause, ActivityError) and infrastructure(cause):
        return lost_reason(cause, cause.activity_type or "activity")
    return None


def _application_error(error: WorkflowUpdateFailedError) -> ApplicationError | None:
    """The application error that failed the update, however deep (an activity's, say)."""
    cause: BaseException | None = error.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return cause if isinstance(cause, ApplicationError) else None
