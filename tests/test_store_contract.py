"""The store contract (D2, D3, D4, D27), run against the JSONL, memory and PostgreSQL stores alike.

Each test gets one session in one kind of store and opens as many handles on it as it needs:
two JSONL stores on one path, two PostgreSQL stores on one session id (two connections, as two
processes would have), or the one memory store, which is what two owners would share. The
PostgreSQL cases need ``ORCHESTRATOR_TEST_DATABASE`` (tests/services.py): skipped without it
locally, failed without it in CI.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import ConflictError, SessionError, SessionLockedError
from orchestrator._core.load_result import EMPTY_TAIL, Tail
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import SessionStore
from orchestrator._store.tail import tail_of_bytes

SESSION_ID = "0b5e55ed-0000-4000-8000-000000000001"
HEADER: dict[str, Any] = {
    "type": "session",
    "version": 3,
    "id": SESSION_ID,
    "timestamp": "2026-12-02T10:00:00.000Z",
    "cwd": "/w",
}


def entry(entry_id: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "2026-12-02T10:00:01.000Z",
        "message": {"role": "user", "content": f"text of {entry_id}", "timestamp": 1},
        **extra,
    }


def lines(*entries: dict[str, Any]) -> bytes:
    return b"".join(write_pi_line(e) for e in entries)


@dataclass
class Kind:
    """One kind of store holding the test's session."""

    name: str
    location: str
    """What ``open_store`` takes: the file's path or the database URL."""
    open: Callable[..., SessionStore]
    """A new handle on the session (``lock=False``: a writer that ignores the owner lock)."""
    seed: Callable[[bytes], None]
    """Start the session from a file's bytes."""
    contents: Callable[[], bytes]
    """The session's bytes, as a pi file holds them."""


def _jsonl(tmp_path: Path) -> Kind:
    path = tmp_path / "session.jsonl"

    def read() -> bytes:
        return path.read_bytes() if path.exists() else b""

    def seed(data: bytes) -> None:
        path.write_bytes(data)

    return Kind(
        name="jsonl",
        location=str(path),
        open=lambda lock=True: JsonlStore(path, lock=lock),
        seed=seed,
        contents=read,
    )


def _memory() -> Kind:
    holder = [MemoryStore()]

    def seed(data: bytes) -> None:
        holder[0] = MemoryStore(data)

    return Kind(
        name="memory",
        location="<memory>",
        open=lambda lock=True: holder[0],
        seed=seed,
        contents=lambda: holder[0].data,
    )


def _postgres(url: str) -> Kind:
    from orchestrator._store.postgres import PostgresStore

    def seed(data: bytes) -> None:
        with PostgresStore(url, SESSION_ID) as store:
            store.import_bytes(data)

    def contents() -> bytes:
        with PostgresStore(url, SESSION_ID) as store:
            return store.export_bytes() if store.exists() else b""

    return Kind(
        name="postgres",
        location=url,
        open=lambda lock=True: PostgresStore(url, SESSION_ID, lock=lock),
        seed=seed,
        contents=contents,
    )


def _make(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Kind:
    if name == "jsonl":
        return _jsonl(tmp_path)
    if name == "memory":
        return _memory()
    return _postgres(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["jsonl", "memory", "postgres"])
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Kind:
    """Every kind of store."""
    return _make(request.param, request, tmp_path)


@pytest.fixture(params=["jsonl", "postgres"])
def separate(request: pytest.FixtureRequest, tmp_path: Path) -> Kind:
    """The kinds where two handles are two writers (files, databases); the memory store is one
    object, so two handles on it are the same writer."""
    return _make(request.param, request, tmp_path)


# -- writing and reading --------------------------------------------------------------------


def test_a_new_session_reads_back_as_written(kind: Kind) -> None:
    store = kind.open()
    assert not store.exists()
    assert store.tail() == EMPTY_TAIL
    assert store.load().header is None
    end = store.append([HEADER, entry("a")])
    end = store.append([entry("b", "a"), entry("c", "b")], expect=end)
    store.close()
    expected = lines(HEADER, entry("a"), entry("b", "a"), entry("c", "b"))
    assert kind.contents() == expected
    assert end == tail_of_bytes(expected) == Tail(last_id="c", length=len(expected))
    reader = kind.open()
    loaded = reader.load()
    assert reader.exists()
    assert loaded.header == HEADER
    assert [e["id"] for e in loaded.entries] == ["a", "b", "c"]
    assert loaded.problems == []
    assert loaded.tail == reader.tail() == end
    reader.close()


def test_unknown_types_and_fields_survive_append_and_rewrite(kind: Kind) -> None:
    header = {**HEADER, "futureHeaderField": {"nested": [1, 2.5, None, "ß"]}}
    odd = {"type": "from-\x00-future", "id": "x", "parentId": "a", "payload": {"big": 2**70}}
    unicode = entry("y", "x", note="emoji 😀 and \u2028", extra=[True, False, {}])
    store = kind.open()
    store.append([header, entry("a", weird=1)])
    store.append([odd, unicode])
    loaded = store.load()
    assert loaded.header == header
    assert loaded.entries == [entry("a", weird=1), odd, unicode]
    assert kind.contents() == lines(header, entry("a", weird=1), odd, unicode)
    store.rewrite(header, loaded.entries)
    assert kind.contents() == lines(header, entry("a", weird=1), odd, unicode)
    store.close()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
field_maps = st.dictionaries(
    st.text(max_size=10).filter(lambda key: key not in {"id", "parentId", "type"}),
    json_values,
    max_size=5,
)


def _fresh(kind: Kind, session_id: str) -> tuple[SessionStore, Callable[[], bytes]]:
    """A store for a new session of ``kind``, and how to read its bytes back."""
    if kind.name == "jsonl":
        path = Path(kind.location).with_name(f"{session_id}.jsonl")
        return JsonlStore(path), path.read_bytes
    if kind.name == "memory":
        memory = MemoryStore()
        return memory, lambda: memory.data
    from orchestrator._store.postgres import PostgresStore

    database = PostgresStore(kind.location, session_id)
    return database, database.export_bytes


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    header_extra=field_maps,
    fields=st.lists(st.tuples(st.text(max_size=12), field_maps), max_size=5),
    session_number=st.integers(min_value=0, max_value=2**63),
)
def test_any_unknown_type_and_field_survives(
    kind: Kind,
    header_extra: dict[str, Any],
    fields: list[tuple[str, dict[str, Any]]],
    session_number: int,
) -> None:
    session_id = f"prop-{session_number}-{len(fields)}"
    header = {**header_extra, **HEADER, "id": session_id}
    entries, parent = [], None
    for number, (kind_name, extra) in enumerate(fields):
        entry_type = kind_name if kind_name != "session" else "not-session"
        entries.append({"type": entry_type, **extra, "id": f"{number:08x}", "parentId": parent})
        parent = f"{number:08x}"
    store, stored = _fresh(kind, session_id)
    if store.exists():  # hypothesis drew this session number before: start over
        store.close()
        return
    store.append([header])
    for item in entries:
        store.append([item])
    loaded = store.load()
    assert loaded.problems == []
    assert loaded.header == header
    assert loaded.entries == entries
    assert stored() == lines(header, *entries)
    store.rewrite(header, loaded.entries)
    assert stored() == lines(header, *entries)
    store.close()


def test_rewrite_replaces_everything_and_returns_the_new_end(kind: Kind) -> None:
    store = kind.open()
    store.append([HEADER, entry("a"), entry("b", "a")])
    end = store.rewrite(HEADER, [entry("a"), entry("z", "a", edited=True)])
    store.close()
    assert kind.contents() == lines(HEADER, entry("a"), entry("z", "a", edited=True))
    reader = kind.open()
    assert reader.tail() == end == Tail("z", len(kind.contents()))
    reader.close()


def test_a_header_that_is_not_one_is_refused_by_rewrite(kind: Kind) -> None:
    store = kind.open()
    with pytest.raises(SessionError, match="not a session header"):
        store.rewrite({"type": "message", "id": "a"}, [])
    store.close()
    assert kind.contents() == b""


def test_appending_to_nothing_needs_a_header_first(kind: Kind) -> None:
    store = kind.open()
    with pytest.raises(SessionError):
        store.append([entry("a")])
    store.close()
    assert kind.contents() == b""


# -- conditional writes (D27) ---------------------------------------------------------------


def test_a_conditional_append_after_another_write_is_refused_writing_nothing(
    separate: Kind,
) -> None:
    separate.seed(lines(HEADER, entry("a")))
    planner = separate.open()
    planned = planner.load().tail
    other = separate.open(lock=False)  # pi: appends without our lock
    other.append([entry("b", "a")])
    other.close()
    before = separate.contents()
    with pytest.raises(ConflictError, match="nothing was written"):
        planner.append([entry("c", "a")], expect=planned)
    assert separate.contents() == before
    # Planning again from what is there now succeeds.
    fresh = planner.tail()
    assert fresh == tail_of_bytes(before)
    planner.append([entry("c", "b")], expect=fresh)
    planner.close()
    assert separate.contents() == before + lines(entry("c", "b"))


def test_a_conditional_append_with_a_stale_tail_is_refused(kind: Kind) -> None:
    # With a single handle too: the tail named is not where the session ends.
    kind.seed(lines(HEADER, entry("a"), entry("b", "a")))
    store = kind.open()
    before = kind.contents()
    with pytest.raises(ConflictError):
        store.append([entry("c", "b")], expect=Tail("a", 10))
    with pytest.raises(ConflictError):
        store.rewrite(HEADER, [entry("a")], expect=Tail("a", 10))
    store.close()
    assert kind.contents() == before


def test_every_store_refuses_a_stale_tail_in_the_same_words(kind: Kind) -> None:
    # One rule and one message (orchestrator/_store/tail.py): only the location differs.
    kind.seed(lines(HEADER, entry("a"), entry("b", "a")))
    store = kind.open()
    now = store.tail()
    stale = Tail("a", 10)
    said = (
        f"{store.location}: the session changed since it was read (it ended at entry a, "
        f"10 bytes; now at entry b, {now.length} bytes); another program wrote to it, so "
        "nothing was written"
    )
    with pytest.raises(ConflictError) as refused:
        store.append([entry("c", "b")], expect=stale)
    assert str(refused.value) == said
    with pytest.raises(ConflictError) as refused:
        store.rewrite(HEADER, [entry("a")], expect=stale)
    assert str(refused.value) == said
    store.close()


def test_a_bad_header_is_refused_before_the_tail_is_compared(kind: Kind) -> None:
    # The caller's mistake is named first, by every store, whatever the tail says.
    kind.seed(lines(HEADER, entry("a")))
    store = kind.open()
    before = kind.contents()
    with pytest.raises(SessionError) as refused:
        store.rewrite(entry("x"), [entry("a")], expect=Tail("gone", 1))
    assert type(refused.value) is SessionError
    assert "the header is not a session header" in str(refused.value)
    store.close()
    assert kind.contents() == before


def test_a_conditional_rewrite_after_another_write_is_refused(separate: Kind) -> None:
    separate.seed(lines(HEADER, entry("a")))
    planner = separate.open()
    loaded = planner.load()
    other = separate.open(lock=False)
    other.append([entry("b", "a")])
    other.close()
    before = separate.contents()
    with pytest.raises(ConflictError):
        planner.rewrite(HEADER, [*loaded.entries, entry("c", "a")], expect=loaded.tail)
    planner.close()
    assert separate.contents() == before


def test_the_tail_a_write_returns_is_what_the_next_conditional_write_expects(kind: Kind) -> None:
    store = kind.open()
    end = store.append([HEADER])
    for number in range(5):
        parent = f"e{number - 1}" if number else None
        end = store.append([entry(f"e{number}", parent)], expect=end)
    end = store.rewrite(HEADER, store.load().entries, expect=end)
    end = store.append([entry("last", "e4")], expect=end)
    store.close()
    reader = kind.open()
    assert reader.tail() == end
    reader.close()


# -- ownership (D27) ------------------------------------------------------------------------


def test_a_second_owner_is_refused_naming_the_first(kind: Kind) -> None:
    kind.seed(lines(HEADER, entry("a")))
    first = kind.open()
    first.own("orchestrator compact")
    second = kind.open()
    with pytest.raises(SessionLockedError, match=r"being changed by .*orchestrator compact"):
        second.own("orchestrator navigate")
    first.close()
    second.own("orchestrator navigate")  # free again once the owner let go
    second.close()


def test_a_writer_is_refused_while_another_store_owns_the_session(separate: Kind) -> None:
    separate.seed(lines(HEADER, entry("a")))
    owner = separate.open()
    owner.own("orchestrator compact")
    intruder = separate.open()
    before = separate.contents()
    with pytest.raises(SessionLockedError):
        intruder.append([entry("b", "a")])
    with pytest.raises(SessionLockedError):
        intruder.rewrite(HEADER, [entry("a")])
    assert separate.contents() == before
    owner.append([entry("b", "a")], expect=owner.tail())
    owner.close()
    intruder.close()


def test_owning_and_failing_leaves_the_session_unchanged(kind: Kind) -> None:
    kind.seed(lines(HEADER, entry("a")))
    before = kind.contents()
    store = kind.open()
    store.own("orchestrator compact")
    with pytest.raises(ConflictError):
        store.append([entry("b", "a")], expect=EMPTY_TAIL)
    store.close()
    assert kind.contents() == before


# -- damaged data (D3) ----------------------------------------------------------------------


DAMAGED = lines(HEADER, entry("a")) + b'{"type":"message", broken\n' + lines(entry("b", "a"))


def test_damage_is_reported_with_its_line_and_never_rewritten(kind: Kind) -> None:
    kind.seed(DAMAGED)
    store = kind.open()
    loaded = store.load()
    assert [(p.line, p.code) for p in loaded.problems] == [(3, "not_json")]
    assert [e["id"] for e in loaded.entries] == ["a", "b"]
    with pytest.raises(SessionError):
        store.rewrite(HEADER, loaded.entries)
    # Appending keeps every byte, so it is allowed.
    store.append([entry("c", "b")], expect=loaded.tail)
    store.close()
    assert kind.contents() == DAMAGED + lines(entry("c", "b"))


def test_a_torn_tail_is_reported_and_kept_apart_from_new_lines(kind: Kind) -> None:
    torn = lines(HEADER, entry("a")) + b'{"type":"message","id":"b","par'
    if kind.name == "postgres":
        # A database holds whole lines only: the import refuses, naming the line.
        with pytest.raises(SessionError, match="line 3: the last line does not end"):
            kind.seed(torn)
        assert kind.contents() == b""
        return
    kind.seed(torn)
    store = kind.open()
    loaded = store.load()
    assert [p.code for p in loaded.problems] == ["torn_line"]
    store.append([entry("c", "a")])
    store.close()
    assert kind.contents() == lines(HEADER, entry("a"), entry("c", "a"))


# -- concurrency ----------------------------------------------------------------------------


def _append_in_turns(kind: Kind, worker: int, count: int, errors: list[BaseException]) -> None:
    """Append ``count`` entries, each as the owner, each chained to whatever is last."""
    try:
        done = 0
        while done < count:
            store = kind.open()
            try:
                store.own(f"worker {worker}")
            except SessionLockedError:
                store.close()
                continue
            try:
                loaded = store.load()
                last = loaded.entries[-1]["id"] if loaded.entries else None
                store.append([entry(f"w{worker}-{done}", last)], expect=loaded.tail)
                done += 1
            finally:
                store.close()
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)


def test_concurrent_owners_take_turns_and_every_entry_lands_once(separate: Kind) -> None:
    separate.seed(lines(HEADER))
    workers, count = 4, 8
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_append_in_turns, args=(separate, n, count, errors))
        for n in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    reader = separate.open()
    loaded = reader.load()
    reader.close()
    assert loaded.problems == []
    ids = [e["id"] for e in loaded.entries]
    assert sorted(ids) == sorted(f"w{n}-{i}" for n in range(workers) for i in range(count))
    # One chain: each entry's parent is the entry stored before it.
    assert [e["parentId"] for e in loaded.entries] == [None, *ids[:-1]]


# Each worker process appends COUNT entries, each as the owner, chained to whatever is last.
WORKER = """
import sys
from orchestrator._core.errors import SessionLockedError
from orchestrator._store.factory import open_store
location, session_id, worker, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
done = 0
while done < count:
    store = open_store(location, session_id)
    try:
        store.own(f"worker {worker}")
    except SessionLockedError:
        store.close()
        continue
    loaded = store.load()
    last = loaded.entries[-1]["id"] if loaded.entries else None
    entry = {"type": "custom", "id": f"p{worker}-{done}", "parentId": last, "customType": "n"}
    store.append([entry], expect=loaded.tail)
    store.close()
    done += 1
"""


@pytest.mark.slow
def test_owners_in_separate_processes_take_turns(separate: Kind) -> None:
    separate.seed(lines(HEADER))
    workers, count = 3, 6
    root = Path(__file__).resolve().parent.parent
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, separate.location, SESSION_ID, str(n), str(count)],
            cwd=root,
        )
        for n in range(workers)
    ]
    assert [child.wait() for child in children] == [0] * workers
    reader = separate.open()
    loaded = reader.load()
    reader.close()
    assert loaded.problems == []
    ids = [e["id"] for e in loaded.entries]
    assert sorted(ids) == sorted(f"p{n}-{i}" for n in range(workers) for i in range(count))
    assert [e["parentId"] for e in loaded.entries] == [None, *ids[:-1]]
