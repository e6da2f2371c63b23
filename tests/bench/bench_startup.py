"""Process time of a short command: ``orchestrator context EXAMPLE --json`` against bare Python.

Run on demand (not part of the test run)::

    python tests/bench/bench_startup.py            # 15 runs each, alternating
    python tests/bench/bench_startup.py --runs 30

Prints the median wall time and CPU time (user + system, which a busy machine disturbs less) of
``python -c pass`` (the interpreter alone), of the command, and the difference: what the command
costs beyond starting Python (issue 9 asks for at most 0.15 s).

Both run with compiled bytecode, as an installed package has it (pip compiles on install): the
bytecode goes to a temporary ``PYTHONPYCACHEPREFIX``, written by one warm-up run even where the
environment sets ``PYTHONDONTWRITEBYTECODE`` (which would otherwise make every run compile every
module of ours from source, about 30 ms).
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
EXAMPLE = ROOT / "tests" / "data" / "example-session.jsonl"
RUNS = 15


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv} failed")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> None:
    runs = int(argv[1]) if argv[:1] == ["--runs"] else RUNS
    bare_argv = [sys.executable, "-c", "pass"]
    command = [sys.executable, "-m", "orchestrator", "context", str(EXAMPLE), "--json"]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        _run(command, env)  # warm the file cache and write the bytecode cache
        _run(bare_argv, env)
        bare, full = [], []
        for _ in range(runs):
            bare.append(_run(bare_argv, env))
            full.append(_run(command, env))
    print(f"Python {sys.version.split()[0]}, median of {runs} runs, load {os.getloadavg()[0]:.1f}")
    for label, index in (("wall", 0), ("cpu", 1)):
        b = statistics.median(r[index] for r in bare)
        f = statistics.median(r[index] for r in full)
        print(
            f"{label}: bare python {b * 1e3:.0f} ms; context --json {f * 1e3:.0f} ms; "
            f"over bare {(f - b) * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
