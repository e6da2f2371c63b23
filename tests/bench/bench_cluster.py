"""Cluster benchmark (issue 10): many sessions compacting at once through Temporal workers.

Run on demand, with a Temporal server and PostgreSQL (docs/scale-out.md)::

    python tests/bench/bench_cluster.py --temporal 127.0.0.1:7233 \\
        --database postgresql://USER:PASSWORD@127.0.0.1/DB --sessions 1000 --workers 1,2,4

For each worker count: N fresh sessions (``--entries`` each, bench_core's history) are imported
into the database, W ``orchestrator worker`` processes start (each summary goes over HTTP to the
local provider server in a child process, answering after ``--latency`` seconds), and one client
sends N ``session.compress`` updates at once (update-with-start, one workflow per session).
Printed: wall time from the first request to the last answer, p50/p99 latency, compactions per
second, the workers' peak RSS (VmHWM), and the database's rows and bytes per stored entry
(``session_lines`` and ``journal_lines``, indexes and TOAST included), and the machine's load
average sampled during the run (``/proc/loadavg``: other work on the machine shows there).

Per compaction (issue 36): the events of its workflow's history (``--histories`` sessions'
histories, fetched once their workflows completed, so start and idle end included), the
Temporal server's CPU (``/proc/PID/stat`` of the process listening on the server's port, read
before and after; ``--temporal-pid`` names it instead) and the workers' CPU, and the
throughput; ``--one-process`` adds the same compactions in one process (bench_concurrent's
runtime path, file sessions, the same provider) for comparison. On a shared machine the wall
time depends on the other jobs; the CPU time much less.

``--profile DIR`` runs each worker under cProfile and stops it with SIGINT, leaving
``DIR/worker-W-I.prof`` to read with ``pstats``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_concurrent import Provider  # noqa: E402
from tests.bench.bench_core import write_session  # noqa: E402
from tests.cluster_kit import deployment_for_tests  # noqa: E402
from tests.services import fresh_schema_url  # noqa: E402


def import_sessions(database: str, count: int, entries: int) -> list[str]:
    from orchestrator._store.postgres import PostgresStore
    from orchestrator._store.postgres_pool import open_pool

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "s.jsonl"
        write_session(path, entries)
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    ids = []
    with open_pool(database, max_size=1) as pool:
        for _ in range(count):
            header = json.loads(lines[0])
            header["id"] = session_id = f"bench-{uuid.uuid4().hex[:12]}"
            with PostgresStore(database, pool=pool) as store:
                store.import_bytes((json.dumps(header) + "\n" + "".join(lines[1:])).encode())
            ids.append(session_id)
    return ids


class LoadSampler:
    """Samples /proc/loadavg (the 1-minute average) every few seconds while a run goes on."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            self._stop.wait(every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.samples:
            return "no samples"
        low, high = min(self.samples), max(self.samples)
        return f"load {low:.1f}-{high:.1f} (mean {statistics.mean(self.samples):.1f})"


def start_workers(count: int, args: argparse.Namespace, url: str, queue: str) -> list[Any]:
    workers = []
    for index in range(count):
        log = Path(tempfile.gettempdir()) / f"bench-worker-{queue}-{index}.log"
        profile: list[str] = []
        if args.profile:
            out = Path(args.profile) / f"worker-{count}-{index}.prof"
            profile = ["-m", "cProfile", "-o", str(out)]
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, *profile, "-m", "orchestrator", "worker",
                 "--temporal", args.temporal,
                 "--database", args.database, "--task-queue", queue, "--remote", url,
                 "--keep-recent-tokens", str(KEEP_RECENT), "--timeout", "600",
                 # The dev server allows 100 deployments a namespace: the tests' one.
                 "--deployment", deployment_for_tests()],
                stderr=stderr, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        workers.append((process, log))
    for process, log in workers:
        while "ready" not in log.read_text():
            if process.poll() is not None:
                raise SystemExit(log.read_text())
            time.sleep(0.1)
    return workers


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listener_pid(address: str) -> int | None:
    """The pid of the process listening on ``address``'s TCP port (the Temporal server)."""
    port = int(address.rpartition(":")[2])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(proc.name)
    return None


def server_background(args: argparse.Namespace, seconds: float = 10.0) -> float:
    """The Temporal server's CPU seconds per second with no benchmark traffic (others' work:
    the machine and its server are shared), sampled just before a run."""
    if not args.temporal_pid:
        return 0.0
    before = cpu_s(args.temporal_pid)
    time.sleep(seconds)
    return (cpu_s(args.temporal_pid) - before) / seconds


async def events_per_compaction(args: argparse.Namespace, ids: list[str]) -> float:
    """The mean event count of the first sessions' histories, once their workflows ended."""
    from temporalio.client import Client

    client = await Client.connect(args.temporal)
    counts = []
    for session_id in ids[: args.histories]:
        handle = client.get_workflow_handle(session_id)
        await handle.result()  # the run ends after its idle time: its whole history
        counts.append(len((await handle.fetch_history()).events))
    return statistics.mean(counts) if counts else float("nan")


def storage(database: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(database) as conn:
        entries = conn.execute("SELECT count(*) FROM session_lines").fetchone()
        journal = conn.execute("SELECT count(*) FROM journal_lines").fetchone()
        size = conn.execute(
            "SELECT pg_total_relation_size('session_lines'),"
            " pg_total_relation_size('journal_lines')"
        ).fetchone()
        # A journal line written twice: the same step of the same run of a machine.
        twice = conn.execute(
            "SELECT count(*) - count(DISTINCT (session_id, l->>'machine',"
            " coalesce(l->>'operationId', ''), coalesce(l->'data'->>'runId', ''),"
            " l->'data'->>'step', l->>'from', l->>'event', l->>'to'))"
            " FROM (SELECT session_id, line::jsonb AS l FROM journal_lines) AS lines"
        ).fetchone()
        # The steps not every compaction took (a retried call, a conflict), and how often.
        steps = conn.execute(
            "SELECT l->>'machine', l->>'from', l->>'event', l->>'to', count(*)"
            " FROM (SELECT line::jsonb AS l FROM journal_lines) AS lines GROUP BY 1, 2, 3, 4"
        ).fetchall()
    assert entries is not None
    assert journal is not None
    assert size is not None
    assert twice is not None
    most = max((row[4] for row in steps), default=0)
    return {
        "journal_twice": twice[0],
        "uncommon_steps": {" ".join(row[:4]): row[4] for row in steps if row[4] != most},
        "lines": entries[0],
        "journal": journal[0],
        "bytes_per_line": size[0] / max(entries[0], 1),
        "journal_bytes_per_line": size[1] / max(journal[0], 1),
    }


async def compress_all(
    args: argparse.Namespace, ids: list[str], queue: str
) -> tuple[list[float], list[str]]:
    from orchestrator._cluster.client import ClusterClient

    cluster = await ClusterClient.connect(args.temporal, task_queue=queue, idle_s=IDLE_S)
    latencies: list[float] = []
    failures: list[str] = []

    async def one(session_id: str) -> None:
        started = time.perf_counter()
        try:
            result = await cluster.compress(session_id)
        except Exception as error:  # counted and shown, so one failure does not hide the rest
            failures.append(f"{type(error).__name__}: {error}")
            return
        if result.status != "committed":
            failures.append(f"{result.status}: {result.error}")
            return
        latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(s) for s in ids))
    return latencies, failures


KEEP_RECENT = 2000
"""The compaction's kept tokens, on the workers and in one process alike."""
IDLE_S = 2.0
"""How long a session workflow waits for more work before it completes (its history ends)."""


def run(args: argparse.Namespace, workers: int) -> None:
    ids = import_sessions(args.database, args.sessions, args.entries)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with Provider("http", args.latency, args.sessions * 2) as provider:
        started_workers = start_workers(workers, args, provider.url, queue)
        try:
            background = server_background(args)
            server = cpu_s(args.temporal_pid) if args.temporal_pid else 0.0
            idle = [cpu_s(p.pid) for p, _ in started_workers]
            with LoadSampler() as load:
                begin = time.perf_counter()
                latencies, failures = asyncio.run(compress_all(args, ids, queue))
                wall = time.perf_counter() - begin
                # The workflows end after their idle time: that work counts too.
                time.sleep(IDLE_S + 1)
            rss = [peak_rss_mib(p.pid) for p, _ in started_workers]
            cpu = [cpu_s(p.pid) - c for (p, _), c in zip(started_workers, idle, strict=True)]
            span = time.perf_counter() - begin
            server = (cpu_s(args.temporal_pid) - server) if args.temporal_pid else float("nan")
            events = asyncio.run(events_per_compaction(args, ids))
        finally:
            for process, _ in started_workers:
                process.send_signal(signal.SIGINT if args.profile else signal.SIGTERM)
                process.wait()
    if failures:
        kinds = {kind: failures.count(kind) for kind in sorted(set(failures))}
        print(f"workers={workers}: {len(failures)} of {args.sessions} failed: {kinds}", flush=True)
    if not latencies:
        return
    latencies.sort()
    p99 = latencies[max(0, round(len(latencies) * 0.99) - 1)]
    print(
        f"workers={workers} sessions={args.sessions} L={args.latency}s: wall {wall:.1f} s, "
        f"p50 {statistics.median(latencies):.2f} s, p99 {p99:.2f} s, "
        f"{len(latencies) / wall:.1f} compactions/s, worker peak RSS "
        f"{', '.join(f'{r:.0f}' for r in rss)} MiB; db {storage(args.database)}; "
        f"{load.summary()}; worker CPU {', '.join(f'{c:.0f}' for c in cpu)} s, "
        f"Temporal server CPU {server:.0f} s",
        flush=True,
    )
    done = len(latencies)
    own = server - background * span
    print(
        f"  per compaction: {events:.1f} history events, Temporal server CPU "
        f"{server / done * 1e3:.1f} ms ({own / done * 1e3:.1f} ms less the server's background "
        f"of {background * 1e3:.0f} ms/s), workers' CPU {sum(cpu) / done * 1e3:.1f} ms; "
        f"{done / wall:.1f} compactions/s",
        flush=True,
    )


def one_process(args: argparse.Namespace) -> None:
    """The same compactions in one process: file sessions, the same provider and settings."""
    import anyio

    from orchestrator._core.tokens import CompactionSettings
    from orchestrator._runtime.session import AgentSession
    from orchestrator._runtime.types import RuntimeSettings
    from tests.bench.bench_concurrent import write_sessions

    settings = RuntimeSettings(compaction=CompactionSettings(keep_recent_tokens=KEEP_RECENT))
    outcomes: list[str] = []

    async def compact_all(provider: Provider) -> tuple[float, float]:
        routes = provider.routes()
        sessions = [
            AgentSession.open(path, owner="bench", summarizer=routes, settings=settings)
            for path in paths
        ]

        async def one(session: Any) -> None:
            outcomes.append(str((await session.compact()).status))

        own = cpu_s(os.getpid())
        begin = time.perf_counter()
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(one, session)
        wall, used = time.perf_counter() - begin, cpu_s(os.getpid()) - own
        for session in sessions:
            session.close()
        return wall, used

    with tempfile.TemporaryDirectory() as scratch:
        paths = write_sessions(Path(scratch), args.sessions, args.entries)
        with Provider("http", args.latency, args.sessions * 2) as provider:
            wall, used = anyio.run(compact_all, provider)
    done = outcomes.count("committed")
    print(
        f"one process sessions={args.sessions} L={args.latency}s: {done} committed "
        f"({len(outcomes)} run); per compaction: no history, CPU {used / done * 1e3:.1f} ms; "
        f"{done / wall:.1f} compactions/s (wall {wall:.1f} s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temporal", default=os.environ.get("ORCHESTRATOR_TEST_TEMPORAL"))
    parser.add_argument("--database", default=os.environ.get("ORCHESTRATOR_TEST_DATABASE"))
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--profile", help="run the workers under cProfile, output here")
    parser.add_argument("--temporal-pid", type=int, help="the dev server's pid, for its CPU")
    parser.add_argument("--histories", type=int, default=20, help="histories to count")
    parser.add_argument("--one-process", action="store_true", help="also one process")
    args = parser.parse_args()
    if not args.temporal or not args.database:
        parser.error("--temporal and --database are needed (or the ORCHESTRATOR_TEST_* variables)")
    if args.temporal_pid is None:
        args.temporal_pid = listener_pid(args.temporal)
    print(f"Temporal server pid {args.temporal_pid}", flush=True)
    if args.one_process:
        one_process(args)
    for count in (int(w) for w in args.workers.split(",")):
        # Each run in a schema of its own, dropped after (the tests' way: tests/services.py).
        with fresh_schema_url(args.database) as url:
            run(argparse.Namespace(**{**vars(args), "database": url}), count)


if __name__ == "__main__":
    main()
