"""Core benchmark: load, context and planning on linear sessions of 1k to 1M entries.

Run on demand (not part of the test run)::

    python tests/bench/bench_core.py            # 1k, 10k, 100k, 1M
    python tests/bench/bench_core.py 1000 10000 # chosen sizes

Each size runs in its own subprocess so that peak memory (max RSS) is per size. The session is a
realistic mix: user prompts, assistant messages with tool calls, tool results of varying size
(a few bytes to ~6 KB), usage on every assistant message. It prints, per size: entries per second
for load, context of the last leaf, and compaction planning; the cost of getting the context after
appending one more entry; and peak RSS. Linear cost means the per-entry times stay flat as N grows.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [1_000, 10_000, 100_000, 1_000_000]


def _write_session(path: Path, n: int) -> None:
    rng = random.Random(n)
    start = 1_764_669_600_000
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "session", "version": 3, "id": "bench", "timestamp":
                              "2025-12-02T10:00:00.000Z", "cwd": "/bench"}) + "\n")
        parent = None
        call = 0
        i = 0
        while i < n:
            phase = i % 4
            eid = f"{i:08x}"
            ts = f"2025-12-02T10:00:00.000Z"
            if phase == 0:
                message = {"role": "user", "content": [{"type": "text", "text": "please fix " + "x" * rng.randint(20, 400)}],
                           "timestamp": start + i}
            elif phase in (1, 3):
                call += 1
                message = {"role": "assistant", "content": [
                    {"type": "text", "text": "working " + "y" * rng.randint(10, 300)},
                    {"type": "toolCall", "id": f"c{call}", "name": rng.choice(["read", "edit", "bash", "write"]),
                     "arguments": {"path": f"src/m{rng.randint(0, 500)}.py"}}],
                    "provider": "p", "model": "m", "stopReason": "toolUse", "timestamp": start + i,
                    "usage": {"input": 1000 + i, "output": 50, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 1050 + i}}
            else:
                message = {"role": "toolResult", "toolCallId": f"c{call}", "toolName": "read",
                           "content": [{"type": "text", "text": "z" * int(rng.paretovariate(1.2) * 200) % 6000}],
                           "isError": False, "timestamp": start + i}
            out.write(json.dumps({"type": "message", "id": eid, "parentId": parent, "timestamp": ts,
                                  "message": message}, separators=(",", ":")) + "\n")
            parent = eid
            i += 1


def _measure(n: int) -> dict[str, float]:
    from orchestrator._compaction_plan import plan_compaction
    from orchestrator._jsonl_store import JsonlStore
    from orchestrator._session import Session
    from orchestrator._tokens import CompactionSettings

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        _write_session(path, n)
        size_mb = path.stat().st_size / 1e6
        t0 = time.perf_counter()
        session = Session.from_store(JsonlStore(path, fsync="never"))
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        context = session.context()
        t_context = time.perf_counter() - t0
        assert len(context.messages) == n
        t0 = time.perf_counter()
        plan_compaction(session.path(), CompactionSettings())
        t_plan = time.perf_counter() - t0
        # One more entry, then the context again: this must not re-walk the path.
        t0 = time.perf_counter()
        session.append_message({"role": "user", "content": "one more", "timestamp": 0})
        context = session.context()
        t_append = time.perf_counter() - t0
        assert len(context.messages) == n + 1
        session.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"n": n, "file_mb": size_mb, "load_s": t_load, "context_s": t_context, "plan_s": t_plan,
            "append_context_s": t_append, "peak_rss_mb": peak_mb}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(_measure(int(argv[1]))))
        return
    sizes = [int(a) for a in argv] or SIZES
    rows = []
    for n in sizes:
        proc = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'entries':>9} {'file MB':>8} {'load e/s':>10} {'ctx e/s':>10} {'plan e/s':>10} "
          f"{'load µs/e':>9} {'ctx µs/e':>9} {'plan µs/e':>9} {'append+ctx ms':>13} {'peak MB':>8}")
    for r in rows:
        n = r["n"]
        print(f"{n:>9} {r['file_mb']:>8.1f} {n / r['load_s']:>10.0f} {n / r['context_s']:>10.0f} "
              f"{n / r['plan_s']:>10.0f} {r['load_s'] / n * 1e6:>9.2f} {r['context_s'] / n * 1e6:>9.2f} "
              f"{r['plan_s'] / n * 1e6:>9.2f} {r['append_context_s'] * 1e3:>13.3f} {r['peak_rss_mb']:>8.0f}")
    if len(rows) > 1:
        base = next((r for r in rows if r["n"] == 10_000), rows[0])
        last = rows[-1]
        for key in ("load_s", "context_s", "plan_s"):
            ratio = (last[key] / last["n"]) / (base[key] / base["n"])
            print(f"per-entry {key[:-2]} at {last['n']} vs {base['n']}: {ratio:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
