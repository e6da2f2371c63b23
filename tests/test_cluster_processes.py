"""Workers and servers as separate processes against a real Temporal server (issue 10).

* A worker killed with SIGKILL in the middle of a compaction's model call: another worker
  finishes it. Exactly one compaction entry, at most one extra model call, and the journal says
  what happened (the attempt lost with its worker, the wait, the second attempt, the commit).
* A worker killed with SIGKILL during ``prepare`` (held behind a lock on the session's lines),
  a second worker running: planning is delivered again there, the compaction commits once,
  and the session is idle and compacts again (it used to be wedged: see
  tests/test_cluster_no_wedge.py).
* Two clients compress the same session at once through two ``orchestrator serve --temporal``
  processes and two workers: one compaction; the other client is refused as a one-process
  server refuses it (``-32001``).
* A prompt through ``serve --temporal`` to a worker started with ``--model`` (the chat agent
  over litellm, as ``serve --model``): the provider says the context is too long, the turn
  compacts once and the retry answers.
* ``serve --temporal`` stopped (SIGTERM) while a compaction it forwarded runs: its client is
  told that the work goes on in the cluster, and the workflow commits it once.

Model calls go to the local provider server (the remote-summary protocol), which holds a
request until the test releases it, so "in the middle of a model call" needs no clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.calls import entry_id_for  # noqa: E402
from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._lifecycle.admission import BUSY_COMPACTING  # noqa: E402
from orchestrator._rpc.cluster_hub import SHUTTING_DOWN_CLUSTER  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator.testing import LocalProvider, Reply  # noqa: E402
from tests.cli_kit import either_part  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    deployment_for_tests,
    queue_name,
    sans_operation_id,
    save_history,
    temporal_address,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
COMMAND = (sys.executable, "-m", "orchestrator")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as server:
        yield server


class Processes:
    """The processes a test started; every one is killed at the end, whatever happened."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[str]] = []

    def worker(
        self,
        name: str,
        database: str,
        queue: str,
        provider: LocalProvider,
        *extra: str,
    ) -> Any:
        log = self.tmp_path / f"{name}.log"
        with log.open("w") as stderr:
            process = self._worker_process(database, queue, provider, stderr, extra)
        self.started.append(process)
        wait_until(lambda: "ready" in log.read_text(), process, log)
        return process

    def _worker_process(
        self,
        database: str,
        queue: str,
        provider: LocalProvider,
        stderr: Any,
        extra: tuple[str, ...] = (),
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                *COMMAND,
                "worker",
                "--temporal",
                temporal_address(),
                "--database",
                database,
                "--task-queue",
                queue,
                # One deployment for every test queue (cluster_kit.deployment_for_tests).
                "--deployment",
                deployment_for_tests(),
                "--remote",
                provider.url + "/summary",
                "--keep-recent-tokens",
                "200",
                *extra,
            ],
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )

    def server(self, database: str, queue: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                *COMMAND,
                "serve",
                "--temporal",
                temporal_address(),
                "--database",
                database,
                "--task-queue",
                queue,
            ],
            env=ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def wait_until(
    condition: Callable[[], bool], process: subprocess.Popen[str], log: Path | None = None
) -> None:
    """Poll for ``condition``; fail at once if ``process`` exits first."""
    while not condition():
        if process.poll() is not None:
            text = log.read_text() if log is not None else ""
            raise AssertionError(f"exited with {process.returncode} first: {text}")
        time.sleep(0.05)


def summary_calls(provider: LocalProvider) -> int:
    return sum(1 for request in provider.requests if request.path == "/summary")


async def compress_losing_the_first_worker(
    cluster_database: Database,
    provider: LocalProvider,
    processes: Processes,
    stop: signal.Signals,
    history: str | None = None,
) -> tuple[str, Any, int]:
    """Compress with one worker; once its model call is held, start a second and ``stop`` the
    first. The held call is never answered; the retry is. Returns the session's id, the
    compaction's outcome and the first worker's exit code (``history``: save the workflow's)."""
    import anyio

    database = cluster_database.location
    session_id = cluster_database.add_example()
    queue = queue_name()
    provider.push(
        Reply.hang(Reply.remote(either_part("lost"))), Reply.remote(either_part("the history"))
    )
    first = processes.worker("first", database, queue, provider)
    results: list[Any] = []
    async with connected() as client:
        cluster = ClusterClient(client, task_queue=queue, idle_s=0.5)
        async with anyio.create_task_group() as group:

            async def compress() -> None:
                results.append(await cluster.compress(session_id))

            group.start_soon(compress)
            while summary_calls(provider) < 1:
                await anyio.sleep(0.05)
            processes.worker("second", database, queue, provider)
            first.send_signal(stop)
            code = first.wait()
        handle = client.get_workflow_handle(session_id)
        await handle.result()
        if history is not None and not is_database_url(database):
            save_history(history, (await handle.fetch_history()).to_json())
    provider.release()
    (result,) = results
    assert result.status == "committed"
    new = cluster_database.new_compactions(session_id)
    assert [e["id"] for e in new] == [entry_id_for(result.operation_id)]
    assert summary_calls(provider) == 2  # the lost call and one more
    return session_id, result, code


async def test_a_worker_killed_mid_call_is_replaced_and_the_compaction_commits_once(
    cluster_database: Database, provider: LocalProvider, processes: Processes
) -> None:
    session_id, _, _ = await compress_losing_the_first_worker(
        cluster_database, provider, processes, signal.SIGKILL, history="crash"
    )
    records = cluster_database.operation_records(session_id)
    steps = [(r["from"], r["event"], r["to"]) for r in records]
    assert ("summarizing", "attempt_failed", "waiting_retry") in steps
    assert steps[-3:] == [
        ("summarizing", "summary_ready", "checking"),  # the summary gate (D32)
        ("checking", "summary_passed", "committing"),
        ("committing", "entry_appended", "committed"),
    ]
    lost = next(r for r in records if r["event"] == "attempt_failed")
    assert "stopped answering" in lost["data"]["error"]
    assert [r["data"]["step"] for r in records] == list(range(len(steps)))


async def test_a_worker_stopped_mid_call_gives_the_call_back_and_the_compaction_commits_once(
    cluster_database: Database, provider: LocalProvider, processes: Processes
) -> None:
    """SIGTERM, as a service manager stops a worker: the call it held fails over at once."""
    session_id, _, code = await compress_losing_the_first_worker(
        cluster_database, provider, processes, signal.SIGTERM
    )
    assert code == 0
    assert "orchestrator worker: stopped" in (processes.tmp_path / "first.log").read_text()
    records = cluster_database.operation_records(session_id)
    lost = next(r for r in records if r["event"] == "attempt_failed")
    assert lost["data"]["error"] == "model call: the worker running it was stopped"


def rpc(server: subprocess.Popen[str], request_id: int, method: str, **params: Any) -> None:
    assert server.stdin is not None
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    server.stdin.write(json.dumps(message) + "\n")
    server.stdin.flush()


def answer(server: subprocess.Popen[str], request_id: int) -> dict[str, Any]:
    assert server.stdout is not None
    while True:
        line = server.stdout.readline()
        assert line, "the server closed its output"
        message: dict[str, Any] = json.loads(line)
        if message.get("id") == request_id:
            return message


def held_summary(
    database: Database, provider: LocalProvider, processes: Processes, workers: int, servers: int
) -> tuple[str, list[subprocess.Popen[str]]]:
    """A stored session opened on ``servers`` front ends over ``workers``; its summary hangs."""
    session_id = database.add_example()
    queue = queue_name()
    provider.push(Reply.hang(Reply.remote(either_part("the history"))))
    for number in range(workers):
        processes.worker(f"worker{number}", database.location, queue, provider)
    fronts = [processes.server(database.location, queue) for _ in range(servers)]
    for server in fronts:
        rpc(server, 1, "session.open", path=session_id)
        assert answer(server, 1)["result"]["session_id"] == session_id
    return session_id, fronts


def test_two_clients_compress_one_session_through_two_servers_one_compaction(
    cluster_database: Database, provider: LocalProvider, processes: Processes
) -> None:
    session_id, (one, two) = held_summary(cluster_database, provider, processes, 2, 2)
    rpc(one, 2, "session.compress", session_id=session_id)
    wait_until(lambda: summary_calls(provider) == 1, one)
    rpc(two, 2, "session.compress", session_id=session_id)
    refused = answer(two, 2)
    assert sans_operation_id(refused["error"]) == {
        "code": -32001,
        "message": BUSY_COMPACTING,
        "data": {"operationId": "<id>"},
    }
    provider.release()
    done = answer(one, 2)["result"]
    assert set(done) == {
        "compacted",
        "entryId",
        "summary",
        "tokensBefore",
        "firstKeptEntryId",
        "shortSummary",
        "operationId",
    }
    assert [e["id"] for e in cluster_database.new_compactions(session_id)] == [done["entryId"]]
    assert summary_calls(provider) == 1


def test_a_prompt_through_worker_processes_recovers_from_an_overflow(
    tmp_path: Path, provider: LocalProvider, processes: Processes
) -> None:
    database = Database(str(tmp_path / "db"))
    session_id = database.add_example()
    queue = queue_name()
    # The compaction's two requests (the history to the remote route, the split turn's prefix to
    # the chat model) start together, as one process starts them: either may reach the provider
    # first, so each of these two replies answers either.
    chat_reply = Reply.summary(either_part("the summaries"))
    either = Reply(body={**chat_reply.body, "summary": either_part("the summaries")})
    provider.push(
        Reply.overflow_openai(), either, either, Reply.summary("Fits now.", prompt_tokens=1000)
    )
    chat = ("--model", "openai/test-model", "--api-base", provider.url + "/v1")
    window = ("--api-key", "test", "--context-window", "100000")
    processes.worker("agent", database.location, queue, provider, *chat, *window)
    server = processes.server(database.location, queue)
    rpc(server, 1, "session.open", path=session_id)
    assert answer(server, 1)["result"]["session_id"] == session_id
    rpc(server, 2, "session.prompt", session_id=session_id, text="hello")
    done = answer(server, 2)["result"]
    assert (done["state"], done["queued"]) == ("idle", False)
    assert done["reply"]["content"] == [{"type": "text", "text": "Fits now."}]
    assert len(database.new_compactions(session_id)) == 1
    assert [r[:3] for r in database.turn_rows(session_id)] == [
        ("idle", "user_prompt", "running"),
        ("running", "overflow", "compacting"),
        ("compacting", "compaction_done", "continuing"),
        ("continuing", "resume", "running"),
        ("running", "agent_done", "idle"),
    ]
    paths = [request.path for request in provider.requests]
    # The agent, the compaction's two summaries (the history, the split turn's prefix), the retry.
    assert paths[0] == paths[3] == "/v1/chat/completions"
    assert sorted(paths[1:3]) == ["/summary", "/v1/chat/completions"]
    assert len(paths) == 4


def test_sigterm_to_the_front_end_says_the_forwarded_work_goes_on(
    cluster_database: Database, provider: LocalProvider, processes: Processes
) -> None:
    # The server owns no work: stopping it must not tell its client "cancelled, nothing
    # applied" (as one process does) while the workflow goes on and commits the compaction.
    session_id, (server,) = held_summary(cluster_database, provider, processes, 1, 1)
    rpc(server, 2, "session.compress", session_id=session_id, operationId="sigterm-1")
    wait_until(lambda: summary_calls(provider) == 1, server)
    server.send_signal(signal.SIGTERM)
    assert answer(server, 2)["error"] == {
        "code": -32003,
        "message": SHUTTING_DOWN_CLUSTER,
        "data": {"kind": "shutdown", "applied": None, "operationId": "sigterm-1"},
    }
    assert server.wait() == 0
    provider.release()
    # The workflow goes on without the server: polling its journal for the last step.
    while cluster_database.operation_records(session_id)[-1]["to"] != "committed":
        time.sleep(0.05)
    assert len(cluster_database.new_compactions(session_id)) == 1


async def test_a_worker_killed_during_prepare_fails_over_and_the_session_stays_usable(
    pg_url: str, provider: LocalProvider, processes: Processes
) -> None:
    """No wedge: planning (one attempt, no heartbeat) used to leave the session refusing every
    compaction with none running, until the workflow was cancelled by hand."""
    import anyio
    import psycopg

    database = Database(pg_url)
    session_id = database.add_example()
    queue = queue_name()
    provider.push(
        Reply.remote(either_part("the history")), Reply.remote(either_part("the history"))
    )
    tag = uuid.uuid4().hex[:8]
    workers = {
        name: processes.worker(name, f"{pg_url}&application_name={name}", queue, provider)
        for name in (f"first-{tag}", f"second-{tag}")
    }
    results: list[Any] = []
    with psycopg.connect(pg_url) as held, psycopg.connect(pg_url, autocommit=True) as watcher:
        # Planning reads the session's lines: an exclusive lock on them holds it in flight.
        held.execute("LOCK TABLE session_lines IN ACCESS EXCLUSIVE MODE")
        async with connected() as client:
            cluster = ClusterClient(client, task_queue=queue, idle_s=0.5)
            async with anyio.create_task_group() as group:

                async def compress() -> None:
                    results.append(await cluster.compress(session_id))

                group.start_soon(compress)
                query = (
                    "SELECT application_name FROM pg_stat_activity"
                    " WHERE application_name = ANY(%s) AND wait_event_type = 'Lock'"
                )
                while not (rows := watcher.execute(query, (list(workers),)).fetchall()):
                    await anyio.sleep(0.05)
                victim = workers[rows[0][0]]
                victim.kill()  # SIGKILL, in the middle of prepare
                victim.wait()
                held.rollback()  # the store answers again (the other worker is running)
            state = await cluster.state(session_id)
            assert state is not None
            assert (state["busy"], state["turnState"]) == (False, "idle")
            (done,) = results
            assert done.status == "committed"
            assert [e["id"] for e in database.new_compactions(session_id)] == [
                entry_id_for(done.operation_id)
            ]
            # Not refused as "already running": the next compaction runs ("Already compacted").
            again = await cluster.compress(session_id)
            assert again.operation_id != done.operation_id
            assert again.status in {"committed", "skipped"}
    turn = [r[:3] for r in database.turn_rows(session_id)]
    assert turn[:2] == [
        ("idle", "manual_compact", "manual_compacting"),
        ("manual_compacting", "compaction_done", "idle"),
    ]
