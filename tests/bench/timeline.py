"""Where one compaction's time goes, piece by piece (``bench_compaction.py --timeline``).

Wraps, for the length of one ``with instrumented(timeline)`` block, the functions a compaction
goes through (planning, each summary request, the commit handed to the disk thread and back, the
append and its fsync there, the context taking the entry) so that each records when it started
and ended, in ``time.perf_counter`` seconds; the fake model records its calls itself. Benchmark
instrumentation only: it patches module attributes, so it reads the code as it is today, and a
renamed function fails loudly here (``AttributeError``) rather than measuring nothing.

Each mark is timed from the start of ``compact()``; marks after the model's answer are also
shown less ``L``, which is the overhead the goal counts. The request's minor page faults are
counted on the event loop's thread (``RUSAGE_THREAD``), where the request is built.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import orchestrator._runtime.operation.commit_effects as commit_effects
import orchestrator._runtime.operation.jobs as jobs
import orchestrator._runtime.outcomes as outcomes
from orchestrator._core.compaction_plan import plan_compaction
from orchestrator._runtime.disk import off_loop
from orchestrator._runtime.operation.summarize import request_for
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.session import Session


class Timeline:
    """Marks of one compaction: (name, seconds since :meth:`start`), in the order they came."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []
        self.faults: list[int] = []  # minor faults of each summary request's making
        self._t0 = 0.0
        self._seen: dict[str, int] = {}
        self._running = False

    def start(self) -> None:
        self.marks.clear()
        self.faults.clear()
        self._seen.clear()
        self._running = True
        self._t0 = time.perf_counter()

    @property
    def running(self) -> bool:
        return self._running

    def stop(self) -> None:
        """The compaction returned: what follows (the session's close) is not its time."""
        self.mark("compact() returns")
        self._running = False

    def mark(self, name: str) -> None:
        if not self._running:
            return
        # A piece that runs twice (a split turn's two requests) is told apart by its number.
        count = self._seen.get(name, 0) + 1
        self._seen[name] = count
        label = name if count == 1 else f"{name} #{count}"
        self.marks.append((label, time.perf_counter() - self._t0))


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _timed(
    timeline: Timeline, name: str, call: Callable[..., Any], *, count_faults: bool = False
) -> Callable[..., Any]:
    """``call``, marking ``name starts`` and ``name ends`` (and counting its page faults)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        before = _faults() if count_faults else 0
        timeline.mark(f"{name} starts")
        try:
            return call(*args, **kwargs)
        finally:
            timeline.mark(f"{name} ends")
            if count_faults and timeline.running:
                timeline.faults.append(_faults() - before)

    return timed


@contextlib.contextmanager
def instrumented(timeline: Timeline) -> Iterator[None]:
    """Patch the pieces of a compaction to mark ``timeline``; undone on exit."""
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attribute: str, replacement: Any) -> None:
        patches.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, replacement)

    async def marked_off_loop(session: Session, work: Callable[[], Any]) -> Any:
        timeline.mark("commit handed to the disk thread")
        result = await off_loop(session, _timed(timeline, "disk thread work", work))
        timeline.mark("commit back on the loop")
        return result

    patch(jobs, "plan_compaction", _timed(timeline, "planning", plan_compaction))
    patch(
        outcomes, "request_for", _timed(timeline, "summary request", request_for, count_faults=True)
    )
    patch(commit_effects, "off_loop", marked_off_loop)
    patch(JsonlStore, "append", _timed(timeline, "append", JsonlStore.append))
    patch(JsonlStore, "sync", _timed(timeline, "fsync", JsonlStore.sync))
    patch(Session, "adopt", _timed(timeline, "context takes the entry", Session.adopt))
    try:
        yield
    finally:
        for owner, attribute, original in reversed(patches):
            setattr(owner, attribute, original)


def report(runs: list[Timeline], latency: float, title: str) -> None:
    """Print the median time of each mark over ``runs``, and less ``L`` once the answer came."""
    print(f"\n{title}: median of {len(runs)} runs, ms from the start of compact()")
    # By name, not by position: a split turn's two answers may come in either order.
    taken = [dict(run.marks) for run in runs]
    answered = False
    for name in sorted(taken[0], key=lambda n: statistics.median(t[n] for t in taken if n in t)):
        at = statistics.median(t[name] for t in taken if name in t)
        answered = answered or name.startswith("model answers")
        shown = f"{at * 1e3:9.3f}"
        if answered:
            shown += f"   (− L: {(at - latency) * 1e3:6.3f})"
        print(f"  {name:36} {shown}")
    faults = [sum(run.faults) for run in runs]
    median = statistics.median(faults)
    print(f"  minor page faults making the summary requests: median {median:.0f}, runs {faults}")
