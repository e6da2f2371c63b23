"""Turns on a real Temporal server, in-process worker (issue 10): ``session.prompt`` hosted.

Each scenario runs the same prompt twice, on the one-process host (``AgentSession`` and its turn
driver) and on the cluster (the session workflow's turn flow, the agent and the appends as
activities), with the same scripted agent and summarizer, and checks that the turn table and
the operation table took the same steps with the same facts, and that the same entries were
appended: a threshold compaction after a turn (and the D20 continue), overflow recovery (compact
once, then retry), and a second overflow that ends the turn as the table says. The threshold
and overflow histories are replayed with Temporal's replayer (and kept as fixtures on request:
``ORCHESTRATOR_RECORD=1``, see tests/test_cluster_replay.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import Client  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from orchestrator._cluster.calls import JournalLine, NewEntry, TurnCall, message_id_for  # noqa: E402
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import NO_AGENT, AgentRaisedError, PromptResult  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.stores import WorkerStores  # noqa: E402
from orchestrator._cluster.turn.activities import TurnActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker, workflow_runner  # noqa: E402
from orchestrator._cluster.workflow import SessionWorkflow  # noqa: E402
from orchestrator._core.errors import SessionError  # noqa: E402
from orchestrator._core.model import ModelRequest  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._runtime.agent import Agent, AgentInput  # noqa: E402
from orchestrator._runtime.operation.retry import RetryPolicy  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.session import AgentSession  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings, TurnResult  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator.testing import (  # noqa: E402
    AgentHang,
    FunctionModel,
    ScriptedAgent,
    error_reply,
    reply,
    summary_text,
    tool_result,
)
from tests.cli_kit import EXAMPLE  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    entries,
    journal_rows,
    local_copy,
    queue_name,
    save_history,
    shape,
)

pytestmark = pytest.mark.anyio
T = TypeVar("T")

SETTINGS = RuntimeSettings(
    context_window=100_000,
    compaction=CompactionSettings(keep_recent_tokens=200),
    retry=RetryPolicy(base_delay_ms=10),
    prune=False,
)
OVER = 95_000
"""Context tokens over the threshold (100,000 - 16,384)."""
OVERFLOW = "prompt is too long: 150000 tokens > 100000 maximum"
Turns = Sequence[Sequence[Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def summarizer() -> SummaryRoutes:
    async def answer(request: ModelRequest) -> str:
        return summary_text(f"summary of the {request.purpose}", purpose=request.purpose)

    return SummaryRoutes(candidates=(FunctionModel(answer, name="s"),), retry=RetryPolicy())


async def run_local(
    tmp_path: Path, turns: Turns, settings: RuntimeSettings = SETTINGS
) -> tuple[TurnResult, Path]:
    path = local_copy(tmp_path / "local")
    runtime = AgentSession.open(
        path, agent=ScriptedAgent(turns), summarizer=summarizer(), settings=settings
    )
    try:
        result = await runtime.prompt("hello")
    finally:
        runtime.close()
    return result, path


During = Callable[[ClusterClient, str], Coroutine[Any, Any, None]]


async def run_cluster(
    client: Client,
    database: Database,
    turns: Turns,
    *,
    during: During | None = None,
    agent: bool = True,
    settings: RuntimeSettings = SETTINGS,
    routes: SummaryRoutes | None = None,
    runs: Agent | None = None,
) -> tuple[PromptResult, str, str]:
    session_id = database.add_example()
    queue = queue_name()
    scripted = runs or ScriptedAgent(turns)
    activities = SessionActivities(
        database.location,
        routes or summarizer(),
        settings,
        agent_factory=(lambda: scripted) if agent else None,
    )
    async with build_worker(client, activities, task_queue=queue):
        cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
        if during is None:
            result = await cluster.prompt(session_id, "hello")
        else:
            async with anyio.create_task_group() as group:
                group.start_soon(during, cluster, session_id)
                result = await cluster.prompt(session_id, "hello")
        handle = client.get_workflow_handle(session_id)
        await handle.result()
        history = await handle.fetch_history()
    await Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner()).replay_workflow(
        history
    )
    return result, session_id, history.to_json()


def new_local_entries(path: Path) -> list[dict[str, Any]]:
    known = {e["id"] for e in entries(EXAMPLE)}
    return [e for e in entries(path) if e["id"] not in known]


async def same_turn_on_both_hosts(
    tmp_path: Path,
    database: Database,
    turns: Turns,
    scenario: str | None = None,
    settings: RuntimeSettings = SETTINGS,
) -> tuple[PromptResult, str]:
    local, path = await run_local(tmp_path, turns, settings)
    async with connected() as client:
        result, session_id, history = await run_cluster(client, database, turns, settings=settings)
    assert database.turn_rows(session_id) == journal_rows(path, "turn")
    assert database.journal_rows(session_id) == journal_rows(path)
    assert [shape(e) for e in database.new_entries(session_id)] == [
        shape(e) for e in new_local_entries(path)
    ]
    assert (result.state, result.queued) == (local.state, local.queued)
    assert (result.reply or {}).get("stopReason") == (local.reply or {}).get("stopReason")
    if scenario is not None and not is_database_url(database.location):
        save_history(scenario, history)
    return result, session_id


async def test_a_prompt_runs_a_turn_and_appends_its_messages_under_derived_ids(
    tmp_path: Path, cluster_database: Database
) -> None:
    result, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, [[reply("Hi there.", tokens=1000)]]
    )
    assert result.state == "idle"
    assert result.reply is not None
    assert result.reply["content"] == [{"type": "text", "text": "Hi there."}]
    added = cluster_database.new_entries(session_id)
    assert [shape(e)[:2] for e in added] == [("message", "user"), ("message", "assistant")]
    # Each id is derived from the turn, so a redelivered append finds what it wrote.
    assert all(len(e["id"]) == 8 for e in added)
    rows = cluster_database.turn_rows(session_id)
    assert [r[:3] for r in rows] == [
        ("idle", "user_prompt", "running"),
        ("running", "agent_done", "idle"),
    ]


async def test_a_threshold_compaction_runs_after_the_turn_and_the_turn_continues(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [[reply("a long answer", tokens=OVER)], [reply("continued", tokens=1000)]]
    result, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, turns, "turn_threshold"
    )
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "continued"
    kinds = [shape(e)[0] for e in cluster_database.new_entries(session_id)]
    assert kinds == ["message", "message", "compaction", "custom_message", "message"]
    (compaction,) = cluster_database.new_compactions(session_id)
    assert cluster_database.operation_records(session_id)[0]["data"]["reason"] == "threshold"
    assert compaction["summary"].startswith(summary_text("summary of the history"))
    assert [r[:3] for r in cluster_database.turn_rows(session_id)] == [
        ("idle", "user_prompt", "running"),
        ("running", "agent_done", "pruning"),
        ("pruning", "pruned", "compacting"),
        ("compacting", "compaction_done", "continuing"),
        ("continuing", "resume", "running"),
        ("running", "agent_done", "idle"),
    ]


async def test_an_overflow_compacts_once_then_the_retry_succeeds(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [[error_reply(OVERFLOW)], [reply("fits now", tokens=1000)]]
    result, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, turns, "turn_overflow"
    )
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "fits now"
    assert len(cluster_database.new_compactions(session_id)) == 1
    # The failed reply stays; a context_edit omits it before the compaction, as one process.
    added = cluster_database.new_entries(session_id)
    assert [shape(e)[0] for e in added] == [
        "message",
        "message",
        "context_edit",
        "compaction",
        "message",
    ]
    assert (added[2]["targetId"], added[2]["replacement"]) == (added[1]["id"], None)
    assert [r[:3] for r in cluster_database.turn_rows(session_id)] == [
        ("idle", "user_prompt", "running"),
        ("running", "overflow", "compacting"),
        ("compacting", "compaction_done", "continuing"),
        ("continuing", "resume", "running"),
        ("running", "agent_done", "idle"),
    ]


async def test_a_second_overflow_ends_the_turn_without_a_second_compaction(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [[error_reply(OVERFLOW)], [error_reply(OVERFLOW)]]
    result, session_id = await same_turn_on_both_hosts(tmp_path, cluster_database, turns)
    assert result.reply is not None
    assert (result.reply["stopReason"], result.state) == ("error", "idle")
    assert len(cluster_database.new_compactions(session_id)) == 1
    last = cluster_database.turn_rows(session_id)[-1]
    assert last[:4] == ("running", "overflow", "idle", ("emit_overflow_failed",))


async def wait_for(cluster: ClusterClient, session_id: str, key: str, value: str) -> None:
    while True:
        state = await patiently(cluster.state, session_id)
        if state and state.get(key) == value:
            return
        await anyio.sleep(0.05)


async def patiently(ask: Callable[[str], Awaitable[T]], session_id: str) -> T:
    """Ask again when the worker was too slow to answer a query (a loaded machine)."""
    while True:
        try:
            return await ask(session_id)
        except SessionError as error:
            if "did not answer" not in str(error):
                raise


async def abort_when(cluster: ClusterClient, session_id: str, key: str, value: str) -> None:
    await wait_for(cluster, session_id, key, value)
    assert await patiently(cluster.abort, session_id) is True


async def test_abort_mid_turn_stops_the_agent_and_appends_nothing_half_done(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))

    async def abort(cluster: ClusterClient, session_id: str) -> None:
        await abort_when(cluster, session_id, "turnState", "running")

    async with connected() as client:
        result, session_id, _ = await run_cluster(client, database, [[AgentHang()]], during=abort)
    assert (result.state, result.reply) == ("idle", None)
    # The user message is whole; the agent's run completed no message before it was stopped
    # (what it completed is kept: tests/test_cluster_turn_parity.py).
    assert [shape(e)[:2] for e in database.new_entries(session_id)] == [("message", "user")]
    assert database.turn_rows(session_id)[-1][:4] == ("running", "abort", "idle", ("stop_agent",))


async def test_a_prompt_while_a_compaction_runs_is_queued_and_runs_after_it(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    queue = queue_name()
    release = anyio.Event()

    async def slow(request: ModelRequest) -> str:
        await release.wait()
        return summary_text("summary", purpose=request.purpose)

    routes = SummaryRoutes(candidates=(FunctionModel(slow, name="s"),), retry=RetryPolicy())
    agent = ScriptedAgent([[reply("after the compaction", tokens=10)]])
    activities = SessionActivities(database.location, routes, SETTINGS, agent_factory=lambda: agent)
    answers: dict[str, Any] = {}
    async with connected() as client, build_worker(client, activities, task_queue=queue):
        cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)

        async def compress() -> None:
            answers["compress"] = await cluster.compress(session_id)

        async with anyio.create_task_group() as group:
            group.start_soon(compress)
            await wait_for(cluster, session_id, "operationState", "summarizing")
            answers["prompt"] = await cluster.prompt(session_id, "queued one")
            release.set()
        await client.get_workflow_handle(session_id).result()
    assert answers["prompt"] == PromptResult(state="manual_compacting", queued=True)
    assert answers["compress"].status == "committed"
    rows = [r[:3] for r in database.turn_rows(session_id)]
    assert rows == [
        ("idle", "manual_compact", "manual_compacting"),
        ("manual_compacting", "compaction_done", "idle"),
        ("idle", "follow_up", "running"),
        ("running", "agent_done", "idle"),
    ]
    assert [shape(e)[:2] for e in database.new_entries(session_id)][-2:] == [
        ("message", "user"),
        ("message", "assistant"),
    ]


async def test_compress_mid_turn_stops_the_agent_then_compacts(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    answers: dict[str, Any] = {}

    async def compress(cluster: ClusterClient, session_id: str) -> None:
        await wait_for(cluster, session_id, "turnState", "running")
        answers["compress"] = await cluster.compress(session_id)

    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, [[AgentHang()]], during=compress
        )
    assert (result.state, result.reply) == ("idle", None)
    assert answers["compress"].status == "committed"
    assert [r[:3] for r in database.turn_rows(session_id)][-2:] == [
        ("running", "manual_compact", "manual_compacting"),
        ("manual_compacting", "compaction_done", "idle"),
    ]


async def test_a_worker_without_an_agent_refuses_prompts_as_serve_without_a_model(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    async with connected() as client:
        with pytest.raises(SessionError) as refused:
            await run_cluster(client, database, [], agent=False)
    assert str(refused.value) == NO_AGENT


def test_message_ids_are_derived_and_differ_by_key() -> None:
    assert message_id_for("s:r:user:1") == message_id_for("s:r:user:1")
    assert message_id_for("s:r:user:1") != message_id_for("s:r:user:2")
    assert len(message_id_for("x")) == 8


async def test_a_transient_error_is_retried_after_a_timer_as_the_table_says(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [[error_reply("503 service unavailable")], [reply("second try", tokens=1000)]]
    result, session_id = await same_turn_on_both_hosts(tmp_path, cluster_database, turns)
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "second try"
    assert [r[:3] for r in cluster_database.turn_rows(session_id)] == [
        ("idle", "user_prompt", "running"),
        ("running", "transient_error", "retrying"),
        ("retrying", "retry_wait_done", "running"),
        ("running", "agent_done", "idle"),
    ]


async def test_the_providers_retry_after_header_sets_the_wait_in_the_cluster(
    tmp_path: Path,
) -> None:
    # The route kept the Retry-After header on the failed reply (retryAfterMs); one process
    # waited for it, the workflow read only the error's words and waited its backoff.
    database = Database(str(tmp_path / "db"))
    quick = dataclasses.replace(SETTINGS, retry=RetryPolicy(base_delay_ms=1))
    limited = {**error_reply("429 Too Many Requests"), "retryAfterMs": 1500}
    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, [[limited], [reply("second try", tokens=1000)]], settings=quick
        )
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "second try"
    [start] = [e["event"] for e in result.events if e["event"]["type"] == "auto_retry_start"]
    assert start["delayMs"] == 1500


async def test_abort_during_the_retry_wait_cancels_only_the_wait(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    patient = RuntimeSettings(
        context_window=SETTINGS.context_window,
        compaction=SETTINGS.compaction,
        retry=RetryPolicy(base_delay_ms=3_600_000),
        prune=False,
    )

    async def abort(cluster: ClusterClient, session_id: str) -> None:
        await abort_when(cluster, session_id, "turnState", "retrying")

    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client,
            database,
            [[error_reply("503 service unavailable")]],
            during=abort,
            settings=patient,
        )
    assert result.state == "idle"
    assert result.reply is not None
    assert result.reply["stopReason"] == "error"
    assert database.turn_rows(session_id)[-1][:4] == (
        "retrying",
        "abort",
        "idle",
        ("cancel_retry_wait", "emit_retry_end"),
    )


async def test_abort_during_a_threshold_compaction_settles_it_as_cancelled(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))

    async def never(request: ModelRequest) -> str:
        await anyio.Event().wait()
        return "never"  # pragma: no cover - nobody sets the event

    hanging = SummaryRoutes(candidates=(FunctionModel(never, name="s"),), retry=RetryPolicy())

    async def abort(cluster: ClusterClient, session_id: str) -> None:
        await abort_when(cluster, session_id, "operationState", "summarizing")

    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, [[reply("big", tokens=OVER)]], during=abort, routes=hanging
        )
    assert result.state == "idle"
    assert database.new_compactions(session_id) == []
    assert database.turn_rows(session_id)[-1][:4] == (
        "compacting",
        "abort",
        "idle",
        ("cancel_compaction", "emit_compaction_aborted"),
    )
    assert database.journal_rows(session_id)[-1][:3] == ("summarizing", "cancel", "cancelled")


class Broken:
    """An agent with a bug: its run raises."""

    async def run(self, turn: AgentInput) -> AsyncIterator[dict[str, Any]]:
        raise KeyError("tool table")
        yield {}  # pragma: no cover - makes this an async generator


async def test_an_agent_that_raises_settles_the_turn_then_the_caller_hears_it(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    async with connected() as client:
        with pytest.raises(AgentRaisedError) as raised:
            await run_cluster(client, database, [], runs=Broken())
    # The journal's abort row: tests/test_cluster_turn_parity.py, against one process.
    assert (raised.value.kind, str(raised.value)) == ("KeyError", "'tool table'")


async def test_an_append_delivered_twice_appends_once(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    activities = TurnActivities(WorkerStores(database.location), SETTINGS)
    line = JournalLine(seq=0, source="idle", event="user_prompt", dest="running", effects=[])
    message = json.dumps({"role": "user", "content": "hi", "timestamp": 1})
    call = TurnCall(
        session_id=session_id,
        run_id="r1",
        journal=[line],
        entries=[NewEntry(entry_id="0a1b2c3d", message=message)],
    )
    environment = ActivityEnvironment()
    await environment.run(activities.append, call)
    # The worker died before saying so: Temporal delivers it again, the lines marked as resent.
    await environment.run(activities.append, dataclasses.replace(call, resend=True))
    assert [e["id"] for e in database.new_entries(session_id)] == ["0a1b2c3d"]
    assert len(database.turn_rows(session_id)) == 1
    taken = NewEntry(entry_id="0a1b2c3d", message=json.dumps({"role": "user", "content": "no"}))
    with pytest.raises(ApplicationError, match="taken by another entry"):
        await environment.run(activities.append, dataclasses.replace(call, entries=[taken]))
    policy = await environment.run(activities.turn_policy)
    assert (policy.has_agent, policy.max_retries) == (False, 3)
    with pytest.raises(ApplicationError, match="no agent configured"):
        await environment.run(activities.call_agent, call)


PRUNING = dataclasses.replace(SETTINGS, prune=True)


def two_outputs_over_the_threshold() -> list[Any]:
    """A turn reading an old and a new bash output, ending over the threshold: pruning fodder."""
    return [
        reply("", calls=[("c1", "bash", {"cmd": "a"})]),
        tool_result("c1", "old output " * 16_000, tool="bash"),
        reply("", calls=[("c2", "bash", {"cmd": "b"})]),
        tool_result("c2", "new output " * 20_000, tool="bash"),
        reply("read both", tokens=OVER),
    ]


async def test_with_pruning_on_a_threshold_turn_prunes_first_as_in_one_process(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [two_outputs_over_the_threshold()]
    result, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, turns, settings=PRUNING
    )
    records = cluster_database.operation_records(session_id)
    prune = [r for r in records if r["kind"] == "prune"]
    assert [r["to"] for r in prune] == ["committing", "committed"]
    pruned = [
        e for e in cluster_database.entries(session_id) if e.get("message", {}).get("prunedAt")
    ]
    local = [
        e
        for e in entries(tmp_path / "local" / "local.jsonl")
        if e.get("message", {}).get("prunedAt")
    ]
    # The same tool outputs were pruned on both hosts (the turn's old one among them).
    calls = [e["message"]["toolCallId"] for e in pruned]
    assert calls == [e["message"]["toolCallId"] for e in local]
    assert "c1" in calls
    assert "c2" not in calls
    assert sorted(prune[0]["data"]["entryIds"]) == sorted(e["id"] for e in pruned)
    # The re-measured context is under the threshold now: pruning alone was enough.
    assert [r[:3] for r in cluster_database.turn_rows(session_id)][1:3] == [
        ("running", "agent_done", "pruning"),
        ("pruning", "pruned", "idle"),
    ]
    assert cluster_database.new_compactions(session_id) == []


async def test_after_pruning_the_context_is_measured_against_a_set_threshold_as_in_one_process(
    tmp_path: Path, cluster_database: Database
) -> None:
    # Pruning saves enough to go under the reserve's line (100,000 - 16,384), not under a set
    # threshold of 50,000 tokens: one process compacts after pruning, and so must the cluster.
    compaction = dataclasses.replace(SETTINGS.compaction, threshold_tokens=50_000)
    settings = dataclasses.replace(PRUNING, compaction=compaction)
    turns = [two_outputs_over_the_threshold(), [reply("continued", tokens=1000)]]
    _, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, turns, settings=settings
    )
    assert [r[:3] for r in cluster_database.turn_rows(session_id)][1:3] == [
        ("running", "agent_done", "pruning"),
        ("pruning", "pruned", "compacting"),
    ]
    assert len(cluster_database.new_compactions(session_id)) == 1


async def test_with_pruning_on_and_nothing_to_prune_the_prune_is_skipped_as_in_one_process(
    tmp_path: Path, cluster_database: Database
) -> None:
    turns = [[reply("a long answer", tokens=OVER)], [reply("continued", tokens=1000)]]
    _, session_id = await same_turn_on_both_hosts(
        tmp_path, cluster_database, turns, settings=PRUNING
    )
    kinds = [r["kind"] for r in cluster_database.operation_records(session_id)]
    assert kinds[0] == "prune"
    assert "compaction" in kinds
