"""``orchestrator import`` and ``export`` given what a hostile user gives them (issue 10).

Whatever is refused leaves the database exactly as it was (every table's rows compared), and
two imports of one file at once store one session, each line once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator._cli.main import main
from tests.cli_kit import EXAMPLE, run

pytest.importorskip("psycopg", reason="the database store needs the 'cluster' extra")

HEADER = b'{"type":"session","version":3,"id":"s-1","timestamp":"t","cwd":"/"}\n'
ENTRY = b'{"type":"custom","id":"a","parentId":null,"timestamp":"t","customType":"x"}\n'


def snapshot(pg_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the store's tables (the schema's version table aside)."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()  # noqa: S608
            for table in ("sessions", "session_lines", "journal_lines", "session_owners")
        }


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", "not a session file"),
        (b"", "not a session file (no session header)"),
        (HEADER + ENTRY[:-1], "line 2: the last line does not end in a newline"),
        (HEADER + ENTRY.replace(b'"x"', b'"x\x00"'), "line 2: holds a NUL byte"),
        (HEADER + ENTRY.replace(b'"x"', b'"\xff"'), "line 2: not valid UTF-8"),
        (HEADER.replace(b'"s-1"', b'"s\\u0000"'), "line 1: the id 's\\x00' holds a NUL"),
        (HEADER.replace(b'"s-1"', b'""'), "line 1: the session id is empty"),
    ],
    ids=["binary", "empty", "torn", "nul", "utf8", "nul-id", "empty-id"],
)
def test_a_file_that_cannot_be_imported_leaves_the_database_as_it_was(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path, data: bytes, reason: str
) -> None:
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    before = snapshot(pg_url)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(data)
    code, out, err = run(capsys, "import", str(bad), "--database", pg_url)
    assert (code, out) == (1, "")
    assert err.startswith(f"orchestrator import: {bad}: ")
    assert reason in err
    assert err.count("\n") == 1
    assert snapshot(pg_url) == before


def test_exporting_an_unknown_session_changes_nothing(
    capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    before = snapshot(pg_url)
    code, out, err = run(capsys, "export", "no-such-id", "--database", pg_url)
    assert (code, out) == (1, "")
    assert err.endswith("#no-such-id: no such session in the database\n")
    assert snapshot(pg_url) == before


def test_two_imports_of_one_file_at_once_store_one_session(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator._store.postgres import PostgresStore

    assert main(["export", "nothing-yet", "--database", pg_url]) == 1  # the schema exists
    capsys.readouterr()
    # Both importers find no session before either writes: the race the store must settle.
    both_looked = threading.Barrier(2)
    looked = PostgresStore.exists

    def exists(self: PostgresStore) -> bool:
        found = looked(self)
        both_looked.wait()
        return found

    monkeypatch.setattr(PostgresStore, "exists", exists)
    codes: list[int] = []
    importers = [
        threading.Thread(
            target=lambda: codes.append(main(["import", str(EXAMPLE), "--database", pg_url]))
        )
        for _ in range(2)
    ]
    for importer in importers:
        importer.start()
    for importer in importers:
        importer.join()
    assert sorted(codes) == [0, 1]
    # The other: the first holds it (named by its owner row once that row is written, "another
    # process" before), or it is already there.
    err = capsys.readouterr().err
    assert err.startswith("orchestrator import: ")
    assert "session is being changed by " in err or "already exists" in err
    assert err.count("\n") == 1
    rows = snapshot(pg_url)
    assert len(rows["sessions"]) == 1
    lines = [row[2] for row in rows["session_lines"]]
    assert "\n".join(lines) + "\n" == EXAMPLE.read_text(encoding="utf-8")
