"""Each session workflow run stays on the build it started on (issue 36, worker versioning).

A worker with other tables replaying a running workflow fails with a nondeterminism error and
the request hangs. With versioning, a run started on build A gets every later task (and its
activities) on build A's workers, while build B, made current, takes the new runs; a busy
session moves to the current build when it continues as new. The build id is computed from the
code and the tables, so a changed table is another build without anyone choosing a name.

Real Temporal dev server (tests/services.py); the two builds run in this process as two
workers polling one task queue as two versions of its deployment, told apart by the summaries
their (scripted) models write.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator._cluster.contract import NavigateRequest  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.versioning import WorkerVersion, build_id, promote  # noqa: E402
from orchestrator._cluster.worker import build_worker  # noqa: E402
from orchestrator._core.errors import UnavailableError  # noqa: E402
from orchestrator._core.resources import data_dir  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator.testing import summary_text  # noqa: E402
from tests.cluster_kit import (  # noqa: E402
    Database,
    connected,
    deployment_for_tests,
    entries,
    queue_name,
    temporal_address,
)
from tests.test_cluster import SETTINGS, routes, scripted  # noqa: E402

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestrator"
LEAF = "935170bb"  # the example session's leaf
OTHER_TIP = "11a25bfa"  # the tip of the example's abandoned branch


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _copy_build(tmp_path: Path) -> tuple[Path, Path, Path]:
    package = tmp_path / "orchestrator"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    machines = tmp_path / "machines"
    shutil.copytree(data_dir("machines"), machines)
    prompts = tmp_path / "prompts"
    shutil.copytree(data_dir("prompts"), prompts)
    return package, machines, prompts


def test_the_build_id_follows_the_code_and_the_tables(tmp_path: Path) -> None:
    package, machines, prompts = _copy_build(tmp_path)
    here = build_id()
    assert build_id(package, machines=machines, prompts=prompts) == here  # the same bytes
    version, digest = here.rsplit("-", 1)
    assert version == metadata.version("session-orchestrator")
    assert len(digest) == 12
    # One row of the operation table taken out, as in the trial that wedged a workflow.
    table = machines / "operation.toml"
    rows = table.read_text(encoding="utf-8").split("[[transitions]]")
    table.write_text("[[transitions]]".join(rows[:-1]), encoding="utf-8")
    changed_table = build_id(package, machines=machines, prompts=prompts)
    assert changed_table != here
    shutil.copy(data_dir("machines") / "operation.toml", table)
    (package / "_cluster" / "workflow.py").write_text("# another workflow\n", encoding="utf-8")
    assert build_id(package, machines=machines, prompts=prompts) not in (here, changed_table)


def _summaries(build: str) -> SummaryRoutes:
    # Each build's model writes its name into the summary: who ran a compaction shows in it.
    script = {
        "history": [summary_text(f"compacted on build {build}")] * 4,
        "branch": [summary_text(f"the branch, summarized on build {build}")] * 4,
        "turn_prefix": [summary_text(f"prefix on build {build}", purpose="turn_prefix")] * 4,
    }
    return routes(scripted(build, script))


async def _pinned_build(client: ClusterClient, session_id: str) -> str:
    described = await client.client.get_workflow_handle(session_id).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    return str(info.deployment_version.build_id)


async def test_a_run_finishes_on_its_build_while_a_new_build_takes_new_sessions(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    queue = queue_name()
    a, b = WorkerVersion(queue, "build-a"), WorkerVersion(queue, "build-b")
    old_session, new_session = database.add_example(), database.add_example()
    async with connected() as temporal:
        cluster = ClusterClient(temporal, task_queue=queue, idle_s=60)
        on_a = SessionActivities(database.location, _summaries("A"), SETTINGS)
        on_b = SessionActivities(database.location, _summaries("B"), SETTINGS)
        async with build_worker(temporal, on_a, task_queue=queue, version=a):
            await promote(temporal, a, task_queue=queue)
            # Any request starts the session's run: a move to where its leaf already is.
            moved = await cluster.navigate(old_session, NavigateRequest(target_id=LEAF))
            assert moved.new_leaf_id == LEAF
            assert await _pinned_build(cluster, old_session) == "build-a"
            async with build_worker(temporal, on_b, task_queue=queue, version=b):
                await promote(temporal, b, task_queue=queue)
                # The running session's compaction (workflow task and model call) stays on A.
                old = await cluster.compress(old_session)
                assert old.status == "committed", old
                assert old.summary is not None
                assert "compacted on build A" in old.summary
                assert await _pinned_build(cluster, old_session) == "build-a"
                # A session starting now starts on B, the current build.
                new = await cluster.compress(new_session)
                assert new.status == "committed", new
                assert new.summary is not None
                assert "compacted on build B" in new.summary
                assert await _pinned_build(cluster, new_session) == "build-b"


async def test_a_busy_session_moves_to_the_current_build_when_it_continues_as_new(
    tmp_path: Path,
) -> None:
    database = Database(str(tmp_path / "db"))
    queue = queue_name()
    a, b = WorkerVersion(queue, "build-a"), WorkerVersion(queue, "build-b")
    session = database.add_example()
    async with connected() as temporal:
        cluster = ClusterClient(temporal, task_queue=queue, idle_s=60, history_bound=30)
        on_a = SessionActivities(database.location, _summaries("A"), SETTINGS)
        on_b = SessionActivities(database.location, _summaries("B"), SETTINGS)
        async with build_worker(temporal, on_a, task_queue=queue, version=a):
            await promote(temporal, a, task_queue=queue)
            first = await cluster.compress(session)
            assert first.summary is not None
            assert "compacted on build A" in first.summary
            first_run = (await temporal.get_workflow_handle(session).describe()).run_id
            async with build_worker(temporal, on_b, task_queue=queue, version=b):
                await promote(temporal, b, task_queue=queue)
                # Moves back and forth until the history passes its bound and the run
                # continues as new (each navigation is a few dozen history events).
                targets = [OTHER_TIP, LEAF] * 5
                for target in targets:
                    await cluster.navigate(session, NavigateRequest(target_id=target))
                    described = await temporal.get_workflow_handle(session).describe()
                    if described.run_id != first_run:
                        break
                assert described.run_id != first_run
                # The next run works on B: its branch summary is B's model's.
                back = LEAF if target == OTHER_TIP else OTHER_TIP
                left = await cluster.navigate(
                    session, NavigateRequest(target_id=back, summarize=True)
                )
                assert left.summary_entry_id is not None, left
                stored = entries(tmp_path / "db" / f"{session}.jsonl")
                summary = next(e for e in stored if e["id"] == left.summary_entry_id)["summary"]
                assert "summarized on build B" in summary
                assert await _pinned_build(cluster, session) == "build-b"


def _worker_ready_line(tmp_path: Path, queue: str, *extra: str) -> str:
    log = tmp_path / f"worker-{len(list(tmp_path.glob('worker-*')))}.log"
    command = [sys.executable, "-m", "orchestrator", "worker", "--temporal", temporal_address()]
    command += ["--database", str(tmp_path / "db"), "--task-queue", queue, *extra]
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=stderr, cwd=ROOT)
    try:
        while "ready" not in log.read_text():
            if process.poll() is not None:
                raise AssertionError(f"exited with {process.returncode}: {log.read_text()}")
            time.sleep(0.05)
        return log.read_text().strip()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait()


def test_the_worker_command_is_versioned_and_makes_its_build_current(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    queue = queue_name()
    # Its own deployment, named after its task queue (the default).
    line = _worker_ready_line(tmp_path, queue)
    assert line.endswith(f"build {build_id()} (current)"), line
    line = _worker_ready_line(tmp_path, queue, "--no-promote")
    assert line.endswith(f"build {build_id()} (not made current)"), line
    # A deployment shared by several queues: each worker finds its build current at once.
    for shared in (queue_name(), queue_name()):
        line = _worker_ready_line(tmp_path, shared, "--deployment", deployment_for_tests())
        assert line.endswith(f"build {build_id()} (current)"), line
    line = _worker_ready_line(tmp_path, queue_name(), "--unversioned")
    assert "build" not in line
    assert line.startswith("orchestrator worker: ready: worker on")


async def test_a_build_no_worker_runs_is_refused_in_one_line() -> None:
    # Temporal knows a version only once its workers poll: promote asks again, then gives up
    # saying why (the worker command exits 2 with this line).
    queue = queue_name()
    async with connected() as temporal:
        with pytest.raises(UnavailableError) as refused:
            await promote(temporal, WorkerVersion(queue, "nobody"), task_queue=queue, within_s=0.3)
    message = str(refused.value)
    assert message.startswith(f"Temporal did not make build nobody current in deployment {queue}: ")
    assert "\n" not in message
