"""The JSONL file store: line format, durability, single writer, atomic rewrite (D1-D4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import (
    ConflictError,
    NotASessionError,
    SessionError,
    SessionLockedError,
)
from orchestrator._core.load_result import Tail
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "store"
HEADER: dict[str, Any] = {
    "type": "session",
    "version": 3,
    "id": "s1",
    "timestamp": "2026-01-01T00:00:00.000Z",
    "cwd": "/w",
}


def entry(entry_id: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, **extra}


# -- line format -----------------------------------------------------------------------------


def test_write_pi_line_matches_json_stringify() -> None:
    # What node prints for JSON.stringify of the same object, plus "\n".
    value = {"a": "é✓🎉", "b": [1, 2.5, None, True, False], "c": {"d": '\n\t"\\\x01\x7f'}}
    expected = '{"a":"é✓🎉","b":[1,2.5,null,true,false],"c":{"d":"\\n\\t\\"\\\\\\u0001\x7f"}}\n'
    assert write_pi_line(value) == expected.encode("utf-8")


def test_write_pi_line_escapes_lone_surrogates_like_json_stringify() -> None:
    line = write_pi_line({"x": "a\ud800b"})
    assert line == b'{"x":"a\\ud800b"}\n'
    assert json.loads(line) == {"x": "a\ud800b"}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1, 2}, b"bytes"])
def test_write_pi_line_refuses_what_json_cannot_carry(bad: object) -> None:
    with pytest.raises(SessionError, match="entry 'x1' cannot be written as JSON"):
        write_pi_line({"id": "x1", "value": bad})


def test_appended_lines_are_exactly_write_pi_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    entries = [HEADER, entry("a", text="ü"), entry("b", "a")]
    with JsonlStore(path) as store:
        store.append(entries)
    assert path.read_bytes() == b"".join(write_pi_line(e) for e in entries)


# -- round trip ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
random_entries = st.lists(
    st.dictionaries(st.text(max_size=10), json_values, max_size=6).map(
        lambda fields: {**fields, "type": fields.get("type", "t")}
    ),
    max_size=6,
)


def with_ids(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    linked, parent = [], None
    for number, fields in enumerate(entries):
        if fields.get("type") == "session":
            fields = {**fields, "type": "not-a-header"}
        linked.append({**fields, "id": f"{number:08x}", "parentId": parent})
        parent = f"{number:08x}"
    return linked


@settings(max_examples=40, deadline=None)
@given(entries=random_entries, header_extra=st.dictionaries(st.text(max_size=6), json_values))
def test_round_trip_keeps_unknown_types_and_fields(
    entries: list[dict[str, Any]], header_extra: dict[str, Any]
) -> None:
    header = {**header_extra, **HEADER}
    linked = with_ids(entries)
    # Durability is tested below; here fsync would only make each example slow.
    with tempfile.TemporaryDirectory() as directory, mock.patch.object(os, "fsync"):
        path = Path(directory) / "s.jsonl"
        with JsonlStore(path) as store:
            store.append([header, *linked[:3]])
            store.append(linked[3:])
        loaded = JsonlStore(path).load()
        assert loaded.problems == []
        assert loaded.header == header
        assert loaded.entries == linked
        with JsonlStore(path) as store:
            store.rewrite(loaded.header, loaded.entries)
        assert JsonlStore(path).load().entries == linked


def test_v3_fixture_survives_load_and_rewrite_byte_for_byte(tmp_path: Path) -> None:
    original = (DATA / "v3_unknown.jsonl").read_bytes()
    path = tmp_path / "s.jsonl"
    path.write_bytes(original)
    with JsonlStore(path) as store:
        result = store.load()
        assert result.header is not None
        store.rewrite(result.header, result.entries)
    assert path.read_bytes() == original


def test_store_satisfies_the_protocol(tmp_path: Path) -> None:
    store: SessionStore = JsonlStore(tmp_path / "s.jsonl")
    assert store.location == str(tmp_path / "s.jsonl")


def test_exists_and_missing_file_loads_empty(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    store = JsonlStore(path)
    assert store.exists() is False
    result = store.load()
    assert (result.header, result.entries, result.problems) == (None, [], [])
    path.write_bytes(b"")
    assert store.exists() is False
    store.append([HEADER])
    assert store.exists() is True
    store.close()


def test_a_file_that_says_it_is_empty_but_has_content_is_read(tmp_path: Path) -> None:
    # The kernel's files report a size of 0: /proc/self/status was taken for an empty file,
    # so a new, empty session ("0 entries", exit 0) instead of "not a session file".
    store = JsonlStore(Path("/proc/self/status"))
    assert os.stat("/proc/self/status").st_size == 0
    assert store.exists() is True
    with pytest.raises(NotASessionError, match="not a session file"):
        Session.open(Path("/proc/self/status"))
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert JsonlStore(fifo).exists() is False  # not read (it would wait for a writer)


def test_append_nothing_writes_nothing_and_takes_no_lock(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "s.jsonl")
    store.append([])
    assert list(tmp_path.iterdir()) == []


def test_first_append_to_an_empty_file_must_start_with_the_header(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlStore(path) as store:
        with pytest.raises(SessionError, match="first entry appended must be the header"):
            store.append([entry("a")])
        store.append([HEADER])
        store.append([entry("a")])
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a"]


# -- fsync policy ----------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every fsync as "file" (a regular file) or "dir"."""
    calls: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_fsync_always_syncs_every_append(tmp_path: Path, fsyncs: list[str]) -> None:
    with JsonlStore(tmp_path / "s.jsonl", fsync="always") as store:
        store.append([HEADER])
        store.append([entry("a"), entry("b", "a")])
        assert fsyncs == ["dir", "file", "file"]  # the new file's name, then each append
        store.sync()
    assert fsyncs == ["dir", "file", "file"]


def test_fsync_per_turn_syncs_at_sync_and_close(tmp_path: Path, fsyncs: list[str]) -> None:
    store = JsonlStore(tmp_path / "s.jsonl", fsync="per_turn")
    store.append([HEADER])
    store.append([entry("a")])
    assert fsyncs == ["dir"]  # the new file's name only
    store.sync()
    assert fsyncs == ["dir", "file"]
    store.sync()  # nothing new since
    assert fsyncs == ["dir", "file"]
    store.append([entry("b", "a")])
    store.close()
    assert fsyncs == ["dir", "file", "file"]


def test_fsync_never_never_syncs_appends(tmp_path: Path, fsyncs: list[str]) -> None:
    with JsonlStore(tmp_path / "s.jsonl", fsync="never") as store:
        store.append([HEADER, entry("a")])
        store.sync()
    assert fsyncs == []


def test_rewrite_fsyncs_file_and_directory_whatever_the_policy(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    with JsonlStore(tmp_path / "s.jsonl", fsync="never") as store:
        store.rewrite(HEADER, [entry("a")])
    assert fsyncs == ["file", "dir"]


# -- single writer ---------------------------------------------------------------------------


def test_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    first, second = JsonlStore(path), JsonlStore(path)
    first.append([HEADER])
    with pytest.raises(SessionLockedError, match=str(path)):
        second.append([entry("a")])
    with pytest.raises(SessionLockedError):
        second.rewrite(HEADER, [])
    with pytest.raises(SessionLockedError):
        second.repair_torn_tail()
    assert second.load().header == HEADER  # reading needs no lock
    first.close()
    second.append([entry("a")])
    second.close()
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a"]


def test_the_lock_survives_a_rewrite(tmp_path: Path) -> None:
    # The session file's inode changes on rewrite; the lock must still exclude others.
    path = tmp_path / "s.jsonl"
    with JsonlStore(path) as first:
        first.rewrite(HEADER, [entry("a")])
        with pytest.raises(SessionLockedError):
            JsonlStore(path).append([entry("b", "a")])


def test_context_manager_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlStore(path) as store:
        store.append([HEADER])
    with JsonlStore(path) as store:
        store.append([entry("a")])
    store.close()  # idempotent


def test_lock_false_does_not_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlStore(path, lock=False) as first, JsonlStore(path, lock=False) as second:
        first.append([HEADER])
        second.append([entry("a")])
    assert not (tmp_path / "s.jsonl.lock").exists()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    code = (
        "import sys\n"
        "from orchestrator._store.jsonl import JsonlStore\n"
        "from orchestrator._core.errors import SessionLockedError\n"
        "try:\n"
        "    JsonlStore(sys.argv[1]).append([{'type': 'custom', 'id': 'x', 'parentId': None}])\n"
        "except SessionLockedError as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    with JsonlStore(path) as store:
        store.append([HEADER])
        done = subprocess.run(
            [*_python(code), str(path)], env=_env(), capture_output=True, text=True, check=False
        )
    assert done.returncode == 3, done.stderr
    assert str(path) in done.stdout
    assert path.read_bytes() == write_pi_line(HEADER)


@pytest.mark.slow
def test_lock_held_by_another_process_refuses_us_until_it_exits(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER))
    code = (
        "import sys\n"
        "from orchestrator._store.jsonl import JsonlStore\n"
        "store = JsonlStore(sys.argv[1])\n"
        "store.repair_torn_tail()\n"  # takes the lock
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        "store.close()\n"
    )
    child = subprocess.Popen(
        [*_python(code), str(path)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == "locked\n"
        with pytest.raises(
            SessionLockedError, match=rf"being changed by pid {child.pid} \(python\)"
        ):
            JsonlStore(path).append([entry("a")])
        child.stdin.write("go\n")
        child.stdin.close()
        assert child.wait() == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    with JsonlStore(path) as store:
        store.append([entry("a")])


# -- atomic rewrite --------------------------------------------------------------------------


def test_rewrite_crash_before_rename_leaves_the_original_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    original = write_pi_line(HEADER) + write_pi_line(entry("a"))
    path.write_bytes(original)

    def crash(src: Any, dst: Any) -> None:
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with JsonlStore(path) as store, pytest.raises(OSError, match="simulated crash"):
        store.rewrite(HEADER, [entry("b")])
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_rewrite_crash_while_writing_the_temp_file_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    original = write_pi_line(HEADER)
    path.write_bytes(original)
    real_fsync = os.fsync
    store = JsonlStore(path)
    store.repair_torn_tail()  # open the writer first, so only the rewrite's fsync fails

    def failing(fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(SessionError, match=r"s\.jsonl: cannot write it: disk gone$"):
        store.rewrite(HEADER, [entry("b")])
    monkeypatch.setattr(os, "fsync", real_fsync)
    store.close()
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_rewrite_replaces_content_keeps_mode_and_later_appends_land_in_the_new_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + write_pi_line(entry("old")))
    path.chmod(0o600)
    old_inode = path.stat().st_ino
    with JsonlStore(path) as store:
        store.append([entry("x", "old")])  # open the append descriptor before the rewrite
        store.rewrite(HEADER, [entry("a")])
        store.append([entry("b", "a")])
    assert path.stat().st_ino != old_inode
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_bytes() == b"".join(
        write_pi_line(e) for e in [HEADER, entry("a"), entry("b", "a")]
    )


def test_rewrite_requires_a_session_header(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="not a session header"):
        JsonlStore(tmp_path / "s.jsonl").rewrite({"type": "message", "id": "a"}, [])


def test_rewrite_is_refused_when_the_file_was_damaged_after_load(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER))
    store = JsonlStore(path)
    assert store.load().problems == []
    with path.open("ab") as other:
        other.write(b"junk from someone else\n")
    with pytest.raises(SessionError, match="line 2: not valid JSON"):
        store.rewrite(HEADER, [])
    store.close()


# -- torn tail -------------------------------------------------------------------------------


def test_torn_tail_is_moved_aside_and_appends_land_on_a_clean_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    clean = write_pi_line(HEADER) + write_pi_line(entry("a"))
    path.write_bytes(clean + b'{"type":"message","id":"b","pare')
    with JsonlStore(path) as store:
        loaded = store.load()
        assert loaded.torn_tail == b'{"type":"message","id":"b","pare'
        assert path.read_bytes().endswith(b"pare")  # load alone changes nothing
        store.append([entry("c", "a")])
    assert path.read_bytes() == clean + write_pi_line(entry("c", "a"))
    corrupt = tmp_path / "s.jsonl.corrupt"
    assert corrupt.read_bytes() == b'{"type":"message","id":"b","pare\n'
    result = JsonlStore(path).load()
    assert result.problems == []
    assert [e["id"] for e in result.entries] == ["a", "c"]


def test_corrupt_side_file_is_appended_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    (tmp_path / "s.jsonl.corrupt").write_bytes(b"earlier")
    path.write_bytes(write_pi_line(HEADER) + b"{torn")
    with JsonlStore(path) as store:
        assert store.repair_torn_tail() == b"{torn"
        assert store.repair_torn_tail() == b""
    # A fragment kept before fragments ended in newlines is kept apart from the next one.
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == b"earlier\n{torn\n"


def test_torn_lines_of_two_crashes_stay_two_lines_in_the_corrupt_file(tmp_path: Path) -> None:
    """They were glued together (``{"a":"torn1{"b":"torn2``): nobody could tell them apart."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + b'{"a":"torn1')
    with JsonlStore(path) as store:
        store.append([entry("a")])
    path.write_bytes(path.read_bytes() + b'{"b":"torn2')
    with JsonlStore(path) as store:
        store.append([entry("b", "a")])
    corrupt = (tmp_path / "s.jsonl.corrupt").read_bytes()
    assert corrupt == b'{"a":"torn1\n{"b":"torn2\n'
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a", "b"]


def test_torn_header_leaves_an_empty_file_that_needs_a_header(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"type":"sess')
    with JsonlStore(path) as store:
        with pytest.raises(SessionError, match="must be the header"):
            store.append([entry("a")])
        store.append([HEADER])
    assert path.read_bytes() == write_pi_line(HEADER)
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == b'{"type":"sess\n'


def test_whole_last_line_without_newline_gets_one(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + write_pi_line(entry("a"))[:-1])
    with JsonlStore(path) as store:
        store.append([entry("b", "a")])
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a", "b"]
    assert not (tmp_path / "s.jsonl.corrupt").exists()


def _count_reads_back(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record every ``os.pread`` from now on (how a store reads a file's tail back)."""
    real_pread: Callable[[int, int, int], bytes] = os.pread
    reads: list[int] = []

    def counted(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", counted)
    return reads


def test_the_first_write_after_a_load_reads_nothing_back_while_the_file_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session opened and then compacted: the commit, in a worker thread, reads neither the
    tail nor the last line again (each read a wait for the interpreter's lock, issue 9)."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + write_pi_line(entry("a")))
    with JsonlStore(path) as store:
        loaded = store.load()
        store.open_writer()
        reads = _count_reads_back(monkeypatch)
        end = store.append([entry("b", "a")], expect=loaded.tail)
        assert reads == []
        # Later writes check the tail they build on, as always (D27).
        store.append([entry("c", "b")], expect=end)
        assert reads != []
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a", "b", "c"]


def test_a_change_after_the_load_is_still_caught_by_the_first_write(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + write_pi_line(entry("a")))
    # Another program appends after the load: the size differs.
    with JsonlStore(path) as store:
        loaded = store.load()
        store.open_writer()
        with path.open("ab") as other:
            other.write(write_pi_line(entry("x", "a")))
        with pytest.raises(ConflictError):
            store.append([entry("b", "a")], expect=loaded.tail)
    # Another program rewrites the last entry in place, same size: the modification time
    # differs, so the tail is read and the new last id refused.
    path.write_bytes(write_pi_line(HEADER) + write_pi_line(entry("a")))
    with JsonlStore(path) as store:
        loaded = store.load()
        store.open_writer()
        before = path.stat()
        with path.open("r+b") as other:
            other.write(write_pi_line(HEADER) + write_pi_line(entry("z")))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
        with pytest.raises(ConflictError, match="z"):
            store.append([entry("b", "a")], expect=loaded.tail)


TORN = b'{"type":"message","id":"b","pa'


@pytest.mark.parametrize(
    ("data", "moved"),
    [
        (write_pi_line(HEADER) + write_pi_line(entry("a"))[:-1], b""),
        (write_pi_line(HEADER) + write_pi_line(entry("a")) + TORN, TORN),
    ],
    ids=["newline missing", "torn line"],
)
def test_a_file_loaded_without_a_clean_end_is_repaired_by_the_first_conditional_write(
    tmp_path: Path, data: bytes, moved: bytes
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    with JsonlStore(path) as store:
        loaded = store.load()
        store.open_writer()
        store.append([entry("c", "a")], expect=loaded.tail)
    assert [e["id"] for e in JsonlStore(path).load().entries] == ["a", "c"]
    corrupt = tmp_path / "s.jsonl.corrupt"
    assert (corrupt.read_bytes() == moved + b"\n") if moved else not corrupt.exists()


def test_a_write_cut_short_is_repaired_before_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    real_write: Callable[[int, Any], int] = os.write
    with JsonlStore(path) as store:
        store.append([HEADER])

        def half_then_fail(fd: int, data: Any) -> int:
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError("disk full")

        monkeypatch.setattr(os, "write", half_then_fail)
        with pytest.raises(SessionError, match=r"s\.jsonl: cannot append to it: disk full$"):
            store.append([entry("a", text="x" * 50)])
        monkeypatch.setattr(os, "write", real_write)
        store.append([entry("b")])
    assert path.read_bytes() == write_pi_line(HEADER) + write_pi_line(entry("b"))
    half = write_pi_line(entry("a", text="x" * 50))
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == half[: len(half) // 2] + b"\n"


# -- migration and writing -------------------------------------------------------------------


def test_v1_file_must_be_rewritten_before_appending_and_then_keeps_its_ids(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    original = (DATA / "v1_session.jsonl").read_bytes()
    path.write_bytes(original)
    with JsonlStore(path) as store:
        result = store.load()
        assert result.migrated is True
        with pytest.raises(SessionError, match="version 1"):
            store.append([entry("z")])
        assert path.read_bytes() == original
        assert result.header is not None
        store.rewrite(result.header, result.entries)
        store.append([entry("z", result.entries[-1]["id"])])
    again = JsonlStore(path).load()
    assert again.migrated is False
    assert again.problems == []
    assert again.entries[:-1] == result.entries


def test_short_writes_still_append_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    real_write: Callable[[int, Any], int] = os.write

    def five_bytes_at_a_time(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data)[:5])

    monkeypatch.setattr(os, "write", five_bytes_at_a_time)
    with JsonlStore(path) as store:
        store.append([HEADER, entry("a")])
        store.rewrite(HEADER, [entry("b")])
        store.append([entry("c", "b")])
    assert path.read_bytes() == b"".join(
        write_pi_line(e) for e in [HEADER, entry("b"), entry("c", "b")]
    )


def test_failure_while_opening_the_writer_closes_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(write_pi_line(HEADER) + b"{torn")
    store = JsonlStore(path)

    def failing(fd: int) -> None:
        raise OSError("fsync failed")

    monkeypatch.setattr(os, "fsync", failing)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="fsync failed"):
        store.append([entry("a")])
    store.close()  # releases the lock; the session descriptor was already closed
    assert len(os.listdir("/proc/self/fd")) == before
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == b"{torn\n"  # copied first


def test_a_file_that_grows_while_it_is_loaded_is_read_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store parses a file as it reads it, a chunk at a time (issue 9): a line appended after
    the first read is read on and parsed, not lost, and the tail is the end of what was parsed.
    (Chunks of 64 KB here, for a small file in many chunks; a load reads 1 MB at a time.)"""
    from orchestrator._store import jsonl_io

    monkeypatch.setattr(jsonl_io, "LOAD_CHUNK", 1 << 16)
    path = tmp_path / "s.jsonl"
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"}
    lines = [json.dumps(header)] + [
        json.dumps({"type": "x", "id": f"e{k}", "parentId": None, "pad": "p" * 5000})
        for k in range(300)
    ]
    path.write_text("\n".join(lines) + "\n")
    late = json.dumps({"type": "x", "id": "late", "parentId": "e299"}) + "\n"
    real_read, reads = os.read, []

    def read_then_append(fd: int, size: int) -> bytes:
        chunk = real_read(fd, size)
        reads.append(len(chunk))
        if len(reads) == 1:
            with path.open("a") as out:
                out.write(late)
        return chunk

    monkeypatch.setattr(os, "read", read_then_append)
    result = JsonlStore(path).load()
    monkeypatch.undo()
    assert len(reads) > 20  # in chunks, never the whole file
    assert max(reads) <= 1 << 16
    assert [entry["id"] for entry in result.entries] == [f"e{k}" for k in range(300)] + ["late"]
    assert result.tail == Tail(last_id="late", length=path.stat().st_size)
    assert not result.problems


def test_a_load_reads_its_file_a_megabyte_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read lets go of the interpreter lock and takes it straight back: a read every 64 KB
    # starved a server's event loop for up to 170 ms while a big session loaded in a worker
    # thread (issue 35). Few reads, each of a megabyte, leave it its turns.
    from orchestrator._store import jsonl_io

    line = {"type": "message", "id": "", "parentId": None, "message": {"role": "user"}}
    lines = [write_pi_line({"type": "session", "version": 3, "id": "s", "cwd": "/"})]
    previous = None
    for n in range(6000):
        entry = {**line, "id": f"e{n}", "parentId": previous, "note": "x" * 500}
        lines.append(write_pi_line(entry))
        previous = f"e{n}"
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(lines))
    sizes: list[int] = []
    real_read = os.read

    def read(fd: int, length: int) -> bytes:
        sizes.append(length)
        return real_read(fd, length)

    monkeypatch.setattr(os, "read", read)
    with JsonlStore(path) as store:
        assert len(store.load().entries) == 6000
    monkeypatch.undo()
    sizes = [length for length in sizes if length > 1]  # (a one-byte look at the file's end)
    size = path.stat().st_size
    assert size > 3 * jsonl_io.LOAD_CHUNK
    assert jsonl_io.LOAD_CHUNK >= 1 << 20
    assert max(sizes) == jsonl_io.LOAD_CHUNK
    assert len(sizes) <= size // jsonl_io.LOAD_CHUNK + 3
