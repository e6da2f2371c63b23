"""How an activity's store work is delivered (orchestrator/_cluster/delivery.py), no server.

Temporal's ``ActivityEnvironment`` runs the work as an activity would run: heartbeats are
counted, and the attempt number is the one Temporal would give a redelivery.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402

from orchestrator._cluster.calls import STORE_UNAVAILABLE, TurnCall  # noqa: E402
from orchestrator._cluster.contract import UNAVAILABLE_KIND, CompressResult  # noqa: E402
from orchestrator._cluster.delivery import redelivered, store_work, transient  # noqa: E402
from orchestrator._core.errors import (  # noqa: E402
    SessionError,
    StoreUnavailableError,
    UnavailableError,
)
from orchestrator._lifecycle.names import OperationState  # noqa: E402
from orchestrator._rpc.cluster_hub import compress_answer  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def dropped_connection() -> SessionError:
    """A store error raised from psycopg's, as the PostgreSQL store raises it."""
    import psycopg

    try:
        try:
            raise psycopg.OperationalError("terminating connection due to administrator command")
        except psycopg.OperationalError as exc:
            raise SessionError("postgresql://db#s: cannot write it: terminating …") from exc
    except SessionError as error:
        return error


def test_a_dropped_connection_or_an_unreachable_store_is_transient_and_a_refusal_is_not() -> None:
    pytest.importorskip("psycopg")
    assert transient(dropped_connection())
    assert transient(StoreUnavailableError("postgresql://db: cannot connect: refused"))
    assert not transient(SessionError("session s: not a session"))
    assert not transient(ValueError("a bug"))


async def run(work: Any, *args: Any, attempt: int = 1, **kwargs: Any) -> Any:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    async def activity() -> Any:
        return await store_work(work, *args, **kwargs)

    result = await env.run(activity)
    assert beats  # it heartbeat while it worked
    return result


async def test_store_work_runs_in_a_thread_and_heartbeats() -> None:
    assert await run(lambda x: x + 1, 41) == 42


def raising(error: BaseException) -> Any:
    def work() -> None:
        raise error

    return work


async def test_a_transient_failure_is_retryable_and_names_the_store() -> None:
    with pytest.raises(ApplicationError) as caught:
        await run(raising(StoreUnavailableError("postgresql://db: cannot connect: refused")))
    assert caught.value.type == STORE_UNAVAILABLE
    assert not caught.value.non_retryable
    assert caught.value.message == "postgresql://db: cannot connect: refused"


async def test_other_failures_are_final_once_and_left_as_they_are_otherwise() -> None:
    refusal = SessionError("session s: Entry x not found")
    with pytest.raises(ApplicationError) as caught:
        await run(raising(refusal), once=True)
    assert (caught.value.type, caught.value.non_retryable) == ("SessionError", True)
    with pytest.raises(SessionError):
        await run(raising(refusal))
    nameless = ApplicationError("already worded", type="NoSession", non_retryable=True)
    with pytest.raises(ApplicationError) as passed:
        await run(raising(nameless), once=True)
    assert passed.value is nameless


async def test_a_redelivery_resends_its_journal_lines() -> None:
    call = TurnCall(session_id="s")

    async def first() -> TurnCall:
        return redelivered(call)

    env = ActivityEnvironment()
    assert (await env.run(first)).resend is False
    env.info = dataclasses.replace(env.info, attempt=2)
    assert (await env.run(first)).resend is True
    already = dataclasses.replace(call, resend=True)

    async def resent() -> TurnCall:
        return redelivered(already)

    assert await env.run(resent) is already


def test_a_manual_compaction_the_cluster_could_not_carry_out_is_unavailable() -> None:
    done = CompressResult(
        operation_id="op",
        status=OperationState.FAILED,
        error="prepare: the worker running it stopped answering (no heartbeat)",
        error_kind=UNAVAILABLE_KIND,
    )
    with pytest.raises(UnavailableError, match=r"^Cluster unavailable: prepare: .*applied$"):
        compress_answer(done)
