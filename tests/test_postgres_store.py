"""The PostgreSQL store beyond the shared contract: import/export, migrations, the journal,
ownership across a killed process, lock-free conditional appenders, and clear errors (issue 10).

Needs ``ORCHESTRATOR_TEST_DATABASE`` (tests/services.py); each test has its own schema.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.errors import ConflictError, SessionError, SessionLockedError
from orchestrator._lifecycle.machine import Step
from orchestrator._store.factory import is_database_url, open_journal, open_store
from orchestrator._store.jsonl import JsonlStore, write_pi_line
from orchestrator._store.session import Session

DATA = Path(__file__).parent / "data"
SESSIONS = sorted(DATA.rglob("*.jsonl"))
ROOT = Path(__file__).resolve().parent.parent


def _counter() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"{next(numbers):08x}"


def _header(session_id: str = "s-1") -> dict[str, Any]:
    return {"type": "session", "version": 3, "id": session_id, "timestamp": "t", "cwd": "/w"}


def _entry(entry_id: str, parent: str | None) -> dict[str, Any]:
    return {"type": "custom", "id": entry_id, "parentId": parent, "customType": "n"}


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.relative_to(DATA).as_posix())
def test_every_session_under_tests_data_round_trips_byte_for_byte(pg_url: str, path: Path) -> None:
    from orchestrator._store.postgres import PostgresStore

    data = path.read_bytes()
    # v1 files get their ids from migration at load: the same ids on both sides.
    with PostgresStore(pg_url, random_hex=_counter()) as store:
        end = store.import_bytes(data)
        session_id = store.session_id
    assert session_id is not None
    with PostgresStore(pg_url, session_id, random_hex=_counter()) as store:
        assert store.export_bytes() == data
        from_db = store.load()
    from_file = JsonlStore(path, random_hex=_counter()).load()
    assert from_db.header == from_file.header
    assert from_db.entries == from_file.entries
    assert from_db.problems == from_file.problems
    assert from_db.migrated == from_file.migrated
    assert from_db.tail == from_file.tail == end


def test_import_refuses_what_it_cannot_keep_and_writes_nothing(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    header = write_pi_line(_header())
    cases = {
        b'{"type":"message","id":"a"}\n': "not a session file",
        header + b'{"id":"a","t":"\xff"}\n': "line 2: not valid UTF-8",
        header + b'{"id":"a"}\x00\n': "line 2: holds a NUL byte",
        header + b'{"id":"a"}': "line 2: the last line does not end in a newline",
    }
    for data, message in cases.items():
        with PostgresStore(pg_url) as store, pytest.raises(SessionError, match=message):
            store.import_bytes(data)
    with PostgresStore(pg_url, "s-1") as store:
        assert not store.exists()


def test_import_refuses_an_existing_session_and_a_header_naming_another(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    data = write_pi_line(_header())
    with PostgresStore(pg_url) as store:
        store.import_bytes(data)
    with PostgresStore(pg_url) as store, pytest.raises(SessionError, match="already exists"):
        store.import_bytes(data + write_pi_line(_entry("a", None)))
    with PostgresStore(pg_url, "s-1") as store:
        assert store.export_bytes() == data
    with PostgresStore(pg_url, "other") as store, pytest.raises(SessionError, match="names"):
        store.import_bytes(data)


def test_export_of_an_unknown_session_is_refused(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url, "nope") as store, pytest.raises(SessionError, match="no such"):
        store.export_bytes()
    with PostgresStore(pg_url) as store, pytest.raises(SessionError, match="no session id"):
        store.export_bytes()


def test_a_session_built_through_session_lives_in_the_database(pg_url: str) -> None:
    store = open_store(pg_url)
    session = Session.from_store(store, owner="test", cwd="/w")
    session.append_message({"role": "user", "content": "hi", "timestamp": 1})
    assert not store.exists()  # pi writes nothing before the first assistant message
    reply = {"role": "assistant", "content": [{"type": "text", "text": "yo"}], "timestamp": 2}
    session.append_message(reply)
    session.append_entry("label", {"targetId": session.leaf_id, "label": "here"})
    session_id = session.session_id
    other = open_store(pg_url, session_id)
    with pytest.raises(SessionLockedError, match=r"pid \d+ on .* \(test\)"):
        other.own("another")
    session.close()
    reopened = Session.from_store(other, owner="another")
    assert [e["id"] for e in reopened.tree.entries] == [e["id"] for e in session.tree.entries]
    assert reopened.tree.labels == session.tree.labels
    reopened.close()


def test_a_header_naming_another_session_is_refused(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url, "mine") as store:
        with pytest.raises(SessionError, match="names session theirs"):
            store.append([_header("theirs")])
        with pytest.raises(SessionError, match="names session theirs"):
            store.rewrite(_header("theirs"), [])
        assert not store.exists()


@contextmanager
def owner_killed_after(pg_url: str, owning: str) -> Iterator[None]:
    """Run ``owning`` (a store taking ownership) in a child process; SIGKILL it after the block."""
    code = (
        "import sys, time\n"
        "from orchestrator._store.postgres import PostgresStore\n"
        f"{owning}"
        "print('owned', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "owned"
        yield
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_killed_owner_leaves_the_session_free(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url) as store:
        store.append([_header()])
    owning = "store = PostgresStore(sys.argv[1], 's-1')\nstore.own('doomed worker')\n"
    with owner_killed_after(pg_url, owning):
        with PostgresStore(pg_url, "s-1") as store:
            with pytest.raises(SessionLockedError, match="doomed worker"):
                store.own("survivor")
    # The server ends the dead client's connection, and with it the lock.
    survivor = PostgresStore(pg_url, "s-1")
    while True:
        try:
            survivor.own("survivor")
            break
        except SessionLockedError:
            time.sleep(0.05)
    survivor.append([_entry("a", None)], expect=survivor.tail())
    survivor.close()


def test_lock_free_conditional_appenders_never_lose_or_double_an_entry(pg_url: str) -> None:
    # Writers that skip the owner lock (lock=False) still cannot interleave: each append is a
    # transaction that checks the tail under the row lock, so a stale writer is refused.
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url) as store:
        store.append([_header()])
    workers, count = 4, 10
    refused = [0] * workers
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            with PostgresStore(pg_url, "s-1", lock=False) as store:
                done = 0
                while done < count:
                    loaded = store.load()
                    last = loaded.entries[-1]["id"] if loaded.entries else None
                    try:
                        store.append([_entry(f"w{worker}-{done}", last)], expect=loaded.tail)
                        done += 1
                    except ConflictError:
                        refused[worker] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with PostgresStore(pg_url, "s-1") as store:
        loaded = store.load()
    ids = [e["id"] for e in loaded.entries]
    assert len(ids) == len(set(ids)) == workers * count
    assert [e["parentId"] for e in loaded.entries] == [None, *ids[:-1]]
    assert loaded.problems == []


def test_migrations_apply_once_and_a_newer_schema_is_refused(pg_url: str) -> None:
    import psycopg

    from orchestrator._store.postgres_schema import migrate, migrations

    shipped = [m.version for m in migrations()]
    assert shipped == sorted(set(shipped))
    assert shipped[0] == 1
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert migrate(conn) == shipped
        assert migrate(conn) == []
        rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert [row[0] for row in rows] == shipped
        conn.execute("INSERT INTO schema_version (version, name) VALUES (9999, 'future')")
        with pytest.raises(SessionError, match="newer than this program"):
            migrate(conn)


def test_a_read_only_connection_reads_a_current_schema(pg_url: str) -> None:
    # Connecting made sure of the schema with CREATE TABLE IF NOT EXISTS, which a read-only
    # connection (a standby, or a role that may only read) is refused even when the table is
    # there: no reader could read. Now only a schema lacking migrations is written to.
    from orchestrator._store.postgres import PostgresStore

    data = write_pi_line(_header()) + write_pi_line(_entry("a", None))
    with PostgresStore(pg_url) as store:
        store.import_bytes(data)
    open_journal(pg_url, "s-1").record(
        Step(machine="turn", source="idle", event="prompt", dest="streaming", effects=())
    )
    reading = pg_url.replace("options=", "options=-cdefault_transaction_read_only%3Don%20")
    with PostgresStore(reading, "s-1") as reader:
        assert reader.export_bytes() == data
        assert [e["id"] for e in reader.load().entries] == ["a"]
    assert [r.dest for r in open_journal(reading, "s-1").records()] == ["streaming"]
    other = write_pi_line(_header("s-2"))
    with PostgresStore(reading) as writer, pytest.raises(SessionError, match="read-only"):
        writer.import_bytes(other)
    with PostgresStore(pg_url, "s-2") as store:
        assert not store.exists()


def test_the_journal_lives_in_the_same_database(pg_url: str) -> None:
    journal = open_journal(pg_url, "s-1")
    assert not journal.exists()
    journal.record(
        Step(machine="turn", source="idle", event="prompt", dest="streaming", effects=())
    )
    journal.record(
        Step(machine="operation", source="idle", event="start", dest="planning", effects=()),
        operation_id="op-1",
        kind="compaction",
        data={"entryId": "e1"},
    )
    again = open_journal(pg_url, "s-1")
    assert again.exists()
    records = again.records()
    assert [(r.machine, r.dest) for r in records] == [
        ("turn", "streaming"),
        ("operation", "planning"),
    ]
    [open_op] = again.open_operations()
    assert open_op.operation_id == "op-1"
    assert open_op.entry_id == "e1"
    assert open_journal(pg_url, "s-2").records() == ()
    with pytest.raises(ValueError, match="session id"):
        open_journal(pg_url)


def test_a_journal_written_without_waiting_is_made_durable_by_sync(pg_url: str) -> None:
    """The operation driver writes each step at once and syncs where settling needs it."""
    journal = open_journal(pg_url, "s-sync")
    step = Step(machine="operation", source="idle", event="start", dest="planning", effects=())
    journal.record(step, operation_id="op-1", kind="compaction", durable=False)
    journal.sync()
    journal.sync()  # nothing new: still fine
    assert [r.dest for r in open_journal(pg_url, "s-sync").records()] == ["planning"]


def test_the_factory_picks_the_store_by_location(tmp_path: Path) -> None:
    assert is_database_url("postgresql://u@h/db")
    assert is_database_url("postgres://h/db")
    assert not is_database_url(str(tmp_path / "s.jsonl"))
    assert isinstance(open_store(tmp_path / "s.jsonl"), JsonlStore)
    assert open_journal(tmp_path / "s.jsonl").location == str(tmp_path / "s.jsonl.journal")


def test_unreachable_servers_and_bad_urls_fail_in_one_line() -> None:
    pytest.importorskip("psycopg")
    from orchestrator._store.postgres import PostgresStore

    store = PostgresStore("postgresql://nobody:secret@127.0.0.1:1/db", "s")
    with pytest.raises(SessionError) as caught:
        store.tail()
    message = str(caught.value)
    assert "cannot connect" in message
    assert "\n" not in message
    assert "secret" not in message
    assert "nobody@127.0.0.1:1/db" in message
    with pytest.raises(SessionError, match="not a valid PostgreSQL URL"):
        PostgresStore("postgresql://h/db?nonsense=1", "s").tail()


def test_a_rewrite_by_another_writer_is_a_conflict_even_at_the_same_tail(pg_url: str) -> None:
    # Files compare the inode for this; a database row compares its rewrite count.
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url) as store:
        store.append([_header(), _entry("a", None)])
    planner = PostgresStore(pg_url, "s-1", lock=False)
    planned = planner.load().tail
    with PostgresStore(pg_url, "s-1") as other:
        assert other.rewrite(_header(), [_entry("a", None)]) == planned  # same end, new lines
    with pytest.raises(ConflictError, match=r"read \(another writer rewrote it\); nothing was"):
        planner.append([_entry("b", "a")], expect=planned)
    assert planner.tail() == planned  # a fresh read: the next plan starts from here
    planner.append([_entry("b", "a")], expect=planned)
    planner.close()


def test_a_journal_connection_that_broke_is_replaced_at_the_next_record(pg_url: str) -> None:
    import psycopg

    from orchestrator._store.postgres_journal import _shared_connection

    journal = open_journal(pg_url, "s-1")
    step = Step(machine="turn", source="idle", event="prompt", dest="streaming", effects=())
    journal.record(step)
    _, conn = _shared_connection(pg_url)
    pid = conn.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(SessionError, match="cannot write the journal") as caught:
        journal.record(step)
    assert "\n" not in str(caught.value)
    journal.record(step)  # a new connection
    assert len(journal.records()) == 2


def test_a_journal_whose_database_is_unreachable_fails_in_one_line() -> None:
    pytest.importorskip("psycopg")
    journal = open_journal("postgresql://u:pw@127.0.0.1:1/db", "s")
    with pytest.raises(SessionError, match="cannot connect") as caught:
        journal.exists()
    assert "pw" not in str(caught.value)


def _terminate(pg_url: str, store: Any) -> None:
    import psycopg

    pid = store._conn.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_connection_lost_during_an_import_is_one_error_and_stores_nothing(
    pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # psycopg also logged "error ignored terminating <psycopg.Copy [BAD]>: the connection is
    # lost" as a warning: a second line on the command line's stderr after the error itself.
    import psycopg

    from orchestrator._store import postgres, postgres_lines
    from orchestrator._store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    row_of = postgres_lines.line_row  # looked up in postgres, where the COPY is

    def row_then_terminate(session_id: str, seq: int, line: bytes) -> Any:
        if seq == 1:  # the COPY has started: end its connection, and wait until it is gone
            pid = store._conn.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                while admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone():
                    pass
        return row_of(session_id, seq, line)

    monkeypatch.setattr(postgres, "line_row", row_then_terminate)
    big = "y" * 65536  # rows past psycopg's copy buffer: a send meets the closed connection
    entries = [_entry(f"{n:08x}", None if n == 0 else f"{n - 1:08x}") for n in range(16)]
    data = write_pi_line(_header()) + b"".join(
        write_pi_line({**entry, "data": big}) for entry in entries
    )
    with caplog.at_level("WARNING"), pytest.raises(SessionError, match="cannot write it"):
        store.import_bytes(data)
    store.close()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    with PostgresStore(pg_url, "s-1") as reader:
        assert not reader.exists()


def test_an_owner_that_lost_its_connection_owns_again_or_is_refused(pg_url: str) -> None:
    from orchestrator._store.postgres import PostgresStore

    owner = PostgresStore(pg_url)
    owner.own("worker a")  # a new session: locked at its first write, under this name
    end = owner.append([_header()])
    _terminate(pg_url, owner)
    with pytest.raises(SessionError, match="cannot write it") as caught:
        owner.append([_entry("a", None)], expect=end)
    assert "\n" not in str(caught.value)
    # The next write reconnects and takes the lock again under the same name.
    end = owner.append([_entry("a", None)], expect=end)
    with PostgresStore(pg_url, "s-1") as other, pytest.raises(SessionLockedError, match="worker a"):
        other.own("worker b")
    # Lost again, and this time another store takes the session first: refused.
    _terminate(pg_url, owner)
    with pytest.raises(SessionError):
        owner.tail()
    taker = PostgresStore(pg_url, "s-1")
    taker.own("worker b")
    with pytest.raises(SessionLockedError, match="worker b"):
        owner.append([_entry("b", "a")], expect=end)
    taker.close()
    owner.close()
    with PostgresStore(pg_url, "s-1") as reader:
        assert [e["id"] for e in reader.load().entries] == ["a"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h:5433/db?x=1", "postgresql://u@h:5433/db?x=1"),
        ("postgresql://u:pw@[::1]/db", "postgresql://u@[::1]/db"),
        ("postgres://:pw@h/db", "postgres://h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://u:pw@h:port/db", "postgresql://h:port/db"),
        ("postgresql://u@h/db?password=pw&x=1", "postgresql://u@h/db?x=1"),
        ("postgresql://u:pw@h:port/db?password=pw", "postgresql://h:port/db"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    pytest.importorskip("psycopg")
    from orchestrator._store.postgres_schema import check_url, redact

    assert redact(url) == shown
    with pytest.raises(SessionError, match="is not a PostgreSQL URL"):
        check_url("/tmp/session.jsonl")


def test_a_v1_session_is_migrated_by_its_first_write(pg_url: str) -> None:
    # Imported as pi wrote it; like a file, the first write rewrites it as version 3.
    from orchestrator._store.postgres import PostgresStore

    source = DATA / "store" / "v1_session.jsonl"
    with PostgresStore(pg_url) as store:
        store.import_bytes(source.read_bytes())
        session_id = store.session_id
    assert session_id is not None
    session = Session.from_store(open_store(pg_url, session_id), owner="test")
    assert session.problems == []
    migrated_ids = [e["id"] for e in session.tree.entries]
    added = session.append_entry("custom", {"customType": "n"})
    session.close()
    with PostgresStore(pg_url, session_id) as store:
        assert store.has_entry(added["id"])
        assert not store.has_entry("nope")
        data = store.export_bytes()
        loaded = store.load()
    assert b'"version":3' in data.split(b"\n", 1)[0]
    assert not loaded.migrated
    assert [e["id"] for e in loaded.entries] == [*migrated_ids, added["id"]]
    assert loaded.tail == store.tail()


def test_a_fork_into_the_database_names_its_source(pg_url: str) -> None:
    from orchestrator._store.fork import branched_session

    with JsonlStore(DATA / "pi" / "branch.jsonl") as file_store:
        source = Session.from_store(file_store)
        leaf = source.leaf_id
        fork = branched_session(source, leaf, open_store(pg_url))
        fork.flush()
        fork.close()
    store = open_store(pg_url, fork.session_id)
    loaded = store.load()
    store.close()
    assert loaded.header is not None
    assert loaded.header["parentSession"] == str((DATA / "pi" / "branch.jsonl").resolve())
    assert [e["id"] for e in loaded.entries] == [e["id"] for e in source.path(leaf)]


def test_a_new_session_can_take_the_id_its_store_was_opened_with(pg_url: str) -> None:
    # A Temporal workflow's id is the session id: the store and the header must agree.
    session = Session.from_store(open_store(pg_url, "wf-7"), owner="worker", session_id="wf-7")
    session.append_message({"role": "user", "content": "hi", "timestamp": 1})
    session.append_message({"role": "assistant", "content": [], "timestamp": 2})
    session.close()
    assert session.session_id == "wf-7"
    again = Session.from_store(open_store(pg_url, "wf-7"), session_id="ignored-when-stored")
    assert again.session_id == "wf-7"
    assert len(again.tree.entries) == 2
    again.close()


def test_an_id_holding_nul_is_refused_writing_nothing(pg_url: str) -> None:
    # JSON escapes NUL, so lines keep it; ids and session ids are text columns, which cannot.
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(pg_url) as store:
        with pytest.raises(SessionError, match="holds a NUL character"):
            store.append([_header("s\x00")])
        end = store.append([_header()])
        with pytest.raises(SessionError, match="holds a NUL character"):
            store.append([_entry("a\x00", None)], expect=end)
        with pytest.raises(SessionError, match="holds a NUL character"):
            store.rewrite(_header(), [_entry("a\x00", None)], expect=end)
        assert not store.has_entry("a\x00")
        assert store.export_bytes() == write_pi_line(_header())
    data = write_pi_line(_header("s-2")) + write_pi_line(_entry("b\x00", None))
    with PostgresStore(pg_url) as store, pytest.raises(SessionError, match=r"f: line 2: the id"):
        store.import_bytes(data, source="f")
    with PostgresStore(pg_url, "s-2") as store:
        assert not store.exists()


def test_processes_starting_together_apply_each_migration_once(pg_url: str) -> None:
    import psycopg

    from orchestrator._store.postgres_schema import migrations

    code = (
        "import sys\n"
        "from orchestrator._store.postgres_schema import connect\n"
        "connect(sys.argv[1]).close()\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code, pg_url], cwd=ROOT) for _ in range(3)]
    assert [child.wait() for child in children] == [0, 0, 0]
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert [row[0] for row in rows] == [m.version for m in migrations()]


def test_opening_a_database_journal_fetches_only_what_follows_the_last_close(
    pg_url: str,
) -> None:
    # It fetched every row of the session's history at every opening, then cut it.
    import psycopg

    from orchestrator._store.journal_records import unsettled_part

    journal = open_journal(pg_url, "s-close")
    op = Step(machine="operation", source="preparing", event="e", dest="summarizing", effects=())
    close = Step(machine="turn", source="idle", event="close", dest="closed", effects=())
    for n in range(50):
        journal.record(op, operation_id=f"old-{n}", kind="compaction")
    journal.record(close)
    journal.record(op, operation_id="late", kind="compaction")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the mark's text, not a record
        conn.execute(
            "INSERT INTO journal_lines (session_id, line) VALUES (%s, %s)",
            ("s-close", '{"event":"close","to":"closed"}'),
        )
    journal.record(op, operation_id="later", kind="compaction")
    sink = journal._sink  # noqa: SLF001 - the sink's own reading is what is tested
    tail = sink.read_unsettled()  # type: ignore[attr-defined]
    assert tail == unsettled_part(sink.read())
    assert tail.count(b"\n") == 3
    assert [o.operation_id for o in open_journal(pg_url, "s-close").open_operations()] == [
        "late",
        "later",
    ]
    assert open_journal(pg_url, "s-none").open_operations() == ()


def _owner_rows(pg_url: str) -> list[tuple[str, str]]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT session_id, owner FROM session_owners ORDER BY 1").fetchall()
    return [(str(a), str(b)) for a, b in rows]


def test_a_killed_owners_row_is_cleared_by_the_next_owner(pg_url: str) -> None:
    # Issue 36: the lock goes with a killed owner's connection, its row in session_owners did not.
    from orchestrator._store.postgres import PostgresStore

    owning = (
        "from tests.test_postgres_store import _header\n"
        "store = PostgresStore(sys.argv[1])\n"
        "store.own('orchestrator import')\n"
        "store.append([_header('s-killed')])\n"
    )
    with owner_killed_after(pg_url, owning):
        assert _owner_rows(pg_url) == [("s-killed", "orchestrator import")]
    assert _owner_rows(pg_url) == [("s-killed", "orchestrator import")]  # left behind
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        # The server ends the killed client's connection when it notices; wait for that.
        while admin.execute(
            "SELECT 1 FROM pg_stat_activity a JOIN session_owners o ON a.pid = o.backend_pid"
        ).fetchone():
            time.sleep(0.05)
    with PostgresStore(pg_url) as store:
        store.own("next owner")
        store.append([_header("s-next")])
        assert _owner_rows(pg_url) == [("s-next", "next owner")]
    assert _owner_rows(pg_url) == []


def test_a_store_told_no_owner_is_named_after_the_running_command(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator._store.postgres import PostgresStore

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/my-runtime", "--flag"])
    with PostgresStore(pg_url) as store:
        store.append([_header("s-named")])
        assert _owner_rows(pg_url) == [("s-named", "my-runtime")]
    monkeypatch.setattr(sys, "argv", [""])
    with PostgresStore(pg_url, "s-named") as store:
        store.append([_entry("a", None)], expect=store.tail())
        assert _owner_rows(pg_url) == [("s-named", "python")]
