"""The remote summary route's own CPU: many summaries at once over HTTP, and nothing else.

Run on demand (not part of the test run)::

    python tests/bench/bench_remote.py                      # 2,000 calls at once, 5 rounds
    python tests/bench/bench_remote.py --calls 500 --rounds 3 --latency 0.2
    python tests/bench/bench_remote.py --profile remote.prof  # cProfile of the rounds

``bench_concurrent.py`` measures a thousand sessions compacting at once, each making two summary
requests through one :class:`~orchestrator.RemoteSummaryModel`; the HTTP route is a part of its
CPU that is hard to see among the sessions' own. This benchmark keeps only that part: the local
provider (``bench_concurrent.py --serve-provider``) in a child process, so its CPU is not ours,
and ``--calls`` concurrent :meth:`RemoteSummaryModel.complete` calls on one asyncio event loop
(anyio's, as the runtime runs), answered after ``--latency`` seconds. The prompts are the two a
bench session really sends (its history, about 14 kB, and a split turn's prefix, about 3 kB),
taken by compacting one bench session with a model that records them; the calls alternate them.

Each round prints the process's CPU time for the calls (``time.process_time``, which counts
this process only, whatever the other jobs on the machine do) and that per call. Each round has
a route of its own, so every call opens a connection, as in ``bench_concurrent.py`` (a session
sends its two summaries at once, so two thousand connections are opened together); with
``--reuse`` the rounds share one route, and the rounds after the first reuse its connections.
``--harness`` makes each call sleep L instead: the CPU of the tasks and the task group alone,
to subtract. ``--profile FILE`` writes cProfile's statistics of every round.
"""

from __future__ import annotations

import argparse
import cProfile
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_concurrent import GC, FakeModel, Provider, write_sessions  # noqa: E402


async def bench_requests() -> list[Any]:
    """The summary requests one bench session's compaction sends, recorded."""
    from orchestrator._runtime.operation.summarize import SummaryRoutes
    from orchestrator._runtime.session import AgentSession

    seen: list[Any] = []

    class Recorder(FakeModel):
        async def complete(self, request: Any) -> Any:
            seen.append(request)
            return await super().complete(request)

    with tempfile.TemporaryDirectory(prefix="bench-remote-") as folder:
        (path,) = write_sessions(Path(folder), 1, 300)
        routes = SummaryRoutes(candidates=(Recorder(0.0),))
        session = AgentSession.open(path, owner="bench", summarizer=routes)
        try:
            await session.compact()
        finally:
            session.close()
    return seen


async def rounds(
    url: str, calls: int, count: int, mode: str, latency: float, profile: cProfile.Profile | None
) -> list[float]:
    """``count`` rounds of ``calls`` concurrent summaries: the CPU seconds of each."""
    from orchestrator._core.model import ModelRequest
    from orchestrator._models.remote import RemoteSummaryModel
    from orchestrator._process.gc_policy import freeze_after_full_collections

    requests = await bench_requests()
    policy = freeze_after_full_collections()  # as the runtime path of bench_concurrent.py runs
    policy.settle()
    spent = []
    shared = RemoteSummaryModel(url)
    for _ in range(count):
        route = shared if mode == "reuse" else RemoteSummaryModel(url)

        async def one(request: ModelRequest, route: RemoteSummaryModel = route) -> None:
            if mode == "harness":
                await anyio.sleep(latency)
            else:
                await route.complete(request)

        await anyio.sleep(0.05)
        if profile is not None:
            profile.enable()
        GC.take()
        usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        async with anyio.create_task_group() as group:
            for i in range(calls):
                group.start_soon(one, requests[i % len(requests)])
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_SELF)
        user, system = after.ru_utime - usage.ru_utime, after.ru_stime - usage.ru_stime
        cpu = user + system
        if profile is not None:
            profile.disable()
        spent.append(cpu)
        print(
            f"{calls} calls: CPU {cpu:.3f} s ({cpu / calls * 1e6:.0f} µs a call; user "
            f"{user:.3f} s, system {system:.3f} s), wall {wall:.2f} s, {GC.take()}",
            flush=True,
        )
        if route is not shared:
            await route.aclose()
    await shared.aclose()
    policy.uninstall()
    return spent


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument(
        "--reuse", action="store_true", help="one route for every round: connections reused"
    )
    parser.add_argument(
        "--harness", action="store_true", help="sleep L instead of calling: the harness's CPU"
    )
    parser.add_argument("--profile", metavar="FILE", help="cProfile statistics of the rounds")
    args = parser.parse_args(argv)
    profile = cProfile.Profile() if args.profile else None
    print(f"Python {sys.version.split()[0]}, asyncio (through anyio)", flush=True)
    with Provider("http", args.latency, args.calls * args.rounds) as provider:
        mode = "harness" if args.harness else "reuse" if args.reuse else "fresh"
        spent = anyio.run(
            rounds, provider.url, args.calls, args.rounds, mode, args.latency, profile
        )
    later = spent[1:] or spent  # the first round also warms the caches and, reused, connects
    print(
        f"median of the rounds after the first: {statistics.median(later) / args.calls * 1e6:.0f} "
        f"µs a call (first round: {spent[0] / args.calls * 1e6:.0f} µs)"
    )
    if profile is not None:
        profile.dump_stats(args.profile)


if __name__ == "__main__":
    main(sys.argv[1:])
