"""Connecting to PostgreSQL and keeping its schema current (issue 10).

Only the database stores import this module, and only they import psycopg: the file-based
path never loads either (tests/test_imports.py).

**Migrations are plain SQL files** shipped in the package (``orchestrator/_store/sql/``), named
``NNNN_what.sql``. :func:`migrate` applies those not yet recorded in ``schema_version``, each in
its own transaction with its version row, under a transaction-scoped advisory lock, so two
processes starting at once apply each file exactly once. A process migrates a database (and
schema) once; later connections only compare the newest version. Tables live in the
connection's current schema, so a URL whose ``options`` set ``search_path`` (tests do) gets a
private set of tables.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from importlib import resources
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from orchestrator._core.errors import SessionError, StoreUnavailableError
from orchestrator._store.locations import is_database_url

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_CONNECT_TIMEOUT_S = 10

_migrated: set[tuple[str, str]] = set()
_migrated_lock = threading.Lock()


def redact(url: str) -> str:
    """The URL without its password, for messages and ``location``.

    libpq takes a password from the user part (``USER:PASSWORD@``) and from a ``password``
    parameter (``?password=...``); both are left out.
    """
    try:
        parts = urlsplit(url)
        query = _without_passwords(parts.query)
        if parts.password is None and query == parts.query:
            return url
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = f"{parts.username}@{host}" if parts.username else host
            if parts.port is not None:
                netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # a port that is not a number: keep only what follows the credentials
        scheme, _, rest = url.partition("://")
        rest, _, query = rest.rpartition("@")[2].partition("?")
        query = _without_passwords(query)
        return f"{scheme}://{rest}{'?' if query else ''}{query}"


def _without_passwords(query: str) -> str:
    """A URL's query without its ``password`` parameters (libpq decodes keys: so do we)."""
    kept = [item for item in query.split("&") if unquote(item.partition("=")[0]) != "password"]
    return "&".join(kept)


def _passwords(url: str) -> set[str]:
    """Every form a password may take in ``url``, as written and decoded, for :func:`scrub`."""
    _, _, rest = url.partition("://")
    authority, _, query = rest.partition("?")
    authority = authority.partition("/")[0]
    found = set()
    # libpq ends the user part at the first "@", Python's urlsplit at the last: take both.
    for userinfo in (authority.partition("@")[0], authority.rpartition("@")[0]):
        user, colon, password = userinfo.partition(":")
        if colon:
            found.add(password)
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if unquote(key) == "password":
            found.add(value)
    return {form for raw in found for form in (raw, unquote(raw)) if form}


def scrub(url: str, text: str) -> str:
    """``text`` (a libpq message about ``url``) without the URL's password.

    libpq quotes what it could not parse: the whole URL (``in URI: "postgresql://u:pw@[..."``)
    or the token (``invalid percent-encoded token: "pw%zz"``). The URL is shown redacted and a
    quoted password as ``"***"``.
    """
    text = text.replace(url, redact(url))
    for password in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(f'"{password}"', '"***"')
    return text


def check_url(url: str) -> None:
    """Refuse a location that is not a well-formed PostgreSQL URL, before connecting.

    Raises:
        SessionError: Not a ``postgresql://`` URL, or libpq cannot parse it.
    """
    if not is_database_url(url):
        raise SessionError(f"{url!r} is not a PostgreSQL URL (postgresql://USER@HOST/DATABASE)")
    try:
        conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise SessionError(
            f"{redact(url)}: not a valid PostgreSQL URL: {scrub(url, first_line(exc))}"
        ) from exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libpq's messages run over several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connection_info(url: str) -> str:
    """``url`` with our defaults for what it does not say: a connect timeout, our name.

    Raises:
        SessionError: The URL is not a well-formed PostgreSQL URL.
    """
    check_url(url)
    options: dict[str, str | int] = {}
    given = conninfo_to_dict(url)
    if "connect_timeout" not in given:
        options["connect_timeout"] = _CONNECT_TIMEOUT_S
    if "application_name" not in given:
        options["application_name"] = "orchestrator"
    return make_conninfo(url, **options)


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """Open an autocommit connection and make sure the schema is current.

    Raises:
        SessionError: The URL is bad.
        StoreUnavailableError: The server cannot be reached, or the login is refused.
    """
    try:
        conn = psycopg.connect(connection_info(url), autocommit=True)
    except psycopg.Error as exc:
        raise StoreUnavailableError(
            f"{redact(url)}: cannot connect: {scrub(url, first_line(exc))}"
        ) from exc
    try:
        ensure_schema(conn, url)
    except BaseException:
        conn.close()
        raise
    return conn


def current_schema(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    """The schema unqualified table names resolve to on this connection."""
    row = conn.execute("SELECT current_schema()").fetchone()
    if row is None or not isinstance(row[0], str):
        raise SessionError("the connection has no current schema (check search_path)")
    return row[0]


def advisory_key(schema: str, name: str) -> int:
    """A 64-bit advisory lock key for ``name`` within ``schema`` (signed, as PostgreSQL wants)."""
    digest = hashlib.blake2b(f"{schema}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True, slots=True)
class Migration:
    """One shipped SQL file."""

    version: int
    name: str
    text: str


def migrations() -> list[Migration]:
    """The shipped migrations, oldest first."""
    found = []
    for item in resources.files("orchestrator._store").joinpath("sql").iterdir():
        match = _MIGRATION_NAME.match(item.name)
        if match:
            found.append(Migration(int(match.group(1)), item.name, item.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def ensure_schema(conn: psycopg.Connection[tuple[object, ...]], url: str) -> None:
    """Apply missing migrations once per process, database and schema.

    Raises:
        SessionError: A migration failed, or the database is newer than this program.
    """
    schema = current_schema(conn)
    key = (url, schema)
    if key in _migrated:
        return
    with _migrated_lock:
        if key not in _migrated:
            try:
                migrate(conn)
            except psycopg.Error as exc:
                raise SessionError(
                    f"{redact(url)}: cannot prepare the schema {schema!r}: {first_line(exc)}"
                ) from exc
            _migrated.add(key)


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """Apply every shipped migration the schema lacks; returns the versions applied.

    Raises:
        SessionError: The schema was migrated by a newer program (versions this one lacks).
        psycopg.Error: A migration failed (its transaction is rolled back).
    """
    schema = current_schema(conn)
    shipped = migrations()
    stored = _stored_version(conn, schema)
    if stored is not None and stored >= shipped[-1].version:
        # Current (or newer, refused): nothing to create, so a role that may only read the
        # tables, or a read-only connection (a standby), can use them.
        _refuse_newer(schema, stored, shipped)
        return []
    applied: list[int] = []
    for migration in shipped:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(schema, "migrate"),))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version integer PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {int(str(row[0])) for row in conn.execute("SELECT version FROM schema_version")}
            _refuse_newer(schema, max(done, default=0), shipped)
            if migration.version in done:
                continue
            conn.execute(sql.SQL(migration.text))
            conn.execute(
                "INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
    return applied


def _stored_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int | None:
    """The newest migration recorded in ``schema``, read only; ``None`` before the first."""
    table = sql.Identifier(schema, "schema_version")
    found = conn.execute(
        sql.SQL("SELECT to_regclass({})").format(sql.Literal(table.as_string(conn)))
    ).fetchone()
    if found is None or found[0] is None:
        return None
    row = conn.execute(sql.SQL("SELECT max(version) FROM {}").format(table)).fetchone()
    return None if row is None or row[0] is None else int(str(row[0]))


def _refuse_newer(schema: str, newest: int, shipped: list[Migration]) -> None:
    if newest > shipped[-1].version:
        raise SessionError(
            f"schema {schema!r} is at version {newest}, newer than this program's "
            f"{shipped[-1].version}; upgrade session-orchestrator"
        )


def host_name() -> str:
    """This machine's name, for the owner row a refused process reads."""
    return os.uname().nodename
