"""Core benchmark: load, context and planning on linear sessions of 1k to 1M entries.

Run on demand (not part of the test run)::

    python tests/bench/bench_core.py                    # 1k, 10k, 100k, 1M, 3 runs each
    python tests/bench/bench_core.py 1000 10000         # chosen sizes
    python tests/bench/bench_core.py --runs 5 100000    # more runs

Each run of each size is its own subprocess, so peak memory (max RSS) is per size and one run
cannot warm the next. The session is a realistic mix: user prompts, assistant messages with tool
calls, tool results of varying size (200 B to ~6 KB, Pareto-distributed), usage on every assistant
message. Per size it prints the median over the runs of:

* load: ``Session.from_store`` on a JSONL file (read, parse, index);
* context: the context of the last leaf (walk the path, build every message);
* plan: compaction planning over the whole path;
* append+context: one more entry appended (written to the file) and the context asked for again,
  repeated ``APPENDS`` times; median and worst single operation. This is the "does not re-walk
  the path" check: it must stay flat in N while the full context build grows with N;
* load+gc: the load plus one full garbage collection right after it (the collection loading's
  objects cost sooner or later, counted in);
* one full garbage collection, timed after the rest (loading pauses the collector, see
  ``orchestrator._core.loading.gc_paused``; the passes it skipped are at most a few of these);
* peak RSS of the process.

Linear cost means the per-entry times (µs/entry) stay flat as N grows; the last lines print the
per-entry ratio of the largest size against 10k (issue 9's goal: at most 1.3x at 1M, for the
load plus its full collection).
"""

from __future__ import annotations

import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [1_000, 10_000, 100_000, 1_000_000]
RUNS = 3
APPENDS = 200
ROOT = Path(__file__).resolve().parents[2]


def write_session(path: Path, n: int) -> None:
    """Write a linear pi session of ``n`` entries: user, assistant+call, result, assistant+call."""
    rng = random.Random(n)
    start = 1_764_669_600_000
    with path.open("w", encoding="utf-8") as out:
        header = {
            "type": "session",
            "version": 3,
            "id": "bench",
            "timestamp": "2025-12-02T10:00:00.000Z",
            "cwd": "/bench",
        }
        out.write(json.dumps(header) + "\n")
        parent = None
        call = 0
        for i in range(n):
            phase = i % 4
            eid = f"{i:08x}"
            message: dict[str, object]
            if phase == 0:
                message = {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "please fix " + "x" * rng.randint(20, 400)}
                    ],
                    "timestamp": start + i,
                }
            elif phase in (1, 3):
                call += 1
                message = {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "working " + "y" * rng.randint(10, 300)},
                        {
                            "type": "toolCall",
                            "id": f"c{call}",
                            "name": rng.choice(["read", "edit", "bash", "write"]),
                            "arguments": {"path": f"src/m{rng.randint(0, 500)}.py"},
                        },
                    ],
                    "provider": "p",
                    "model": "m",
                    "stopReason": "toolUse",
                    "timestamp": start + i,
                    "usage": {
                        "input": 1000 + i,
                        "output": 50,
                        "cacheRead": 0,
                        "cacheWrite": 0,
                        "totalTokens": 1050 + i,
                    },
                }
            else:
                size = int(rng.paretovariate(1.2) * 200) % 6000
                message = {
                    "role": "toolResult",
                    "toolCallId": f"c{call}",
                    "toolName": "read",
                    "content": [{"type": "text", "text": "z" * size}],
                    "isError": False,
                    "timestamp": start + i,
                }
            entry = {
                "type": "message",
                "id": eid,
                "parentId": parent,
                "timestamp": "2025-12-02T10:00:00.000Z",
                "message": message,
            }
            out.write(json.dumps(entry, separators=(",", ":")) + "\n")
            parent = eid


def measure(n: int) -> dict[str, float]:
    """One run at one size, in this process."""
    sys.path.insert(0, str(ROOT))
    from orchestrator._core.compaction_plan import plan_compaction
    from orchestrator._core.tokens import CompactionSettings
    from orchestrator._store.jsonl import JsonlStore
    from orchestrator._store.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        write_session(path, n)
        file_mb = path.stat().st_size / 1e6

        t0 = time.perf_counter()
        session = Session.from_store(JsonlStore(path, fsync="never"))
        t_load = time.perf_counter() - t0
        # Garbage collection counted in: the full pass that loading's objects cost sooner or
        # later (the collector is paused while parsing), run now and added to the load.
        t0 = time.perf_counter()
        gc.collect()
        t_load_gc = t_load + time.perf_counter() - t0

        t0 = time.perf_counter()
        context = session.context()
        t_context = time.perf_counter() - t0
        assert len(context.messages) == n

        t0 = time.perf_counter()
        plan_compaction(session.path(), CompactionSettings())
        t_plan = time.perf_counter() - t0

        # The first append opens the writer (lock, reuse of the parsed file); then steady state.
        t0 = time.perf_counter()
        session.append_message({"role": "user", "content": "one more", "timestamp": 0})
        context = session.context()
        t_first = time.perf_counter() - t0
        steps = []
        for k in range(APPENDS):
            role = "user" if k % 2 else "assistant"
            t0 = time.perf_counter()
            session.append_message(
                {"role": role, "content": [{"type": "text", "text": f"more {k}"}], "timestamp": k}
            )
            context = session.context()
            steps.append(time.perf_counter() - t0)
        assert len(context.messages) == n + 1 + APPENDS
        assert context.entry_ids[-1] == session.leaf_id
        # Loading pauses the cyclic collector (it made loading superlinear); what it defers is
        # at most a few passes over the loaded objects. This is what one full pass costs.
        t0 = time.perf_counter()
        gc.collect()
        t_gc = time.perf_counter() - t0
        session.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "n": n,
        "file_mb": file_mb,
        "load_s": t_load,
        "load_gc_s": t_load_gc,
        "context_s": t_context,
        "plan_s": t_plan,
        "first_append_s": t_first,
        "append_median_s": statistics.median(steps),
        "append_max_s": max(steps),
        "full_gc_s": t_gc,
        "peak_rss_mb": peak_mb,
    }


def run_once(n: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--one", str(n)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    row: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def median_row(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(measure(int(argv[1]))))
        return
    runs = RUNS
    if argv[:1] == ["--runs"]:
        runs, argv = int(argv[1]), argv[2:]
    sizes = [int(a) for a in argv] or SIZES
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {runs} runs per size")
    rows = []
    for n in sizes:
        results = []
        for _ in range(runs):
            results.append(run_once(n))
            r = results[-1]
            print(
                f"  run n={n}: load {r['load_s']:.3f}s context {r['context_s']:.3f}s "
                f"plan {r['plan_s']:.3f}s append+ctx {r['append_median_s'] * 1e6:.0f}µs",
                flush=True,
            )
        rows.append(median_row(results))
    print()
    print(
        f"{'entries':>9} {'file MB':>8} {'load e/s':>9} {'ctx e/s':>9} {'plan e/s':>9} "
        f"{'load µs/e':>9} {'ctx µs/e':>8} {'plan µs/e':>9} {'1st app ms':>10} "
        f"{'app+ctx µs':>10} {'worst µs':>8} {'full gc ms':>10} {'peak MB':>8}"
    )
    for r in rows:
        size = r["n"]
        print(
            f"{size:>9.0f} {r['file_mb']:>8.1f} {size / r['load_s']:>9.0f} "
            f"{size / r['context_s']:>9.0f} {size / r['plan_s']:>9.0f} "
            f"{r['load_s'] / size * 1e6:>9.2f} {r['context_s'] / size * 1e6:>8.2f} "
            f"{r['plan_s'] / size * 1e6:>9.2f} {r['first_append_s'] * 1e3:>10.2f} "
            f"{r['append_median_s'] * 1e6:>10.1f} {r['append_max_s'] * 1e6:>8.0f} "
            f"{r['full_gc_s'] * 1e3:>10.0f} {r['peak_rss_mb']:>8.0f}"
        )
    if len(rows) > 1:
        base = next((r for r in rows if r["n"] == 10_000), rows[0])
        last = rows[-1]
        print()
        for key in ("load_s", "load_gc_s", "context_s", "plan_s"):
            ratio = (last[key] / last["n"]) / (base[key] / base["n"])
            print(f"per-entry {key[:-2]:<7} at {last['n']:.0f} vs {base['n']:.0f}: {ratio:.2f}x")
        for r in rows:
            print(f"load+gc at {r['n']:.0f}: {r['load_gc_s'] / r['n'] * 1e6:.2f} µs/entry")
        ratio = last["append_median_s"] / base["append_median_s"]
        print(
            f"append+context   at {last['n']:.0f} vs {base['n']:.0f}: {ratio:.2f}x "
            "(flat = no re-walk)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
