"""Issue 37's goals in one command: every goal measured in N rounds, met or not, in one table.

Run on demand (not part of the test run; the vs-pi and big goals need ``npm ci`` in
tests/conformance, as ``bench_vs_pi.py`` does)::

    python tests/bench/bench_goals.py                       # every goal, 2 rounds, issue 37's sizes
    python tests/bench/bench_goals.py --rounds 1 --only vs-pi --sizes 10000
    python tests/bench/bench_goals.py --only compaction,concurrent --sessions 200 --json

Each round runs the chosen groups in turn, each through its own script's functions (nothing is
measured here): ``vs-pi`` (``bench_vs_pi.measure``: plan, context and peak RSS against pi 1.6.0 at
``--sizes``), ``big`` (``bench_vs_pi.big_runs``: check and plan at ``--big`` entries),
``compaction`` (``bench_compaction.measure``: one compaction, plain and split, at
``--compaction-size``) and ``concurrent`` (``bench_concurrent.measure``: ``--sessions`` sessions
compacting at once through the runtime and through the server, over HTTP, L = 1 s). Each group
runs in a fresh process of its own, as its script would, so that one group's heap, collector
state and peak RSS do not colour the next. The scripts' own progress goes to standard error;
standard output gets the table (or, with ``--json``, the same as JSON): a header with the commit,
the processor, the date, the versions and the load average before and after, then one line per
goal with each round's measure and CPU time, whether each met the goal, and a summary.
``goals.py`` holds the goals and the judging; tests/test_bench_goals.py tests it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.goals import (  # noqa: E402
    GROUPS,
    Measured,
    Round,
    Settings,
    as_json,
    from_big,
    from_compaction,
    from_concurrent,
    from_vs_pi,
    gather_header,
    goals,
    real_probes,
    render,
    verdicts,
)

# -- one group, in a child process -----------------------------------------------------------------


@contextlib.contextmanager
def _progress_to_stderr() -> Iterator[None]:
    # The scripts print their progress and rows; standard output is the report's.
    with contextlib.redirect_stdout(sys.stderr):
        yield


def vs_pi(settings: Settings) -> dict[str, Measured]:
    """The vs-pi goals: ``bench_vs_pi.measure`` at each size, after its warm-up."""
    from tests.bench import bench_vs_pi

    runs = settings.runs or bench_vs_pi.RUNS
    measured: dict[str, Measured] = {}
    with _progress_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        bench_vs_pi.warm_up(tmp, None)
        for n in settings.sizes:
            measured |= from_vs_pi(bench_vs_pi.measure(n, runs, None, None))
            print(f"  vs-pi: {n} entries done", flush=True)
    return measured


def big(settings: Settings) -> dict[str, Measured]:
    """The 200k goals: ``bench_vs_pi.big_runs`` (as its script does, after the warm-up)."""
    from tests.bench import bench_vs_pi

    runs = settings.runs or max(3, bench_vs_pi.RUNS // 2)
    with _progress_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        bench_vs_pi.warm_up(tmp, None)
        results, _ = bench_vs_pi.big_runs(settings.big, runs, None)
    return from_big(settings.big, results)


def compaction(settings: Settings) -> dict[str, Measured]:
    """One compaction, plain and split: ``bench_compaction.measure``."""
    from tests.bench import bench_compaction

    runs = settings.runs or bench_compaction.RUNS
    measured: dict[str, Measured] = {}
    with _progress_to_stderr():
        for kind in ("plain", "split"):
            row = bench_compaction.measure(settings.compaction, kind, runs, settings.latency)
            measured |= from_compaction(row, settings.latency)
    return measured


def concurrent(settings: Settings) -> dict[str, Measured]:
    """The thousand through the runtime and through the server: ``bench_concurrent.measure``."""
    from tests.bench import bench_concurrent

    argv = ["--sessions", str(settings.sessions), "--entries", str(settings.entries)]
    args = bench_concurrent.options().parse_args(
        [*argv, "--latency", str(settings.concurrent_latency)]
    )
    with _progress_to_stderr():
        rows = bench_concurrent.measure(args)
    return from_concurrent(settings.sessions, rows)


RUNNERS: dict[str, Callable[[Settings], dict[str, Measured]]] = {
    "vs-pi": vs_pi,
    "big": big,
    "compaction": compaction,
    "concurrent": concurrent,
}


def in_child(group: str, settings: Settings) -> dict[str, Measured]:
    """Run one group's measures in a fresh (spawned) process and return them."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(RUNNERS[group], settings).result()


# -- the command -----------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _ints(text: str) -> tuple[int, ...]:
    return tuple(_positive(part) for part in text.split(","))


def _groups(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in chosen if name not in GROUPS]
    if unknown or not chosen:
        named = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown goal group {named}: choose from {GROUPS}")
    return tuple(name for name in GROUPS if name in chosen)


def options() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--rounds", type=_positive, default=2, help="rounds of every chosen goal (2)")
    add("--only", type=_groups, default=GROUPS, help=f"goal groups, of {','.join(GROUPS)}")
    add("--sizes", type=_ints, default=defaults.sizes, help="vs-pi sizes (10000,40000,60000)")
    add("--big", type=_positive, default=defaults.big, help="entries for check/plan (200000)")
    add("--compaction-size", type=_positive, default=defaults.compaction, help="entries (10000)")
    add("--sessions", type=_positive, default=defaults.sessions, help="concurrent sessions (1000)")
    add("--entries", type=_positive, default=defaults.entries, help="entries per session (300)")
    add("--runs", type=_positive, help="runs per round where a script takes medians")
    add("--json", action="store_true", help="print the report as JSON")
    return parser


def settings_of(args: argparse.Namespace) -> Settings:
    return replace(
        Settings(),
        sizes=args.sizes,
        big=args.big,
        compaction=args.compaction_size,
        sessions=args.sessions,
        entries=args.entries,
        runs=args.runs,
    )


def run_rounds(
    settings: Settings,
    only: Sequence[str],
    rounds: int,
    measure: Callable[[str, Settings], dict[str, Measured]] | None = None,
) -> tuple[list[Round], list[str]]:
    """Every chosen group, ``rounds`` times: each round's measures, and what failed where.

    ``measure(group, settings)`` defaults to :func:`in_child`.
    """
    measure = measure or in_child
    measured: list[Round] = []
    errors: list[str] = []
    for number in range(1, rounds + 1):
        this: dict[str, Measured] = {}
        for group in only:
            print(f"round {number}: {group}", file=sys.stderr, flush=True)
            try:
                this |= measure(group, settings)
            except (Exception, SystemExit) as error:  # noqa: BLE001 - reported, the rest goes on
                errors.append(f"round {number}, {group}: {type(error).__name__}: {error}")
        measured.append(this)
    return measured, errors


def main(argv: list[str]) -> None:
    from tests.bench.bench_vs_pi import versions

    args = options().parse_args(argv)
    settings = settings_of(args)
    probes = real_probes(ROOT, versions)
    header = gather_header(probes, args.rounds, settings, args.only)
    measured, errors = run_rounds(settings, args.only, args.rounds)
    header = replace(header, load_after=probes.load())
    table = goals(settings, args.only)
    judged = verdicts(table, measured)
    if args.json:
        data: dict[str, Any] = as_json(header, table, judged, errors)
        print(json.dumps(data, indent=2))
    else:
        print(render(header, table, judged, errors))


if __name__ == "__main__":
    main(sys.argv[1:])
