"""D27 at the store: ownership (one owner, named in the refusal) and conditional writes.

Both stores satisfy the same contract, so most tests run on each through a small factory; the
file-only parts (the lock's side file, symbolic links, other processes) follow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.errors import ConflictError, SessionError, SessionLockedError
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import EMPTY_TAIL, SessionStore, Tail
from orchestrator._store.session import Session

REPO = Path(__file__).resolve().parents[1]
HEADER: dict[str, Any] = {"type": "session", "version": 3, "id": "s1", "cwd": "/w"}


def entry(entry_id: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, **extra}


def user(entry_id: str, parent: str | None, text: str = "hi") -> dict[str, Any]:
    return entry(entry_id, parent, message={"role": "user", "content": text, "timestamp": 1})


def assistant(entry_id: str, parent: str | None) -> dict[str, Any]:
    message = {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "timestamp": 2}
    return entry(entry_id, parent, message=message)


def lines(*entries: dict[str, Any]) -> bytes:
    return b"".join(write_pi_line(e) for e in entries)


StoreFactory = Callable[[bytes], SessionStore]


@pytest.fixture(params=["jsonl", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    made: list[SessionStore] = []

    def make(data: bytes) -> SessionStore:
        store: SessionStore
        if request.param == "jsonl":
            path = tmp_path / "s.jsonl"
            if data:
                path.write_bytes(data)
            store = JsonlStore(path)
        else:
            store = MemoryStore(data)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def stored(store: SessionStore) -> bytes:
    if isinstance(store, MemoryStore):
        return store.data
    assert isinstance(store, JsonlStore)
    return store.path.read_bytes()


def sneak(store: SessionStore, data: bytes) -> None:
    """Append bytes behind the store's back, as pi does (it never takes our lock)."""
    if isinstance(store, MemoryStore):
        store._data += data
    else:
        assert isinstance(store, JsonlStore)
        with store.path.open("ab") as file:
            file.write(data)


# -- the tail ----------------------------------------------------------------------------------


def test_tail_names_the_last_entry_and_the_length(make_store: StoreFactory) -> None:
    data = lines(HEADER, entry("a"), entry("b", "a"))
    store = make_store(data)
    assert store.tail() == Tail(last_id="b", length=len(data))
    assert store.load().tail == Tail(last_id="b", length=len(data))


def test_tail_of_an_empty_or_header_only_store(make_store: StoreFactory) -> None:
    assert make_store(b"").tail() == EMPTY_TAIL
    header_only = lines(HEADER)
    assert make_store(header_only).tail() == Tail(last_id=None, length=len(header_only))


def test_tail_passes_over_a_torn_or_damaged_last_line(make_store: StoreFactory) -> None:
    data = lines(HEADER, entry("a")) + b"not json\n" + b'{"type":"message","id":"tor'
    store = make_store(data)
    assert store.tail() == Tail(last_id="a", length=len(data))
    assert store.load().tail == store.tail()


def test_tail_reads_back_past_a_long_last_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    data = lines(HEADER, entry("a"), entry("b", "a", blob="x" * 300_000))
    path.write_bytes(data)
    assert JsonlStore(path).tail() == Tail(last_id="b", length=len(data))


# -- conditional writes --------------------------------------------------------------------------


def test_append_with_the_current_tail_writes_and_returns_the_new_tail(
    make_store: StoreFactory,
) -> None:
    store = make_store(lines(HEADER, entry("a")))
    expect = store.load().tail
    new = store.append([entry("b", "a")], expect=expect)
    assert new == Tail(last_id="b", length=len(lines(HEADER, entry("a"), entry("b", "a"))))
    assert new == store.tail()
    assert store.append([entry("c", "b")], expect=new).last_id == "c"


def test_append_after_a_foreign_append_is_a_conflict_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    store = make_store(lines(HEADER, entry("a")))
    expect = store.load().tail
    sneak(store, write_pi_line(entry("pi", "a")))
    before = stored(store)
    with pytest.raises(ConflictError, match=r"changed since it was read .*entry a.*entry pi"):
        store.append([entry("b", "a")], expect=expect)
    assert stored(store) == before
    assert isinstance(ConflictError("x"), SessionError)


def test_rewrite_after_a_foreign_append_is_a_conflict_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    store = make_store(lines(HEADER, entry("a")))
    expect = store.load().tail
    sneak(store, write_pi_line(entry("pi", "a")))
    before = stored(store)
    with pytest.raises(ConflictError):
        store.rewrite(HEADER, [entry("a", edited=True)], expect=expect)
    assert stored(store) == before


def test_unconditional_writes_do_not_swallow_a_foreign_append(make_store: StoreFactory) -> None:
    # A turn appends without a check; the commit after it must still see pi's line.
    store = make_store(lines(HEADER, entry("a")))
    store.load()
    sneak(store, write_pi_line(entry("pi", "a")))
    mine = store.append([entry("b", "a")])
    with pytest.raises(ConflictError):
        store.append([entry("c", "b")], expect=mine)


def test_a_torn_tail_repaired_by_the_write_counts_as_ours(make_store: StoreFactory) -> None:
    torn = lines(HEADER, entry("a")) + b'{"type":"message","id":"x'
    store = make_store(torn)
    expect = store.load().tail
    new = store.append([entry("b", "a")], expect=expect)
    assert new == store.tail()
    assert store.append([entry("c", "b")], expect=new).last_id == "c"


def test_file_replaced_behind_the_writer_is_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines(HEADER, entry("a")))
    with JsonlStore(path) as store:
        expect = store.load().tail
        store.append([entry("b", "a")], expect=expect)
        replacement = tmp_path / "other"
        replacement.write_bytes(path.read_bytes())
        os.replace(replacement, path)
        with pytest.raises(
            ConflictError, match=r"since it was read \(the file was replaced\); nothing was"
        ):
            store.append([entry("c", "b")], expect=store.tail())
        path.unlink()
        with pytest.raises(
            ConflictError, match=r"since it was read \(the file was removed\); nothing was"
        ):
            store.append([entry("c", "b")], expect=expect)


# -- ownership -----------------------------------------------------------------------------------


def test_a_second_owner_is_refused_with_pid_and_name(make_store: StoreFactory) -> None:
    first = make_store(lines(HEADER))
    first.own("orchestrator compact")
    if isinstance(first, MemoryStore):
        second: SessionStore = first
    else:
        assert isinstance(first, JsonlStore)
        second = JsonlStore(first.path)
    message = f"session is being changed by pid {os.getpid()} (orchestrator compact)"
    with pytest.raises(SessionLockedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        second.own("orchestrator navigate")
    first.close()
    second.own("orchestrator navigate")
    second.close()


def test_owning_writes_nothing_to_the_session(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    data = lines(HEADER, entry("a")) + b'{"torn'
    path.write_bytes(data)
    store = JsonlStore(path)
    store.own("test")
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.jsonl.lock"]
    store.close()


def test_the_lock_file_goes_away_with_its_owner(tmp_path: Path) -> None:
    # Issue 11: a .lock file stayed beside every session ever written.
    path = tmp_path / "s.jsonl"
    with JsonlStore(path) as store:
        store.append([HEADER, entry("a")])
        store.rewrite(HEADER, [entry("a", edited=True)])
        store.append([entry("b", "a")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
    session = Session.open(path, owner="test")
    session.append_entry("custom", {"customType": "x"})
    session.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_a_lock_file_left_by_a_killed_owner_is_taken_over_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines(HEADER))
    (tmp_path / "s.jsonl.lock").write_text("999999 orchestrator compact\n")
    with JsonlStore(path) as store:
        store.own("orchestrator navigate")
        assert (tmp_path / "s.jsonl.lock").read_text() == f"{os.getpid()} orchestrator navigate\n"
    assert not (tmp_path / "s.jsonl.lock").exists()


def test_a_lock_file_deleted_between_open_and_flock_is_not_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The previous owner deletes the side file as it lets go. A newcomer that opened the old
    # file just before must not believe it owns the session: it starts over on a fresh file.
    from orchestrator._store import files, owner

    path = tmp_path / "s.jsonl"
    first = JsonlStore(path)
    first.own("first")
    stale = os.open(first.lock_path, os.O_RDWR)
    first.close()  # deletes the file it locked, then lets go
    real_open = files.open_side_file
    opened: list[int] = []

    def open_old_file_first(*args: Any) -> int:
        fd = stale if not opened else real_open(*args)
        opened.append(fd)
        return fd

    monkeypatch.setattr(owner, "open_side_file", open_old_file_first)
    second = JsonlStore(path)
    second.own("second")
    assert len(opened) == 2  # locked the stale file, noticed, started over
    assert second.lock_path.read_text() == f"{os.getpid()} second\n"
    monkeypatch.setattr(owner, "open_side_file", real_open)
    with pytest.raises(SessionLockedError, match=r"\(second\)"):
        JsonlStore(path).own("third")
    second.close()


def test_a_symlinked_lock_file_is_refused_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    folder = tmp_path / "sessions"
    folder.mkdir()
    path = folder / "s.jsonl"
    path.write_bytes(lines(HEADER))
    (folder / "s.jsonl.lock").symlink_to(outside)
    with pytest.raises(SessionError, match="symbolic link; refusing to follow it"):
        JsonlStore(path).own("test")
    with pytest.raises(SessionError, match="symbolic link"):
        JsonlStore(path).append([entry("a")])
    assert outside.read_text() == "precious\n"
    assert (folder / "s.jsonl.lock").is_symlink()


def test_a_symlinked_corrupt_side_file_is_refused_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    folder = tmp_path / "sessions"
    folder.mkdir()
    path = folder / "s.jsonl"
    data = lines(HEADER, entry("a")) + b'{"torn'
    path.write_bytes(data)
    (folder / "s.jsonl.corrupt").symlink_to(outside)
    with JsonlStore(path) as store, pytest.raises(SessionError, match="symbolic link"):
        store.append([entry("b", "a")])
    assert outside.read_text() == "precious\n"
    assert path.read_bytes() == data


def test_readers_never_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines(HEADER, entry("a")))
    owner = Session.open(path, owner="orchestrator serve")
    reader = Session.open(path)
    assert reader.leaf_id == "a"
    reader.close()
    assert (tmp_path / "s.jsonl.lock").exists()  # the owner's, untouched by the reader
    owner.close()


@pytest.mark.slow
def test_another_process_sees_who_owns_the_session(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines(HEADER))
    code = (
        "import sys\n"
        "from orchestrator._store.session import Session\n"
        "s = Session.open(sys.argv[1], owner='orchestrator serve')\n"
        "print('owned', flush=True)\n"
        "sys.stdin.readline()\n"
        "s.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == "owned\n"
        expected = rf"session is being changed by pid {child.pid} \(orchestrator serve\)"
        with pytest.raises(SessionLockedError, match=expected):
            Session.open(path, owner="orchestrator navigate")
        child.stdin.write("go\n")
        child.stdin.close()
        assert child.wait() == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    Session.open(path, owner="orchestrator navigate").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


# -- the session passes it through ---------------------------------------------------------------


@pytest.fixture(params=["jsonl", "memory"])
def persisted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    data = lines(HEADER, user("u1", None), assistant("a1", "u1"))
    if request.param == "jsonl":
        path = tmp_path / "s.jsonl"
        path.write_bytes(data)
        session = Session.open(path, owner="test")
    else:
        session = Session.from_store(MemoryStore(data), owner="test")
    yield session
    session.close()


def test_session_tail_is_where_it_was_read_and_moves_with_its_writes(persisted: Session) -> None:
    read = persisted.tail()
    assert read == Tail(last_id="a1", length=len(stored(persisted.store)))
    added = persisted.append_entry("custom", {"customType": "x"}, expect=read)
    assert persisted.tail() == Tail(last_id=added["id"], length=len(stored(persisted.store)))


def test_session_commit_refused_leaves_file_and_tree_unchanged(persisted: Session) -> None:
    expect = persisted.tail()
    sneak(persisted.store, write_pi_line(user("pi1", "a1", "from pi")))
    before = stored(persisted.store)
    entries, leaf = list(persisted.tree.entries), persisted.leaf_id
    context = persisted.context().messages
    with pytest.raises(ConflictError):
        persisted.append_entry("compaction", {"summary": "s"}, expect=expect)
    summary = persisted.new_entry(
        "branch_summary", {"fromId": "a1", "summary": "s"}, parent_id="u1"
    )
    with pytest.raises(ConflictError):
        persisted.attach_branch_summary(summary, expect=expect)
    with pytest.raises(ConflictError):
        persisted.replace_entries([{**persisted.tree.get("u1"), "edited": True}], expect=expect)
    assert stored(persisted.store) == before
    assert (persisted.tree.entries, persisted.leaf_id) == (entries, leaf)
    assert "edited" not in persisted.tree.get("u1")
    assert persisted.context().messages == context
    # Without a condition, the write still goes through (turns are the runtime's business).
    persisted.append_entry("custom", {"customType": "x"})


def test_session_commit_on_a_lazy_session_checks_the_store(tmp_path: Path) -> None:
    store = MemoryStore()
    session = Session.from_store(store, owner="test")
    expect = session.tail()
    assert expect == EMPTY_TAIL
    session.append_message({"role": "user", "content": "hi", "timestamp": 1})
    store._data += lines(HEADER)  # someone created the session meanwhile
    with pytest.raises(ConflictError):
        session.append_entry("custom", {"customType": "x"}, expect=expect)


def test_a_session_that_fails_to_open_lets_go_of_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"not a session\n")
    with pytest.raises(SessionError, match="not a session file"):
        Session.open(path, owner="test")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
    Session.open(path.with_name("t.jsonl"), owner="test").close()
