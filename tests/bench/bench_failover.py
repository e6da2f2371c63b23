"""How long a worker's death mid-call takes to fail over to another worker (issue 10).

Run on demand, against a running Temporal server::

    python tests/bench/bench_failover.py --temporal 127.0.0.1:7233 --runs 5 \\
        [--database postgresql://USER:PASSWORD@127.0.0.1/DB]

Each run: one worker process takes a compaction, whose summary request the local provider holds;
a second worker starts; the first is killed (SIGKILL) while it holds the call, its workflow's
sticky queue and no other worker's cache. Measured from the kill: until the call is asked
again on the second worker (the provider receives it: the failover), and until the compaction
is committed. Printed per run, with the median, the maximum and ``/proc/loadavg`` before and
after. The table's retry wait is part of the failover (the default first wait is 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402

from orchestrator._cluster.client import ClusterClient  # noqa: E402
from orchestrator.testing import LocalProvider, Reply  # noqa: E402
from tests.cli_kit import either_part  # noqa: E402
from tests.cluster_kit import Database, queue_name  # noqa: E402

COMMAND = (sys.executable, "-m", "orchestrator")


def worker(address: str, database: str, queue: str, url: str, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                *COMMAND,
                "worker",
                "--temporal",
                address,
                "--database",
                database,
                "--task-queue",
                queue,
                "--remote",
                url + "/summary",
                "--keep-recent-tokens",
                "200",
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    while "ready" not in log.read_text():
        if process.poll() is not None:
            raise SystemExit(f"the worker exited: {log.read_text()}")
        time.sleep(0.05)
    return process


def calls(provider: LocalProvider) -> int:
    return sum(1 for request in provider.requests if request.path == "/summary")


async def one_run(address: str, database: Database, folder: Path) -> tuple[float, float]:
    session_id = database.add_example()
    queue = queue_name()
    with LocalProvider() as provider:
        provider.push(Reply.hang(Reply.remote("lost")), Reply.remote(either_part("the history")))
        first = worker(address, database.location, queue, provider.url, folder / "first.log")
        second: subprocess.Popen[str] | None = None
        try:
            client = await Client.connect(address)
            cluster = ClusterClient(client, task_queue=queue, idle_s=0.5)
            compress = asyncio.ensure_future(cluster.compress(session_id))
            while calls(provider) < 1:
                await asyncio.sleep(0.02)
            second = worker(address, database.location, queue, provider.url, folder / "2.log")
            killed = time.monotonic()
            first.send_signal(signal.SIGKILL)
            first.wait()
            while calls(provider) < 2:
                await asyncio.sleep(0.02)
            failed_over = time.monotonic() - killed
            provider.release()
            result = await compress
            committed = time.monotonic() - killed
            assert result.status == "committed", result
        finally:
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
    return failed_over, committed


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--database", default=None)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        database = Database(args.database or str(folder / "db"))
        print(f"load before: {load()}")
        failovers: list[float] = []
        commits: list[float] = []
        for run in range(args.runs):
            failed_over, committed = await one_run(args.temporal, database, folder)
            failovers.append(failed_over)
            commits.append(committed)
            print(f"run {run + 1}: failed over {failed_over:.2f} s, committed {committed:.2f} s")
        print(f"load after: {load()}")
        for name, values in (("failed over", failovers), ("committed", commits)):
            print(f"{name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
