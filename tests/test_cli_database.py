"""``orchestrator import`` and ``export``: pi files in and out of PostgreSQL (issue 10)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_kit import EXAMPLE, run

DATA = Path(__file__).parent / "data"
SESSIONS = sorted(DATA.rglob("*.jsonl"))


def _session_id(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0]
    return str(json.loads(first)["id"])


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.relative_to(DATA).as_posix())
def test_import_then_export_gives_the_same_bytes(
    capsys: pytest.CaptureFixture[str], pg_url: str, path: Path, tmp_path: Path
) -> None:
    session_id = _session_id(path)
    code, out, err = run(capsys, "import", str(path), "--database", pg_url)
    assert (code, err) == (0, "")
    assert f"imported session {session_id} from {path}" in out
    assert "orchestrator:orchestrator@" not in out  # no password in what is printed
    target = tmp_path / "back.jsonl"
    code, out, err = run(capsys, "export", session_id, "--database", pg_url, "-o", str(target))
    assert (code, err) == (0, "")
    assert target.read_bytes() == path.read_bytes()
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left behind


def test_export_to_standard_output(capsysbinary: pytest.CaptureFixture[bytes], pg_url: str) -> None:
    from orchestrator._cli.main import main

    assert main(["import", str(EXAMPLE), "--database", pg_url]) == 0
    capsysbinary.readouterr()
    assert main(["export", _session_id(EXAMPLE), "--database", pg_url]) == 0
    assert capsysbinary.readouterr().out == EXAMPLE.read_bytes()


def test_importing_an_existing_session_is_refused(
    capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    code, out, err = run(capsys, "import", str(EXAMPLE), "--database", pg_url)
    assert (code, out) == (1, "")
    assert err.startswith("orchestrator import: ")
    assert "already exists" in err
    assert err.count("\n") == 1


def test_a_session_id_is_printed_escaped(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    # The id comes from the file: a newline and an escape sequence in it were printed as they
    # were, splitting the report and driving the terminal.
    source = tmp_path / "odd.jsonl"
    header = {"type": "session", "version": 3, "id": "odd\n\x1b[31mred", "cwd": "/w"}
    source.write_text(json.dumps(header) + "\n")
    code, out, err = run(capsys, "import", str(source), "--database", pg_url)
    assert (code, err) == (0, "")
    assert out.startswith("imported session odd\\n\\x1b[31mred from ")
    assert out.count("\n") == 1
    code, out, err = run(capsys, "import", str(source), "--database", pg_url)
    assert (code, out) == (1, "")
    assert "#odd\\n\\x1b[31mred: the session already exists" in err
    assert "\x1b" not in err
    code, out, err = run(capsys, "export", "odd\n\x1b[31mred", "--database", pg_url)
    assert (code, err) == (0, "")
    assert out == source.read_text()


def test_exporting_an_unknown_session_is_refused(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    target = tmp_path / "out.jsonl"
    code, out, err = run(capsys, "export", "no-such-id", "--database", pg_url, "-o", str(target))
    assert (code, out) == (1, "")
    assert "no-such-id: no such session in the database" in err
    assert err.count("\n") == 1
    assert not target.exists()


def test_export_never_overwrites_a_file(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    target = tmp_path / "taken.jsonl"
    target.write_bytes(b"mine\n")
    code, _, err = run(
        capsys, "export", _session_id(EXAMPLE), "--database", pg_url, "-o", str(target)
    )
    assert code == 1
    assert f"{target}: already exists; not overwritten" in err
    assert target.read_bytes() == b"mine\n"
    code, _, err = run(
        capsys, "export", _session_id(EXAMPLE), "--database", pg_url, "-o", str(tmp_path / "no/x")
    )
    assert code == 1
    assert "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.jsonl"]


@pytest.mark.parametrize("name", ["s.jsonl.lock", "s.jsonl.journal", "s.jsonl.corrupt"])
def test_export_refuses_a_side_file_name_as_a_fork_does(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path, name: str
) -> None:
    # Exported to s.jsonl.lock, the session was taken for s.jsonl's lock by its next owner:
    # written over, then deleted.
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    target = tmp_path / name
    code, out, err = run(
        capsys, "export", _session_id(EXAMPLE), "--database", pg_url, "-o", str(target)
    )
    assert (code, out) == (1, "")
    assert f"{target}: a new session cannot take a side file's name" in err
    assert list(tmp_path.iterdir()) == []


def test_export_to_a_folder_or_an_empty_path_says_so(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    code, out, err = run(
        capsys, "export", _session_id(EXAMPLE), "--database", pg_url, "-o", str(tmp_path)
    )
    assert (code, out) == (1, "")
    assert f"{tmp_path}: is a folder; -o names the file to write" in err  # not "already exists"
    with pytest.raises(SystemExit) as exited:
        run(capsys, "export", _session_id(EXAMPLE), "--database", pg_url, "-o", "")
    assert exited.value.code == 2
    assert "-o: an empty path names no file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_import_refuses_damage_it_cannot_keep_naming_the_line(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(EXAMPLE.read_bytes() + b'{"type":"message","id":"zz"')
    code, out, err = run(capsys, "import", str(torn), "--database", pg_url)
    assert (code, out) == (1, "")
    assert f"{torn}: line 45: the last line does not end in a newline" in err
    code, out, err = run(capsys, "export", _session_id(EXAMPLE), "--database", pg_url)
    assert code == 1  # nothing was imported


def test_import_keeps_damaged_lines_it_can_hold(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    # A line that is not JSON is still text: it is stored, reported on load, and exported back.
    damaged = tmp_path / "damaged.jsonl"
    lines = EXAMPLE.read_bytes().split(b"\n")
    data = b"\n".join([*lines[:3], b"{not json", *lines[3:]])
    damaged.write_bytes(data)
    assert run(capsys, "import", str(damaged), "--database", pg_url)[0] == 0
    back = tmp_path / "back.jsonl"
    args = ("--database", pg_url, "-o", str(back))
    assert run(capsys, "export", _session_id(EXAMPLE), *args)[0] == 0
    assert back.read_bytes() == data


def test_import_of_something_that_is_not_a_session(
    capsys: pytest.CaptureFixture[str], pg_url: str, tmp_path: Path
) -> None:
    other = tmp_path / "notes.jsonl"
    other.write_text('{"hello": "world"}\n')
    code, _, err = run(capsys, "import", str(other), "--database", pg_url)
    assert code == 1
    assert f"{other}: not a session file" in err
    code, _, err = run(capsys, "import", str(tmp_path / "missing.jsonl"), "--database", pg_url)
    assert code == 1
    assert "no such session file" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["import", str(EXAMPLE), "--database", "/tmp/x.db"], "is not a PostgreSQL URL"),
        (["export", "s", "--database", "mysql://h/db"], "is not a PostgreSQL URL"),
        (["export", "s", "--database", "postgresql://h/db?bogus=1"], "not a valid PostgreSQL URL"),
        (["export", "s"], "--database"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(capsys, *argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://someone:hunter2@127.0.0.1:1/db"
    code, out, err = run(capsys, "export", "s", "--database", url)
    assert (code, out) == (1, "")
    assert err.startswith("orchestrator export: postgresql://someone@127.0.0.1:1/db: ")
    assert "cannot connect" in err
    assert "hunter2" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # libpq takes a password from a parameter too; it was printed as given.
        ("postgresql://me@127.0.0.1:1/db?password=hunter2", "postgresql://me@127.0.0.1:1/db: "),
        (
            "postgresql://me@127.0.0.1:1/db?sslmode=disable&pass%77ord=hunter2",
            "127.0.0.1:1/db?sslmode=disable: ",
        ),
        # libpq quotes what it cannot parse: the token, or the whole URL, password and all.
        ("postgresql://me:hun%zzter2@h/db", 'invalid percent-encoded token: "***"'),
        ("postgresql://me@h/db?password=hun%zzter2", 'invalid percent-encoded token: "***"'),
        ("postgresql://me:hunter2@[::1/db", 'in URI: "postgresql://[::1/db"'),
    ],
)
def test_a_password_is_never_printed_wherever_the_url_holds_it(
    capsys: pytest.CaptureFixture[str], url: str, shown: str
) -> None:
    from orchestrator._cli.main import main

    try:
        code = main(["export", "s", "--database", url])
    except SystemExit as exc:  # a URL libpq cannot parse is a usage error
        code = int(str(exc.code))
    out, err = capsys.readouterr()
    assert (code, out) == (1 if "127.0.0.1" in url else 2, "")
    assert shown in err
    assert "hunter2" not in err
    assert "hun%zzter2" not in err


def test_an_import_holds_its_session_under_its_commands_name(
    capsys: pytest.CaptureFixture[str], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 36: what a refusal names, and what a killed import leaves, is the command.
    import psycopg

    from orchestrator._store import postgres, postgres_lines

    seen: list[list[tuple[str, str]]] = []
    row_of = postgres_lines.line_row  # looked up in postgres, where the COPY is

    def row_and_look(session_id: str, seq: int, line: bytes) -> Any:
        if seq == 1:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                seen.append(
                    [
                        (str(a), str(b))
                        for a, b in admin.execute("SELECT session_id, owner FROM session_owners")
                    ]
                )
        return row_of(session_id, seq, line)

    monkeypatch.setattr(postgres, "line_row", row_and_look)
    assert run(capsys, "import", str(EXAMPLE), "--database", pg_url)[0] == 0
    assert seen == [[(_session_id(EXAMPLE), "orchestrator import")]]
