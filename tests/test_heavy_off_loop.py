"""Work that grows with the session runs off the event loop (issue 35, item 1).

A fork copies and writes the whole path, a navigation walks two paths and builds the new leaf's
context, and the offline summarizer reads the whole conversation: on a 200,000-entry session
each took one to nine seconds of a stopped event loop in the server (tests/bench/
bench_fairness.py). They go through ``Ports.heavy`` (the runtime's ``offload``, a worker thread
by default, the server's bounded fair scheduler in the server) from
``ports.HEAVY_ENTRIES`` entries; here the threshold is lowered so the example session is big.
The tests check what runs where and that the results are the ones the loop computed before,
never a time.
"""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._core.context import ContextBuilder
from orchestrator._core.summary_request import history_request
from orchestrator._models import offline
from orchestrator._models.offline_evidence import Call, read_conversation
from orchestrator._runtime import ports
from orchestrator._runtime.session import AgentSession
from orchestrator._store import jsonl_io
from orchestrator._store.fork import branched_session, fork_target
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.session import Session

pytestmark = pytest.mark.anyio

FORK_POINT = "ec48c90d"
"""A user message of the example whose path runs through a label entry (tests/test_fork.py)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def big(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every session counts as big: its heavy work goes through ``offload``."""
    monkeypatch.setattr(ports, "HEAVY_ENTRIES", 0)


class Offload:
    """An ``offload`` that records each piece of work and the thread it ran in.

    ``before``, when set, runs on the loop just before the thread starts: what the loop might
    do meanwhile (a turn appending).
    """

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.before: Callable[[], object] | None = None

    def __call__(self, work: Callable[[], Any]) -> Awaitable[Any]:
        if self.before is not None:
            self.before()

        def in_thread() -> Any:
            self.threads.append(threading.get_ident())
            return work()

        return anyio.to_thread.run_sync(in_thread)


def test_a_tree_snapshot_keeps_what_it_had(example: Path) -> None:
    session = Session.open(example)
    labels_before = dict(session.tree.labels)
    snapshot = session.tree.snapshot()
    count, leaf = len(snapshot), snapshot.leaf_id
    target = session.tree.entries[3]["id"]
    session.append_label(target, "later")
    session.append_message({"role": "user", "content": "more", "timestamp": 1})
    assert (len(snapshot), snapshot.leaf_id) == (count, leaf)
    assert snapshot.labels == labels_before
    assert session.tree.labels[target] == "later"
    assert snapshot.path(leaf) == Session.open(example).tree.path(leaf)[: len(snapshot.path(leaf))]


async def test_a_big_fork_is_copied_in_a_thread_from_a_snapshot(
    example: Path, tmp_path: Path, big: None
) -> None:
    offload = Offload()
    runtime = AgentSession.open(example, offload=offload)
    source = runtime.session
    leaf, _ = fork_target(source, FORK_POINT)
    on_path = source.path(leaf)[2]["id"]
    # A turn appending while the copy runs: the fork reads the tree as it was when it started.
    offload.before = lambda: source.append_label(on_path, "added meanwhile")
    labels = dict(source.tree.labels)
    result = await runtime.fork(FORK_POINT, tmp_path / "fork.jsonl")
    assert result.session is not None
    assert offload.threads
    assert threading.get_ident() not in offload.threads
    forked = Session.open(tmp_path / "fork.jsonl")
    assert forked.problems == []
    assert forked.context().messages == Session.open(example).context(leaf).messages
    assert "added meanwhile" not in forked.tree.labels.values()
    assert forked.tree.labels == {t: lab for t, lab in labels.items() if t in forked.tree}
    runtime.close()


async def test_a_big_navigation_walks_and_builds_its_context_in_threads(
    example: Path, big: None
) -> None:
    offload = Offload()
    runtime = AgentSession.open(example, offload=offload)
    session = runtime.session
    target = session.tree.entries[6]["id"]
    result = await runtime.navigate(target)
    assert result.cancelled is False
    # One piece of work collects the branch, one builds the new leaf's context.
    assert len(offload.threads) == 2
    assert threading.get_ident() not in offload.threads
    assert session.context_is_live
    fresh = ContextBuilder(Session.open(example).tree.path(session.leaf_id)).context()
    assert session.context().messages == fresh.messages
    runtime.close()


async def test_a_small_session_does_its_work_on_the_loop(example: Path) -> None:
    offload = Offload()
    runtime = AgentSession.open(example, offload=offload)
    await runtime.navigate(runtime.session.tree.entries[6]["id"])
    assert offload.threads == []  # below HEAVY_ENTRIES: a thread would cost more than the work
    runtime.close()


async def test_a_long_conversation_is_summarized_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the parser in src/parse.py"},
        {"role": "assistant", "content": [{"type": "text", "text": "Done: the parser is fixed."}]},
    ]
    request = history_request(messages, reserve_tokens=16384)
    threads: list[int] = []
    pure = offline.summarize

    def recorded(asked: Any) -> str:
        threads.append(threading.get_ident())
        return pure(asked)

    monkeypatch.setattr(offline, "summarize", recorded)
    monkeypatch.setattr(offline, "IN_THREAD_CHARS", 0)
    response = await offline.OfflineSummarizer().complete(request)
    assert response.text == pure(request)
    assert threads
    assert threads[0] != threading.get_ident()


def _conversation(replies: int) -> str:
    """A serialized conversation: each reply leaves one call waiting, then answers it."""
    parts = ["[User]: Fix it"]
    for n in range(replies):
        parts.append(f'[Assistant tool calls]: read(path="src/m{n}.py")')
        parts.append(f"[Assistant]: Reading m{n}.")
        parts.append(f"[Tool result]: contents of m{n}")
    return "\n\n".join(parts)


def test_reading_a_conversation_looks_at_each_call_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each reply used to look at every earlier call: 6,238 replies of a 200,000-entry session
    # made 29 million looks (8 s). Counted, not timed: twice the replies, about twice the looks.
    looks = 0
    settled = Call.settled

    def counted(call: Call) -> bool:
        nonlocal looks
        looks += 1
        return settled(call)

    monkeypatch.setattr(Call, "settled", counted)
    counts = []
    for replies in (200, 400):
        looks = 0
        facts = read_conversation(_conversation(replies))
        assert len(facts.calls) == replies
        assert all(call.report is not None for call in facts.calls)
        counts.append(looks)
    assert counts[1] <= 2.2 * counts[0]


def test_a_fork_writes_its_file_without_a_second_copy_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lines were joined into one bytes object before writing: the file's size twice over
    # (250 MB for 200,000 entries, two forks at once in a server). Counted by tracemalloc;
    # written in batches of 500 lines here, so that 4,000 entries make several.
    from tests.bench.bench_core import write_session

    monkeypatch.setattr(jsonl_io, "LINES_PER_WRITE", 500)

    source = tmp_path / "s.jsonl"
    write_session(source, 4_000)
    session = Session.open(source)
    leaf = session.tree.entries[-1]["id"]
    size = source.stat().st_size
    tracemalloc.start()
    try:
        branched_session(session, leaf, JsonlStore(tmp_path / "fork.jsonl"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "fork.jsonl").stat().st_size > size * 0.99
    assert peak < 1.6 * size
