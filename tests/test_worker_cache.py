"""Every activity reads its session through the worker's cache; the cache's bounds are options.

The activities are called directly (no Temporal server) over a directory and over PostgreSQL.
Parses are counted where the stores make them (``read_session``), so a test says how many whole
sessions a worker parsed, not how often it looked in its cache.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the cluster tests need the 'cluster' extra")

from orchestrator._cli.main import main  # noqa: E402
from orchestrator._cluster.cache import SessionCache  # noqa: E402
from orchestrator._cluster.calls import NewEntry, TurnCall  # noqa: E402
from orchestrator._cluster.navigation.activities import TreeActivities  # noqa: E402
from orchestrator._cluster.operation.activities import SessionActivities  # noqa: E402
from orchestrator._cluster.stores import WorkerStores, cluster_store  # noqa: E402
from orchestrator._cluster.turn.activities import TurnActivities  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.types import RuntimeSettings  # noqa: E402
from orchestrator._store import jsonl, jsonl_file, jsonl_io, postgres  # noqa: E402
from orchestrator._store.locations import is_database_url  # noqa: E402
from orchestrator._store.session import Session  # noqa: E402
from tests.cluster_kit import Database  # noqa: E402
from tests.test_cluster_cache import RacingCache, parsed  # noqa: E402

SETTINGS = RuntimeSettings()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every whole-session parse either store makes, as it happens."""
    seen: list[str] = []
    for module, name in (
        (jsonl, "read_session"),
        (jsonl_file, "read_session_chunks"),
        (jsonl_io, "read_session_chunks"),
        (postgres, "read_session"),
    ):
        real = getattr(module, name)

        def counted(data: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append("parse")
            return _real(data, *args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return seen


def message(role: str, text: str) -> str:
    return json.dumps(
        {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1},
        ensure_ascii=False,
    )


def turn(turns: TurnActivities, session_id: str, n: int) -> list[dict[str, Any]]:
    """One turn's store work, as the workflow asks for it: the prompt, the context, the reply."""
    prompt = NewEntry(entry_id=f"user{n:04d}", message=message("user", f"question {n}"))
    turns._append(TurnCall(session_id=session_id, run_id=f"r{n}", entries=[prompt]))
    _, messages = turns._context(TurnCall(session_id=session_id, run_id=f"r{n}"))
    reply = NewEntry(entry_id=f"repl{n:04d}", message=message("assistant", f"answer {n}"))
    turns._append(TurnCall(session_id=session_id, run_id=f"r{n}", entries=[reply]))
    return messages


def written_elsewhere(database: Database, session_id: str, text: str) -> str:
    """Another writer (another worker, pi) appends a user message; returns its id."""
    session = Session.from_store(cluster_store(database.location, session_id))
    try:
        return str(session.append_message(json.loads(message("user", text)))["id"])
    finally:
        session.close()


def texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [
        part["text"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "text"
    ]


def test_a_second_turn_on_the_same_worker_parses_nothing_from_a_database_again(
    cluster_database: Database, parses: list[str]
) -> None:
    session_id = cluster_database.add_example()
    stores = WorkerStores(cluster_database.location)
    turns = TurnActivities(stores, SETTINGS)
    del parses[:]  # storing the example parsed it
    try:
        turn(turns, session_id, 1)
        first = len(parses)
        del parses[:]
        messages = turn(turns, session_id, 2)
        assert texts(messages)[-1] == "question 2"
        if is_database_url(cluster_database.location):
            # The database says the stamp each append left: the cache grows with the turn.
            assert (first, len(parses)) == (1, 0)
            assert stores.cache.stats.stale == 0
        else:
            # A file cannot say whether another program appended right after this worker:
            # each append's session is read again once (by the next read), never used stale.
            assert (first, len(parses)) == (2, 2)
        stored = [e["id"] for e in cluster_database.entries(session_id)][-4:]
        assert stored == ["user0001", "repl0001", "user0002", "repl0002"]
    finally:
        stores.close()


def test_a_turn_sees_what_another_writer_appended_after_the_cache_was_filled(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    stores = WorkerStores(cluster_database.location)
    turns = TurnActivities(stores, SETTINGS)
    try:
        turn(turns, session_id, 1)
        elsewhere = written_elsewhere(cluster_database, session_id, "from elsewhere")

        messages = turn(turns, session_id, 2)

        assert texts(messages)[-2:] == ["from elsewhere", "question 2"]
        ids = [e["id"] for e in cluster_database.entries(session_id)][-5:]
        assert ids == ["user0001", "repl0001", elsewhere, "user0002", "repl0002"]
    finally:
        stores.close()


def test_an_append_racing_another_writer_lands_after_it_and_is_not_cached_stale(
    cluster_database: Database,
) -> None:
    session_id = cluster_database.add_example()
    cache = RacingCache(lambda: None)
    stores = WorkerStores(cluster_database.location, cache=cache)
    turns = TurnActivities(stores, SETTINGS)
    try:
        turn(turns, session_id, 1)
        seen: list[str] = []
        cache.race = lambda: seen.append(written_elsewhere(cluster_database, session_id, "race"))

        turn(turns, session_id, 2)

        assert cache.race is None  # the other writer did write after the check
        assert seen
        ids = [e["id"] for e in cluster_database.entries(session_id)][-3:]
        assert sorted(ids) == sorted([seen[0], "user0002", "repl0002"])
        assert ids[-1] == "repl0002"  # the append conditional on the cached read went after it
        _, messages = turns._context(TurnCall(session_id=session_id))
        assert "race" in texts(messages)
    finally:
        stores.close()


def test_navigation_and_fork_reads_go_through_the_cache(
    cluster_database: Database, parses: list[str]
) -> None:
    session_id = cluster_database.add_example()
    acts = SessionActivities(cluster_database.location, SummaryRoutes(candidates=()), SETTINGS)
    tree = TreeActivities(acts)
    del parses[:]  # storing the example parsed it
    try:
        for _ in range(3):
            tree._open(session_id).store.close()
            tree._stored(session_id, None).store.close()
        assert len(parses) == 1
        written_elsewhere(cluster_database, session_id, "moved on")
        del parses[:]  # the other writer parsed it
        opened = tree._open(session_id)
        opened.store.close()
        assert texts(opened.context().messages)[-1] == "moved on"
        assert len(parses) == 1  # read again once: the cached parse was stale
    finally:
        acts.close()


# -- the bounds, as worker options ------------------------------------------------------------


def worker_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *options: str) -> SessionCache:
    """The cache of a worker started with ``options`` (its Temporal loop replaced)."""
    from orchestrator._cluster import worker as worker_module

    seen: list[SessionActivities] = []

    async def run_worker(address: str, activities: SessionActivities, **kwargs: object) -> None:
        seen.append(activities)

    monkeypatch.setattr(worker_module, "run_worker", run_worker)
    assert main(["worker", "--temporal", "h:1", "--database", str(tmp_path), *options]) == 0
    return seen[0].stores.cache


def usage_error(capsys: pytest.CaptureFixture[str], *options: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["worker", "--temporal", "h:1", "--database", "db", *options])
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_worker_caches_1000_sessions_and_256_mib_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = worker_cache(monkeypatch, tmp_path)
    assert (cache.max_sessions, cache.max_bytes) == (1000, 256 << 20)


def test_cache_sessions_evicts_the_least_recently_used_by_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = worker_cache(monkeypatch, tmp_path, "--cache-sessions", "2")
    for name in ("a", "b", "c"):
        cache.put(name, (1,), parsed(10))
    assert (len(cache), cache.stats.evicted) == (2, 1)
    assert cache.get("a", (1,)) is None
    assert cache.get("c", (1,)) is not None


def test_cache_mib_evicts_by_stored_bytes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = worker_cache(monkeypatch, tmp_path, "--cache-mib", "1")
    assert cache.max_bytes == 1 << 20
    cache.put("a", (1,), parsed(600 << 10))
    cache.put("b", (1,), parsed(600 << 10))
    assert (len(cache), cache.size_bytes, cache.stats.evicted) == (1, 600 << 10, 1)
    cache.put("big", (1,), parsed(2 << 20))  # larger than the bound: used once, never kept
    assert cache.get("big", (1,)) is None
    assert cache.get("b", (1,)) is not None


@pytest.mark.parametrize("option", ["--cache-sessions", "--cache-mib"])
def test_either_bound_at_0_turns_the_cache_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, option: str
) -> None:
    cache = worker_cache(monkeypatch, tmp_path, option, "0")
    cache.put("empty", (1,), parsed(0))
    cache.put("a", (1,), parsed(10))
    assert (len(cache), cache.size_bytes) == (0, 0)


@pytest.mark.parametrize("option", ["--cache-sessions", "--cache-mib"])
def test_a_bound_that_is_not_a_whole_number_of_0_or_more_is_refused(
    capsys: pytest.CaptureFixture[str], option: str
) -> None:
    line = usage_error(capsys, option, "-1")
    assert line == (
        f"orchestrator worker: error: argument {option}: -1 is negative (0 turns the cache off)"
    )
    line = usage_error(capsys, option, "1.5")
    assert line.endswith(f"argument {option}: '1.5' is not an integer")
