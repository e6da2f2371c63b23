"""The session workflow on a real Temporal server, in-process worker (issue 10).

Each scenario runs the same compaction twice, on the one-process host (anyio driver) and on the
cluster (workflow + activities), and checks that the operation table took the same steps with
the same facts on both: retries, candidates and halvings are the table's decisions on either
host. The histories are replayed with Temporal's replayer (and kept as fixtures on request:
``ORCHESTRATOR_RECORD=1``, see tests/test_cluster_replay.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from temporalio.client import Client  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from orchestrator._cluster.calls import entry_id_for  # noqa: E402
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import CompressResult  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.worker import build_worker, workflow_runner  # noqa: E402
from orchestrator._cluster.workflow import SessionWorkflow  # noqa: E402
from orchestrator._core.errors import (  # noqa: E402
    ContextOverflowError,
    FatalModelError,
    SessionError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._lifecycle.admission import BUSY_COMPACTING  # noqa: E402
from orchestrator._runtime.hooks import Hooks  # noqa: E402
from orchestrator._runtime.operation.retry import RetryPolicy  # noqa: E402
from orchestrator._runtime.operation.runner import OperationRunner  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.ports import Ports  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store.journal import Journal  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator._store.session import Session  # noqa: E402
from orchestrator.testing import FunctionModel, summary_text  # noqa: E402
from tests.cli_kit import pi_user_line  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    journal_rows,
    local_copy,
    queue_name,
    save_history,
)

pytestmark = pytest.mark.anyio

SETTINGS = RuntimeSettings(compaction=CompactionSettings(keep_recent_tokens=200))
HANG = "hang"
Script = Mapping[str, Sequence[str | BaseException]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def scripted(name: str, script: Script) -> FunctionModel:
    """A model answering each purpose (history, turn_prefix) from its own script, in order.

    Keyed by purpose because the one-process host starts a split turn's two requests at once:
    the order of calls across purposes is not fixed, the order within one is.
    """
    left = {purpose: list(items) for purpose, items in script.items()}

    async def answer(request: ModelRequest) -> str:
        item = left[request.purpose].pop(0)
        if isinstance(item, BaseException):
            raise item
        if item == HANG:
            await anyio.Event().wait()
        return item

    return FunctionModel(answer, name=name)


# Summaries the gate (D32) passes, for the history and for a split turn's prefix.
HISTORY = summary_text("the history")
PREFIX = summary_text("the prefix", purpose="turn_prefix")


def routes(*models: FunctionModel) -> SummaryRoutes:
    return SummaryRoutes(candidates=models, retry=RetryPolicy(base_delay_ms=10))


async def run_local(tmp_path: Path, summarizer: SummaryRoutes, reason: str) -> Path:
    path = local_copy(tmp_path / "local")
    session = Session.open(path)
    ports = Ports(session=session, routes=summarizer, journal=Journal.open(path))
    await OperationRunner(ports, SETTINGS.compaction).compaction(reason=reason)
    session.close()
    return path


async def run_cluster(
    client: Client,
    database: Database,
    summarizer: SummaryRoutes,
    reason: str,
    *,
    during: Callable[[ClusterClient, str], Coroutine[Any, Any, None]] | None = None,
    settings: RuntimeSettings = SETTINGS,
    hooks: Hooks | None = None,
) -> tuple[CompressResult, str, str]:
    session_id = database.add_example()
    queue = queue_name()
    activities = SessionActivities(database.location, summarizer, settings, hooks)
    async with build_worker(client, activities, task_queue=queue):
        cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
        async with anyio.create_task_group() as group:
            if during is not None:
                group.start_soon(during, cluster, session_id)
            result = await cluster.compress(session_id, reason=reason)
        handle = client.get_workflow_handle(session_id)
        await handle.result()
        history = await handle.fetch_history()
    await Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner()).replay_workflow(
        history
    )
    return result, session_id, history.to_json()


async def same_steps_on_both_hosts(
    tmp_path: Path,
    database: Database,
    make: Callable[[], SummaryRoutes],
    reason: str,
    scenario: str,
) -> tuple[CompressResult, str]:
    local = await run_local(tmp_path, make(), reason)
    async with connected() as client:
        result, session_id, history = await run_cluster(client, database, make(), reason)
    assert database.journal_rows(session_id) == journal_rows(local)
    if not is_database_url(database.location):
        save_history(scenario, history)
    return result, session_id


async def test_a_manual_compaction_commits_one_entry_whose_id_the_operation_fixed(
    tmp_path: Path, cluster_database: Database
) -> None:
    def make() -> SummaryRoutes:
        return routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))

    result, session_id = await same_steps_on_both_hosts(
        tmp_path, cluster_database, make, "manual", "manual"
    )
    assert result.status == "committed"
    assert result.entry_id == entry_id_for(result.operation_id)
    new = cluster_database.new_compactions(session_id)
    assert [e["id"] for e in new] == [result.entry_id]
    assert new[0]["summary"].startswith(HISTORY)
    assert result.summary == new[0]["summary"]


async def test_a_plain_compaction_s_whole_history_has_at_most_24_events(
    cluster_database: Database,
) -> None:
    """Lean histories (issue 36): the workflow's whole run for one manual compaction of a split
    turn (start, the update, both summaries, the commit, the idle end) on the real server.

    It was 72 events: every phase an activity (three events, and a workflow task's three),
    a timer for the deadline, a patch marker. Planning, hooks, the commit and the journal are
    local activities now (one marker each), the deadline bounds the model call instead of a
    timer, and the split turn's prefix is asked alongside the history summary, as one process
    asks it: the model calls stay one regular, heartbeating activity, so a lost worker's call
    fails over as before (tests/test_cluster_processes.py).
    """
    summarizer = routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))
    async with connected() as client:
        result, session_id, history = await run_cluster(
            client, cluster_database, summarizer, "manual"
        )
    assert result.status == "committed"
    assert result.summary is not None
    assert PREFIX in result.summary  # both requests answered
    events = json.loads(history)["events"]
    assert len(events) <= 24, [e["eventType"] for e in events]
    scheduled = [
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in events
        if "activityTaskScheduledEventAttributes" in e
    ]
    assert scheduled == ["call_model"]
    timers = [e for e in events if "timerStartedEventAttributes" in e]
    assert len(timers) == 1  # the idle end's: no timer for the deadline


async def test_threshold_walks_the_candidates_and_retries_as_the_table_says(
    tmp_path: Path, cluster_database: Database
) -> None:
    def make() -> SummaryRoutes:
        first = scripted(
            "a",
            {
                "history": [TransientModelError("down"), FatalModelError("bad")],
                "turn_prefix": [PREFIX],
            },
        )
        return routes(first, scripted("b", {"history": [summary_text("from b")]}))

    result, _ = await same_steps_on_both_hosts(
        tmp_path, cluster_database, make, "threshold", "candidate_switch"
    )
    assert result.status == "committed"
    assert result.summary is not None
    assert result.summary.startswith(summary_text("from b"))


async def test_a_summarizer_overflow_halves_the_request(
    tmp_path: Path, cluster_database: Database
) -> None:
    def make() -> SummaryRoutes:
        overflow = ContextOverflowError("prompt is too long")
        return routes(scripted("a", {"history": [overflow, HISTORY], "turn_prefix": [PREFIX]}))

    result, _ = await same_steps_on_both_hosts(
        tmp_path, cluster_database, make, "overflow", "overflow"
    )
    assert result.status == "committed"


async def test_every_candidate_failing_ends_failed_and_the_session_is_unchanged(
    tmp_path: Path, cluster_database: Database
) -> None:
    def make() -> SummaryRoutes:
        fatal = FatalModelError("no")
        return routes(scripted("a", {"history": [fatal], "turn_prefix": [PREFIX]}))

    result, session_id = await same_steps_on_both_hosts(
        tmp_path, cluster_database, make, "threshold", "threshold_failed"
    )
    assert (result.status, result.error_kind) == ("failed", "fatal")
    assert cluster_database.new_compactions(session_id) == []


async def wait_until_summarizing(cluster: ClusterClient, session_id: str) -> None:
    while True:
        state = await cluster.state(session_id)
        if state and state.get("operationState") == "summarizing":
            return
        await anyio.sleep(0.05)


async def test_abort_cancels_the_model_call_and_nothing_is_applied(
    cluster_database: Database,
) -> None:
    summarizer = routes(scripted("a", {"history": [HANG], "turn_prefix": [HANG]}))

    async def abort(cluster: ClusterClient, session_id: str) -> None:
        await wait_until_summarizing(cluster, session_id)
        assert await cluster.abort(session_id) is True

    async with connected() as client:
        result, session_id, history = await run_cluster(
            client, cluster_database, summarizer, "manual", during=abort
        )
    if not is_database_url(cluster_database.location):
        save_history("abort", history)
    assert result.status == "cancelled"
    assert cluster_database.new_compactions(session_id) == []
    last = cluster_database.journal_rows(session_id)[-1]
    assert last[:3] == ("summarizing", "cancel", "cancelled")


async def test_a_second_compaction_while_one_runs_is_refused(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    summarizer = routes(scripted("a", {"history": [HANG], "turn_prefix": [HANG]}))
    refused: list[str] = []

    async def second(cluster: ClusterClient, session_id: str) -> None:
        await wait_until_summarizing(cluster, session_id)
        with pytest.raises(SessionError) as caught:
            await cluster.compress(session_id)
        refused.append(str(caught.value))
        await cluster.abort(session_id)

    async with connected() as client:
        result, _, _ = await run_cluster(client, database, summarizer, "manual", during=second)
    assert refused == [BUSY_COMPACTING]
    assert result.status == "cancelled"


async def test_a_session_not_in_the_store_is_refused_with_its_name(tmp_path: Path) -> None:
    async with connected() as client:
        queue = queue_name()
        activities = SessionActivities(str(tmp_path), routes(scripted("a", {})), SETTINGS)
        async with build_worker(client, activities, task_queue=queue):
            cluster = ClusterClient(client, task_queue=queue, idle_s=0.2)
            missing = f"no-such-{queue}"
            with pytest.raises(SessionError, match=f"session {missing}: not in"):
                await cluster.compress(missing)
            assert await cluster.abort(missing) is False


async def test_the_operation_deadline_ends_a_hung_call_as_failed(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    summarizer = routes(scripted("a", {"history": [HANG], "turn_prefix": [HANG]}))
    settings = RuntimeSettings(
        compaction=SETTINGS.compaction, operation_deadline_s=0.5, model_timeout_s=None
    )
    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, summarizer, "manual", settings=settings
        )
    assert (result.status, result.error_kind) == ("failed", "timeout")
    assert result.error == "compaction did not finish within 0.5 s"
    assert database.journal_rows(session_id)[-1][:3] == ("summarizing", "deadline_passed", "failed")
    assert database.new_compactions(session_id) == []


async def test_a_hook_that_cancels_ends_the_compaction_before_any_model_call(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    model = scripted("a", {})
    hooks = Hooks()
    hooks.on("session_before_compact", lambda payload: {"cancel": True})
    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, routes(model), "manual", hooks=hooks
        )
    assert (result.status, result.reason) == ("cancelled", "Compaction cancelled")
    assert model.requests == []
    assert database.journal_rows(session_id)[-1][:3] == (
        "consulting_hooks",
        "hooks_cancelled",
        "cancelled",
    )


async def test_a_compaction_a_hook_supplies_is_committed_verbatim(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "db"))
    model = scripted("a", {})
    hooks = Hooks()
    hooks.on(
        "session_before_compact",
        lambda payload: {"compaction": {"summary": "from the hook", "tokensBefore": 7}},
    )
    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, routes(model), "manual", hooks=hooks
        )
    assert (result.status, result.summary, result.tokens_before) == (
        "committed",
        "from the hook",
        7,
    )
    assert model.requests == []
    (entry,) = database.new_compactions(session_id)
    assert (entry["summary"], entry["fromExtension"]) == ("from the hook", True)


def last_id(path: Path) -> str:
    """The id of the last entry in a session file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return str(json.loads(lines[-1])["id"])


def writes_meanwhile(name: str, path: Callable[[], Path]) -> FunctionModel:
    """A summarizer busy once (a 429), then answering while another program appends (D27)."""
    busy = [TransientModelError("429 Too Many Requests")]

    async def answer(request: ModelRequest) -> str:
        if request.purpose != "history":
            return PREFIX
        if busy:
            raise busy.pop()
        target = path()
        with target.open("ab") as file:
            file.write(pi_user_line(last_id(target), text="typed in pi meanwhile"))
        return HISTORY

    return FunctionModel(answer, name=name)


async def test_a_conflict_after_a_cured_retry_says_conflict_on_both_hosts(tmp_path: Path) -> None:
    # The drift of issue 34: a 429 retried away, then the commit meets another writer. The
    # conflict, not the cured failure, is what the caller hears, on either host.
    local_path = local_copy(tmp_path / "local")
    session = Session.open(local_path)
    journal = Journal.open(local_path)
    ports = Ports(
        session=session, routes=routes(writes_meanwhile("a", lambda: local_path)), journal=journal
    )
    local = await OperationRunner(ports, SETTINGS.compaction).compaction(reason="threshold")
    session.close()
    database = Database(str(tmp_path / "db"))
    ids: list[str] = []
    summarizer = routes(writes_meanwhile("a", lambda: Path(database.location) / f"{ids[0]}.jsonl"))

    async def remember(cluster: ClusterClient, session_id: str) -> None:
        ids.append(session_id)

    async with connected() as client:
        result, session_id, _ = await run_cluster(
            client, database, summarizer, "threshold", during=remember
        )
    assert (local.status, result.status) == ("conflict", "conflict")
    for error, kind in ((local.error, local.error_kind), (result.error, result.error_kind)):
        assert error is not None
        assert "nothing was applied" in error
        assert "429" not in error
        assert kind is None
    assert database.journal_rows(session_id) == journal_rows(local_path)
    assert database.new_compactions(session_id) == []


REFUSAL = "I'm sorry, but I can't help with summarizing this conversation."


def supplying(summary: str) -> Hooks:
    """Hooks whose session_before_compact supplies ``summary`` (as a pi extension may)."""
    hooks = Hooks()
    hooks.on("session_before_compact", lambda payload: {"compaction": {"summary": summary}})
    return hooks


async def both_hosts_with_hooks(
    tmp_path: Path, make: Callable[[], SummaryRoutes], hooks: Hooks
) -> tuple[Any, CompressResult, Database, str, Path]:
    """One manual compaction on each host, the same hooks and routes."""
    local_path = local_copy(tmp_path / "local")
    session = Session.open(local_path)
    ports = Ports(session=session, routes=make(), journal=Journal.open(local_path), hooks=hooks)
    local = await OperationRunner(ports, SETTINGS.compaction).compaction(reason="manual")
    session.close()
    database = Database(str(tmp_path / "db"))
    async with connected() as client:
        result, session_id, _ = await run_cluster(client, database, make(), "manual", hooks=hooks)
    assert database.journal_rows(session_id) == journal_rows(local_path)
    return local, result, database, session_id, local_path


async def test_a_hook_summary_the_gate_refuses_is_summarized_by_the_model_on_both_hosts(
    tmp_path: Path,
) -> None:
    # Issue 38's gap: a hook's refusal text was committed unchecked. Now the gate refuses it
    # (D32) and the model route writes the summary, as for a malformed hook result.
    def make() -> SummaryRoutes:
        return routes(scripted("a", {"history": [HISTORY], "turn_prefix": [PREFIX]}))

    local, result, database, session_id, local_path = await both_hosts_with_hooks(
        tmp_path, make, supplying(REFUSAL)
    )
    assert (local.status, result.status) == ("committed", "committed")
    assert (local.from_extension, result.from_extension) == (False, False)
    assert local.entry is not None
    assert local.entry["summary"].startswith(HISTORY)
    assert result.summary is not None
    assert result.summary.startswith(HISTORY)
    rows = database.journal_rows(session_id)
    moves = [row[:3] for row in rows]
    assert ("consulting_hooks", "hook_supplied", "checking_hook") in moves
    [refused] = [row for row in rows if row[:3][1:] == ("summary_refused", "summarizing")]
    assert refused[0] == "checking_hook"
    assert refused[4]["refused_check"] == "refusal"
    assert "drop_hook_result" in refused[3]


async def test_a_hook_summary_refused_with_no_model_fails_naming_the_check_on_both_hosts(
    tmp_path: Path,
) -> None:
    def make() -> SummaryRoutes:
        return routes()  # no model to write one instead

    error = "Error: upstream request failed (502 Bad Gateway)"
    local, result, database, session_id, _ = await both_hosts_with_hooks(
        tmp_path, make, supplying(error)
    )
    assert (local.status, result.status) == ("failed", "failed")
    for said in (local.error, result.error):
        assert said is not None
        assert said.startswith("the summary a hook supplied was refused (error_text)")
    assert (local.error_kind, result.error_kind) == ("refused", "refused")
    assert database.new_compactions(session_id) == []
    assert database.journal_rows(session_id)[-1][:3] == (
        "checking_hook",
        "summary_refused",
        "failed",
    )
