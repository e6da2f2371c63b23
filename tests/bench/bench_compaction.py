"""Compaction benchmark: orchestration overhead of one compaction against a fixed-latency model.

Run on demand (not part of the test run)::

    python tests/bench/bench_compaction.py                 # 1k, 10k, 100k entries, 5 runs, L=0.2 s
    python tests/bench/bench_compaction.py --runs 3 1000     # chosen sizes and runs
    python tests/bench/bench_compaction.py --latency 0.5     # another model latency
    python tests/bench/bench_compaction.py --timeline 10000  # where the time goes, piece by piece

The model is a fake whose ``complete()`` sleeps ``L`` seconds and answers with a short summary.
For each size two sessions are built from the same linear history as ``bench_core.py``, with a
different last turn:

* plain: the last turn opens with a user message bigger than ``keep_recent_tokens``, so the cut
  lands on that user message and one summary (the history) is asked for;
* split: the last turn opens with a short user message followed by an assistant message bigger
  than ``keep_recent_tokens``, so the cut lands inside the turn and two summaries are asked for
  (history and turn prefix), which must run concurrently: total about ``L``, not ``2L``.

Each run opens a fresh copy of the session file (the JSONL store, fsync per turn, opened as its
owner; loading, the writer lock and the first context build are not timed: a live session has
them all) and times
``AgentSession.compact()``: plan, hooks, summaries, commit (one appended, fsynced line). It
prints the median total, total minus ``L``, the time with no model call in flight (total
minus the time during which at least one call was under way, measured around the fake's sleep:
the orchestration overhead), the CPU time the
process spent meanwhile (all its threads: on a shared machine steadier than the wall time), how
many model calls were made and how many were in flight at once, and, for reference, the time
planning alone takes and what one fsync of an appended line costs on the disk the sessions are
on, back to back and after an idle wait of ``L`` (the commit makes one, just after its model's
answer: its share of the overhead belongs to the disk and to how fast the machine wakes from
idle, and varies with what else writes to it).

Why both. The fake's ``anyio.sleep(L)`` lasts about half a millisecond longer than ``L``: asyncio
rounds the wait it asks the kernel for up to the next whole millisecond, and the loop's pass
after the wake-up runs before the sleeper resumes. A real model's answer arrives on a socket,
which wakes the loop at once. So total minus ``L`` counts that half millisecond of the fake
against the orchestration, and the time with no model call in flight does not.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction  # noqa: E402
from orchestrator._core.model import ModelRequest, ModelResponse, Usage  # noqa: E402
from orchestrator._core.tokens import CompactionSettings  # noqa: E402
from orchestrator._runtime.disk import disk_threads  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.session import AgentSession  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store.session import Session  # noqa: E402
from orchestrator.testing import summary_text  # noqa: E402
from tests.bench.bench_core import write_session  # noqa: E402
from tests.bench.timeline import Timeline, instrumented, report  # noqa: E402

SIZES = [1_000, 10_000, 100_000]
RUNS = 5
LATENCY = 0.2
BIG = "word " * 40_000  # 200 000 characters: about 50 000 estimated tokens, over keep_recent


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of ``spans`` was in progress (their union's length)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class FakeModel:
    """A model route that sleeps ``latency`` seconds (a little more: see above) and answers."""

    def __init__(self, latency: float, timeline: Timeline | None = None) -> None:
        self.latency = latency
        self.timeline = timeline
        self.calls: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.spans: list[tuple[float, float]] = []  # (start, end) of each call, perf_counter

    @property
    def name(self) -> str:
        return "fake/fixed-latency"

    @property
    def context_window(self) -> int:
        return 200_000

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request.purpose)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.timeline is not None:
            self.timeline.mark("model called")
        start = time.perf_counter()
        try:
            await anyio.sleep(self.latency)
        finally:
            self.in_flight -= 1
            self.spans.append((start, time.perf_counter()))
            if self.timeline is not None:
                self.timeline.mark("model answers")
        return ModelResponse(
            # A summary the gate (D32), on by default, passes for this request.
            text=summary_text(f"Benchmark summary ({request.purpose}).", purpose=request.purpose),
            stop_reason="stop",
            usage=Usage(input=1000, output=20),
            model="fixed-latency",
            provider="fake",
        )


def _line(entry: dict[str, Any]) -> str:
    return json.dumps(entry, separators=(",", ":")) + "\n"


def _tail(kind: str, parent: str) -> list[dict[str, Any]]:
    """The last turn: the one that decides whether the cut splits a turn."""
    ts = "2025-12-02T11:00:00.000Z"
    usage = {"input": 60_000, "output": 50, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 60_050}
    if kind == "plain":
        messages: list[dict[str, Any]] = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "read this: " + BIG}],
                "timestamp": 1,
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "done"}],
                "provider": "p",
                "model": "m",
                "stopReason": "stop",
                "timestamp": 2,
                "usage": usage,
            },
        ]
    else:
        messages = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "write the report"}],
                "timestamp": 1,
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": BIG},
                    {
                        "type": "toolCall",
                        "id": "tail",
                        "name": "write",
                        "arguments": {"path": "report.md"},
                    },
                ],
                "provider": "p",
                "model": "m",
                "stopReason": "toolUse",
                "timestamp": 2,
                "usage": usage,
            },
            {
                "role": "toolResult",
                "toolCallId": "tail",
                "toolName": "write",
                "content": [{"type": "text", "text": "ok"}],
                "isError": False,
                "timestamp": 3,
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "written"}],
                "provider": "p",
                "model": "m",
                "stopReason": "stop",
                "timestamp": 4,
                "usage": usage,
            },
        ]
    entries = []
    for i, message in enumerate(messages):
        eid = f"tail{i:04d}"
        entries.append(
            {"type": "message", "id": eid, "parentId": parent, "timestamp": ts, "message": message}
        )
        parent = eid
    return entries


def session_bytes(n: int, kind: str) -> bytes:
    """A session of ``n`` history entries plus a plain or split last turn."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        write_session(path, n)
        with path.open("a", encoding="utf-8") as out:
            for entry in _tail(kind, f"{n - 1:08x}"):
                out.write(_line(entry))
        return path.read_bytes()


def _check_plan(plan: object, kind: str) -> CompactionPlan:
    assert isinstance(plan, CompactionPlan), plan
    assert plan.is_split_turn == (kind == "split"), (kind, plan.is_split_turn)
    return plan


async def one_run(
    data: bytes, kind: str, latency: float, timeline: Timeline | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        path.write_bytes(data)
        # Durable before timing: otherwise the commit's fsync flushes the whole new file too.
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # The file store, fsync per turn (the commit is fsynced), opened as its owner as a live
        # session is (AgentSession.open): the writer lock is taken here, not by the commit.
        session = Session.open(path, owner="bench_compaction")
        try:
            return await _timed(session, kind, latency, timeline)
        finally:
            session.close()


async def _timed(
    session: Session, kind: str, latency: float, timeline: Timeline | None
) -> dict[str, Any]:
    settings = CompactionSettings()
    # A live session has its context built already (the agent loop asked for it every turn),
    # its file open for appending and the event loop's disk thread started (its last turn's
    # commit used both): none of that is the compaction's cost.
    session.context()
    session.open_writer()
    await anyio.to_thread.run_sync(lambda: None, limiter=disk_threads())
    t0 = time.perf_counter()
    # The same planning the compaction does: over the path, reusing the live context.
    _check_plan(plan_compaction(session.path(), settings, context=session.context()), kind)
    t_plan = time.perf_counter() - t0
    fake = FakeModel(latency, timeline)
    summarizer = SummaryRoutes(candidates=(fake,))
    runtime = AgentSession(
        session, summarizer=summarizer, settings=RuntimeSettings(compaction=settings)
    )
    if timeline is not None:
        timeline.start()
    t0, c0 = time.perf_counter(), time.process_time()
    outcome = await runtime.compact()
    total = time.perf_counter() - t0
    if timeline is not None:
        timeline.stop()
    cpu = time.process_time() - c0  # every thread of the process: steadier than wall under load
    assert outcome.entry is not None, outcome.reason
    _check_plan(outcome.plan, kind)
    assert session.leaf_id == outcome.entry["id"]
    return {
        "total": total,
        "model": covered(fake.spans),
        "cpu": cpu,
        "plan": t_plan,
        "calls": len(fake.calls),
        "max_in_flight": fake.max_in_flight,
        "purposes": sorted(fake.calls),
    }


def fsync_cost(runs: int = 21, idle: float = 0.0) -> float:
    """Median seconds of appending one line to a file and fsyncing it, in the temp folder.

    ``idle``: seconds to sleep before each append. A commit fsyncs just after its model's
    answer, so after an idle wait: on a virtual machine that halts idle processors through its
    hypervisor, that fsync costs several times one that follows another at once.
    """
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.jsonl"
        path.write_bytes(b"{}\n" * 1000)
        with path.open("ab") as out:
            os.fsync(out.fileno())
            for _ in range(runs):
                if idle:
                    time.sleep(idle)
                out.write(b'{"type":"probe"}\n')
                out.flush()
                t0 = time.perf_counter()
                os.fsync(out.fileno())
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timelines(sizes: list[int], runs: int, latency: float) -> None:
    """``--timeline``: where each compaction's time goes, piece by piece (see timeline.py)."""
    for n in sizes:
        for kind in ("plain", "split"):
            data = session_bytes(n, kind)
            taken = []
            for _ in range(runs):
                timeline = Timeline()
                with instrumented(timeline):
                    anyio.run(one_run, data, kind, latency, timeline)
                taken.append(timeline)
            report(taken, latency, f"n={n} {kind}")


def measure(n: int, kind: str, runs: int, latency: float) -> dict[str, Any]:
    """``runs`` compactions of an ``n``-entry ``kind`` session (each printed): their medians."""
    data = session_bytes(n, kind)
    results = [anyio.run(one_run, data, kind, latency) for _ in range(runs)]
    for r in results:
        print(
            f"  run n={n} {kind}: total {r['total'] * 1e3:.1f} ms, calls {r['purposes']}",
            flush=True,
        )
    return {
        "n": n,
        "kind": kind,
        "total": statistics.median(r["total"] for r in results),
        "overhead": statistics.median(r["total"] - r["model"] for r in results),
        "cpu": statistics.median(r["cpu"] for r in results),
        "plan": statistics.median(r["plan"] for r in results),
        "calls": results[0]["calls"],
        "max_in_flight": results[0]["max_in_flight"],
    }


def options(argv: list[str]) -> tuple[int, float, bool, list[int]]:
    """``--runs N``, ``--latency S``, ``--timeline`` and the sizes."""
    runs, latency, timeline = RUNS, LATENCY, False
    while argv[:1] and argv[0].startswith("--"):
        if argv[0] == "--timeline":
            timeline, argv = True, argv[1:]
            continue
        if argv[0] == "--runs":
            runs = int(argv[1])
        elif argv[0] == "--latency":
            latency = float(argv[1])
        else:
            raise SystemExit(f"unknown option {argv[0]}")
        argv = argv[2:]
    return runs, latency, timeline, [int(a) for a in argv] or SIZES


def main(argv: list[str]) -> None:
    runs, latency, timeline, sizes = options(argv)
    if timeline:
        timelines(sizes, runs, latency)
        return
    print(
        f"Python {sys.version.split()[0]}, fake model latency L = {latency * 1e3:.0f} ms, "
        f"median of {runs} runs, load {os.getloadavg()[0]:.1f}; one fsync of an appended line "
        f"{fsync_cost() * 1e3:.2f} ms back to back, "
        f"{fsync_cost(runs=9, idle=latency) * 1e3:.2f} ms after an idle wait of L"
    )
    rows = [measure(n, kind, runs, latency) for n in sizes for kind in ("plain", "split")]
    print()
    print(
        f"{'entries':>9} {'kind':>6} {'calls':>5} {'parallel':>8} {'total ms':>9} "
        f"{'total-L ms':>10} {'no model ms':>11} {'cpu ms':>7} {'plan ms':>8}"
    )
    for r in rows:
        print(
            f"{r['n']:>9} {r['kind']:>6} {r['calls']:>5} {r['max_in_flight']:>8} "
            f"{r['total'] * 1e3:>9.1f} {(r['total'] - latency) * 1e3:>10.1f} "
            f"{r['overhead'] * 1e3:>11.1f} {r['cpu'] * 1e3:>7.1f} {r['plan'] * 1e3:>8.1f}"
        )
    print()
    for n in sizes if latency > 0 else ():
        plain, split = (
            next(r for r in rows if r["n"] == n and r["kind"] == k) for k in ("plain", "split")
        )
        print(
            f"n={n}: split - plain = {(split['total'] - plain['total']) * 1e3:+.1f} ms "
            f"(sequential summaries would add L = {latency * 1e3:.0f} ms); "
            f"split total = {split['total'] / latency:.2f} L"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
