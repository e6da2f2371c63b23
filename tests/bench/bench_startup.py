"""Process time of a short command: ``orchestrator context EXAMPLE --json`` against bare Python.

Run on demand (not part of the test run)::

    python tests/bench/bench_startup.py            # 15 runs each, alternating
    python tests/bench/bench_startup.py --runs 30

Prints the median wall time of ``python -c pass`` (the interpreter alone), of the command, and
the difference: what the command costs beyond starting Python (issue 9 asks for at most 0.15 s).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "data" / "example-session.jsonl"
RUNS = 15


def _wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv: list[str]) -> None:
    runs = int(argv[1]) if argv[:1] == ["--runs"] else RUNS
    bare_argv = [sys.executable, "-c", "pass"]
    command = [sys.executable, "-m", "orchestrator", "context", str(EXAMPLE), "--json"]
    _wall(command)  # warm the file cache and the bytecode cache
    bare, full = [], []
    for _ in range(runs):
        bare.append(_wall(bare_argv))
        full.append(_wall(command))
    b, f = statistics.median(bare), statistics.median(full)
    print(f"Python {sys.version.split()[0]}, median of {runs} runs")
    print(
        f"bare python: {b * 1e3:.0f} ms; context --json: {f * 1e3:.0f} ms; "
        f"over bare: {(f - b) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
