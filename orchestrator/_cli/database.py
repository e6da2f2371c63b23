"""The ``import`` and ``export`` commands: a session between a pi file and PostgreSQL (issue 10).

``orchestrator import FILE --database URL`` stores every line of a pi session file as written,
under the id its header names; ``orchestrator export SESSION_ID --database URL [-o FILE]`` gives
the same bytes back, so a round trip is byte-identical for any file that ends in whole lines.
Unknown entry types and fields travel untouched (D2), and so do damaged lines, which the
database store reports on load as the file would (D3). What the database cannot hold (a torn
last line, invalid UTF-8, NUL bytes) is refused with the line number, and nothing is written.
The journal beside a file is not moved.

The inspection commands (``context``, ``tree``, ``check``, ``journal``) read a stored session
through :func:`reading` and :func:`stored_journal` when given ``--database URL``. This module
imports the database store (and psycopg) only when a command is given a database.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator._cli.common import (
    UsageError,
    open_existing,
    require_database_driver,
    require_file,
    warn_problems,
)
from orchestrator._core.errors import SessionError
from orchestrator._core.printable import printable
from orchestrator._store.factory import is_database_url
from orchestrator._store.files import os_failure, side_file_name
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session

if TYPE_CHECKING:
    # Annotations only: the journal module loads the machine tables.
    from orchestrator._store.journal import Journal


def register(commands: Any) -> None:
    """Add the ``import`` and ``export`` commands to the parser."""
    importer = commands.add_parser(
        "import", help="store a pi session file in a PostgreSQL database"
    )
    importer.add_argument("file", help="the session file (pi JSONL)")
    _database_argument(importer)
    importer.set_defaults(handler=_import)
    exporter = commands.add_parser(
        "export", help="write a session from a PostgreSQL database as a pi session file"
    )
    exporter.add_argument("session_id", metavar="SESSION_ID", help="the session's id")
    _database_argument(exporter)
    exporter.add_argument(
        "-o",
        "--out",
        metavar="FILE",
        help="write to this new file (refused if it exists) instead of standard output",
    )
    exporter.set_defaults(handler=_export)


def _database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        required=True,
        metavar="URL",
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    )


def _check_url(url: str) -> None:
    if not is_database_url(url):
        raise UsageError(
            f"--database {url!r} is not a PostgreSQL URL (postgresql://USER@HOST/DATABASE)"
        )
    require_database_driver()
    from orchestrator._store.postgres_schema import check_url

    try:
        check_url(url)
    except SessionError as exc:
        raise UsageError(f"--database: {exc}") from exc


def _import(args: argparse.Namespace) -> int:
    _check_url(args.database)
    path = str(args.file)
    require_file(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise os_failure(path, "read it", exc) from exc
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(args.database) as store:
        # Named as the command, so a refusal (or a row a killed import left) says what held it.
        store.own("orchestrator import")
        end = store.import_bytes(data, source=path)
        lines = data.count(b"\n")
        print(
            f"imported session {printable(store.session_id or '')} from {path} "
            f"({lines} lines, {end.length} bytes) into {store.location.partition('#')[0]}"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    _check_url(args.database)
    from orchestrator._store.postgres import PostgresStore

    with PostgresStore(args.database, args.session_id) as store:
        data = store.export_bytes()
    if args.out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    if not args.out:
        raise UsageError("-o: an empty path names no file")
    _write_new_file(Path(args.out), data)
    print(f"exported session {args.session_id} to {args.out} ({len(data)} bytes)")
    return 0


def _write_new_file(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target``, which must not exist: whole or not at all.

    Raises:
        SessionError: ``target`` exists, is named as a session's side file, or its folder
            cannot be written.
    """
    if target.is_dir():
        raise SessionError(f"{target}: is a folder; -o names the file to write")
    if target.exists() or target.is_symlink():
        raise SessionError(f"{target}: already exists; not overwritten")
    if side_file_name(target):
        # As for a fork: s.jsonl.lock would be taken for s.jsonl's lock, written over, deleted.
        raise SessionError(
            f"{target}: a new session cannot take a side file's name (.lock, .journal, "
            ".corrupt, or a rewrite's .NAME.tmp): another session's would be written over it"
        )
    temporary = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise os_failure(target, "write it", exc) from exc
    try:
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        # link, not rename: refuses a file that appeared meanwhile instead of replacing it.
        os.link(temporary, target)
    except FileExistsError:
        raise SessionError(f"{target}: already exists; not overwritten") from None
    except OSError as exc:
        raise os_failure(target, "write it", exc) from exc
    finally:
        temporary.unlink(missing_ok=True)


# -- inspecting a stored session ---------------------------------------------------------------


def add_database_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--database URL`` to an inspection command: SESSION is then a session id."""
    parser.add_argument(
        "--database",
        metavar="URL",
        help="read the session from this PostgreSQL database; SESSION is then its id",
    )


@contextmanager
def reading(args: argparse.Namespace, *, warn: bool = True) -> Iterator[Session]:
    """The session an inspection command reads: ``args.session`` as a file, or as an id.

    A reader: it never owns, settles or writes (D27). With ``--database`` the store's
    connection is closed on leaving; without it psycopg is never imported.

    Raises:
        SessionError: no such file, or no such session in the database.
        UsageError: ``--database`` is not a PostgreSQL URL.
    """
    if getattr(args, "database", None) is None:
        yield open_existing(args.session, warn=warn)
        return
    store = _stored(args)
    try:
        session = Session.from_store(store)
        if warn:
            warn_problems(store.location, session)
        yield session
    finally:
        store.close()


def _stored(args: argparse.Namespace) -> SessionStore:
    _check_url(args.database)
    from orchestrator._store.factory import open_database_store

    store = open_database_store(args.database, args.session)
    try:
        if not store.exists():
            # Opening would start a new, empty session under that id: name the mistake instead.
            raise SessionError(f"{store.location}: no such session in the database")
    except BaseException:
        store.close()
        raise
    return store


def stored_journal(args: argparse.Namespace) -> Journal:
    """The lifecycle journal of ``args.session`` in ``args.database`` (which must hold it).

    Raises:
        SessionError: no such session in the database.
    """
    _stored(args).close()
    from orchestrator._store.factory import open_journal

    return open_journal(args.database, args.session)
