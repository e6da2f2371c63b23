"""Side by side with pi: load a session, build its context, plan a compaction.

Run on demand (not part of the test run; needs node and ``npm ci`` in tests/conformance)::

    python tests/bench/bench_vs_pi.py                      # 2k, 10k, 40k, 60k; 5 runs each
    python tests/bench/bench_vs_pi.py --runs 3 40000       # chosen sizes and runs

The sessions are bench_core.py's (a realistic linear mix, usage on every assistant message). pi's
side is ``pi_side.mjs``: pi 0.73.1's own SessionManager.open, buildSessionContext and
prepareCompaction. Ours: ``Session.open``, ``Session.context()`` and ``plan_compaction`` with the
live context (what ``compact`` does). Per size, from one run of this script, medians of:

* whole process: the wall time of a fresh ``python`` / ``node`` process doing the three steps,
  start-up and imports included, one process per run, the two alternating;
* in process: the three steps again and again in one process (pi's JIT warm, our imports done),
  the first run dropped;
* memory: peak RSS of the whole-process run minus that of the same run on a 10-entry session,
  per entry.

Ratios are ours / pi's: below 1 means faster (or smaller) than pi.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_core import write_session  # noqa: E402

SIZES = [2_000, 10_000, 40_000, 60_000]
RUNS = 5
PI_SIDE = Path(__file__).with_name("pi_side.mjs")

OURS = """
import json, sys, time
t0 = time.perf_counter()
from orchestrator import CompactionSettings, Session, plan_compaction
def once(path):
    t0 = time.perf_counter()
    session = Session.open(path)
    t1 = time.perf_counter()
    context = session.context()
    t2 = time.perf_counter()
    plan = plan_compaction(session.path(), CompactionSettings(), context=context)
    t3 = time.perf_counter()
    assert len(context.messages) and plan is not None
    session.close()
    return {"load": t1 - t0, "context": t2 - t1, "plan": t3 - t2, "total": t3 - t0}
runs = int(sys.argv[2])
print(json.dumps(once(sys.argv[1]) if runs == 1 else [once(sys.argv[1]) for _ in range(runs)]))
"""


_ENV = dict(os.environ)
"""Our side's environment: compiled bytecode, as an installed package has it (see ``main``)."""


def _child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run a process: (wall seconds, peak RSS in MB, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[0]} failed: {err}")
    return wall, usage.ru_maxrss / 1024, out


def ours(path: Path, runs: int = 1) -> tuple[float, float, str]:
    return _child([sys.executable, "-c", OURS, str(path), str(runs)], _ENV)


def pi(path: Path, runs: int = 1) -> tuple[float, float, str]:
    extra = ["--runs", str(runs)] if runs > 1 else []
    return _child(["node", str(PI_SIDE), str(path), *extra])


def _median_total(out: str) -> float:
    results = json.loads(out)[1:]  # the first run warms up
    return float(statistics.median(float(r["total"]) for r in results))


def measure(n: int, runs: int, tiny: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        write_session(path, n)
        base_ours, base_pi = ours(tiny)[1], pi(tiny)[1]
        whole_ours, whole_pi, rss_ours, rss_pi = [], [], [], []
        for _ in range(runs):
            wall, rss, _ = ours(path)
            whole_ours.append(wall)
            rss_ours.append(rss)
            wall, rss, _ = pi(path)
            whole_pi.append(wall)
            rss_pi.append(rss)
        inproc_ours = _median_total(ours(path, runs + 1)[2])
        inproc_pi = _median_total(pi(path, runs + 1)[2])
    return {
        "n": n,
        "whole_ours": statistics.median(whole_ours),
        "whole_pi": statistics.median(whole_pi),
        "inproc_ours": inproc_ours,
        "inproc_pi": inproc_pi,
        "kb_ours": (statistics.median(rss_ours) - base_ours) * 1024 / n,
        "kb_pi": (statistics.median(rss_pi) - base_pi) * 1024 / n,
    }


def main(argv: list[str]) -> None:
    runs = RUNS
    if argv[:1] == ["--runs"]:
        runs, argv = int(argv[1]), argv[2:]
    sizes = [int(a) for a in argv] or SIZES
    version = json.loads((PI_SIDE.parents[1] / "conformance" / "package.json").read_text())
    node = subprocess.check_output(["node", "--version"], text=True).strip()
    print(
        f"Python {sys.version.split()[0]}, node {node}, "
        f"pi {version['dependencies']['@mariozechner/pi-coding-agent']}, {os.cpu_count()} CPUs, "
        f"median of {runs} runs"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny.jsonl"
        write_session(tiny, 10)
        # Our side runs with compiled bytecode, written by a warm-up run into a cache of its own
        # even where the environment sets PYTHONDONTWRITEBYTECODE. Compiling at every start
        # would cost time, and its memory, freed before the session loads, would hide part of
        # the session's in the peak RSS (the memory column read 0.5 KB/entry low at 2k).
        _ENV["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "bytecode")
        _ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ours(tiny)
        for n in sizes:
            rows.append(measure(n, runs, tiny))
            r = rows[-1]
            print(
                f"  n={n}: whole {r['whole_ours']:.3f}s vs pi {r['whole_pi']:.3f}s, "
                f"in process {r['inproc_ours']:.3f}s vs pi {r['inproc_pi']:.3f}s",
                flush=True,
            )
    print()
    print(
        f"{'entries':>8} {'whole ours':>10} {'whole pi':>9} {'ratio':>6} {'in-proc ours':>12} "
        f"{'in-proc pi':>10} {'ratio':>6} {'KB/entry ours':>13} {'KB/entry pi':>11} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['n']:>8.0f} {r['whole_ours']:>9.3f}s {r['whole_pi']:>8.3f}s "
            f"{r['whole_ours'] / r['whole_pi']:>6.2f} {r['inproc_ours']:>11.3f}s "
            f"{r['inproc_pi']:>9.3f}s {r['inproc_ours'] / r['inproc_pi']:>6.2f} "
            f"{r['kb_ours']:>13.2f} {r['kb_pi']:>11.2f} {r['kb_ours'] / r['kb_pi']:>6.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
