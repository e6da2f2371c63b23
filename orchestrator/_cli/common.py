"""Helpers shared by the command modules: opening sessions, checking arguments, printing."""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator._cli.pi_settings import Explicit, add_pi_settings_argument
from orchestrator._core.errors import SessionError
from orchestrator._core.load_result import Problem
from orchestrator._core.utf16 import escape_lone_surrogates
from orchestrator._store.files import require_session_file
from orchestrator._store.session import Session

if TYPE_CHECKING:
    # Only for the annotation: inspection commands must not import the runtime (issue 9).
    from orchestrator._runtime.types import RuntimeSettings


class UsageError(Exception):
    """A command's arguments do not make sense together; reported with its usage, exit 2."""


class MissingExtraError(Exception):
    """An optional extra a command needs is not installed: one line saying how to get it, exit 2.

    Not a usage error (the arguments were right, so no usage is printed), and not an
    :class:`~orchestrator._core.errors.OrchestratorError` (nobody's input was wrong).
    """


def one_line(text: str) -> str:
    """``text`` as one line: its non-blank lines, stripped, joined with ``"; "``.

    Errors are one line on stderr (README, "Commands"); a provider's message may span several
    (litellm's "LLM Provider NOT provided" is two), and a grep for the command's name must
    find all of it.
    """
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


RESERVE_TOKENS = 16384
"""``--reserve-tokens``'s default."""
KEEP_RECENT_TOKENS = 20000
"""``--keep-recent-tokens``'s default."""


def add_compaction_size_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--reserve-tokens``, ``--keep-recent-tokens`` and ``--pi-settings`` (compactions)."""
    parser.add_argument(
        "--reserve-tokens",
        type=positive_int,
        action=Explicit,
        default=RESERVE_TOKENS,
        metavar="N",
        help="tokens reserved for the reply: compaction threshold = window - reserve "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--keep-recent-tokens",
        type=positive_int,
        action=Explicit,
        default=KEEP_RECENT_TOKENS,
        metavar="N",
        help="recent tokens kept verbatim by a compaction (default: %(default)s)",
    )
    add_pi_settings_argument(parser)


def add_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--timeout``: how long a summary may take in all, each model call included."""
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="give up a compaction or branch summary after this long, retries included "
        "(default: 900 s; a streamed model call also fails after 60 s without a chunk)",
    )


def with_timeout(settings: RuntimeSettings, args: argparse.Namespace) -> RuntimeSettings:
    """``settings`` with ``--timeout`` as the operation's deadline.

    A model call's own limits (the idle timeout of a streamed one, the total of one answered in
    one piece) stay as they are, unless longer than the deadline: they are cut to it, as a
    call cannot outlast its operation anyway.
    """
    seconds = getattr(args, "timeout", None)
    if seconds is None:
        return settings
    return dataclasses.replace(
        settings,
        model_idle_timeout_s=_at_most(settings.model_idle_timeout_s, seconds),
        model_timeout_s=_at_most(settings.model_timeout_s, seconds),
        operation_deadline_s=seconds,
    )


def _at_most(limit: float | None, seconds: float) -> float:
    return seconds if limit is None else min(limit, seconds)


def positive_float(text: str) -> float:
    """An argparse type: a number of seconds greater than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def integer(text: str) -> int:
    """``text`` as an integer, for an ``argparse`` type.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not an integer.
    """
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """An ``argparse`` type for token counts and windows: an integer of at least 1.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a positive integer.
    """
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of tokens")
    return value


def http_url(text: str) -> str:
    """An ``argparse`` type for ``--remote``: an ``http://`` or ``https://`` URL with a host.

    An empty value would fall back to the offline summarizer without a word, and anything else
    failed later with the bare value as its whole message.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not such a URL.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        host = parts.hostname
    except ValueError:  # an unbalanced [ in the host, a port that is not a number
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    return text


def check_reserve(
    context_window: int | None, reserve_tokens: int, name: str = "--reserve-tokens"
) -> None:
    """Refuse a reserve that leaves no room in the window (the threshold would be <= 0).

    ``name`` is where the reserve came from (``compaction.reserveTokens`` of ``--pi-settings``).

    Raises:
        UsageError: ``reserve_tokens`` is not below ``context_window``.
    """
    if context_window and reserve_tokens >= context_window:
        raise UsageError(
            f"{name} {reserve_tokens} must be smaller than --context-window {context_window}"
        )


def require_file(path: str) -> None:
    """Refuse a path that is not an existing file (opening would create a new session).

    Raises:
        SessionError: the path does not exist, or is a directory or another non-regular file.
    """
    require_session_file(Path(path), path)


def warn_problems(path: str, session: Session) -> None:
    """Report what loading found wrong (D3), one line each on stderr."""
    warn_of(path, session.problems)


def warn_of(path: str, problems: Sequence[Problem]) -> None:
    """Report ``problems`` of the file at ``path`` (D3), one line each on stderr."""
    for problem in problems:
        print(f"warning: {path}: {problem}", file=sys.stderr)


def open_existing(path: str, *, warn: bool = True) -> Session:
    """Open a session file that must exist, reporting load problems on stderr (D3).

    Raises:
        SessionError: the file does not exist or is not a session.
    """
    require_file(path)
    session = Session.open(Path(path))
    if warn:
        warn_problems(path, session)
    return session


def check_leaf(session: Session, leaf: str | None) -> str | None:
    """Validate a ``--leaf`` argument; ``None`` means the active leaf.

    Raises:
        SessionError: ``Entry <id> not found``.
    """
    if leaf is not None:
        session.tree.get(leaf)
        return leaf
    return session.leaf_id


_KEPT: list[object] = []
"""What a short command read, held until its process exits (see :func:`keep_until_exit`)."""


def keep_until_exit(*values: object) -> None:
    """Hold what an inspection command read until the process exits.

    The console script then ends the process once its output is flushed and the exit functions
    have run, without the interpreter freeing every object first: freeing a session's entries
    one by one took 76 to 80 ms at 60,000 entries, an eighth of ``plan --json``, for memory the
    kernel takes back at once. :func:`~orchestrator._cli.main.main` lets go of what an earlier
    call held (a program or a test calling it again).
    """
    _KEPT.extend(values)


def kept() -> bool:
    """Whether a command asked for its objects to be held until the process exits."""
    return bool(_KEPT)


def release_kept() -> None:
    """Let go of what an earlier command held."""
    _KEPT.clear()


def print_json(value: Any) -> None:
    """Print one JSON object on stdout, as ``json.dumps(value, ensure_ascii=False, indent=2)``.

    Lone surrogates (a session may hold one) are escaped as ``JSON.stringify`` escapes them, so
    the output is valid UTF-8 and reads back as the same string (D26). When stdout's encoding
    is not UTF-8 (``PYTHONIOENCODING=latin-1``, a C locale) every non-ASCII character is
    escaped (an emoji as ``\ud83d\ude00``): the output is then ASCII, valid JSON in any such
    encoding, where the stream's error handler wrote ``\U0001f600``, which is not JSON.

    A process that read a big file has imported msgspec: its output is encoded by msgspec, a
    piece at a time (:mod:`~orchestrator._cli.json_output`, the same bytes). A short command
    does not import it for a small output.
    """
    stream = sys.stdout
    if not _utf8(stream):
        stream.write(json.dumps(value, ensure_ascii=True, indent=2) + "\n")
        return
    if "msgspec" not in sys.modules:
        text = escape_lone_surrogates(json.dumps(value, ensure_ascii=False, indent=2))
        stream.write(text + "\n")
        return
    from orchestrator._cli.json_output import indented_pieces

    out = _BytesOut(stream)
    for piece in indented_pieces(value):
        out.write(piece)
    out.write(b"\n")


class _BytesOut:
    """Writes UTF-8 pieces of text to a text stream's buffer, in order with its text.

    A piece holding a character the terminal-safe stream escapes (DEL, a C1 control) is written
    through the stream as text, which escapes it as it escapes everything else a command prints;
    a text stream without a buffer (``io.StringIO``) takes every piece as text.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = getattr(stream, "buffer", None)
        self._text = True  # text may be waiting in the stream: flush it before writing bytes

    def write(self, piece: bytes) -> None:
        if self._buffer is None or _drives_terminal(piece):
            self._stream.write(piece.decode("utf-8"))
            self._text = True
            return
        if self._text:
            self._stream.flush()
            self._text = False
        self._buffer.write(piece)


def _drives_terminal(data: bytes) -> bool:
    """Whether compact JSON's UTF-8 holds a character that :mod:`.terminal` would escape.

    The bytes are written under the :class:`~orchestrator._cli.terminal.TerminalSafe` stream,
    so they must hold nothing it would change: JSON escapes every C0 control (and JSON text
    has no raw tab or newline in a string), which leaves DEL and the C1 controls (U+0080 to
    U+009F, in UTF-8 the byte C2 then 80 to 9F, hexadecimal). Searching bytes for them is a
    fraction of the regular expression's time over the text.
    """
    if b"\x7f" in data:
        return True
    at = data.find(b"\xc2")
    while at != -1:
        if 0x80 <= data[at + 1] <= 0x9F:
            return True
        at = data.find(b"\xc2", at + 2)
    return False


def _utf8(stream: Any) -> bool:
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the summary-route options shared by ``compact``, ``navigate`` and ``tui``."""
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="M",
        help="litellm model id; repeat for candidates in order (default: offline)",
    )
    parser.add_argument("--api-base", help="base URL for the litellm routes")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="read the API key from FILE (yours, mode 0600; default: the provider's usual "
        "variable)",
    )
    keys.add_argument(
        "--api-key", help="API key (visible to other users in the process list: avoid)"
    )
    parser.add_argument(
        "--context-window",
        type=positive_int,
        default=0,
        help="the summarizer's context window in tokens",
    )
    parser.add_argument(
        "--remote", type=http_url, metavar="URL", help="remote summary endpoint (http or https)"
    )


API_KEY_VISIBLE = (
    "warning: --api-key is visible to every local user in the process list; "
    "prefer --api-key-file or the provider's environment variable"
)


def api_key_of(args: argparse.Namespace) -> str | None:
    """The API key from ``--api-key-file`` or ``--api-key``; ``None``: the provider's variable.

    The file is read as ``serve`` reads it (D30): it must be a regular file of ours that no other
    user may read or change, not a symbolic link, and not empty; surrounding whitespace (the
    newline an editor adds) is dropped.

    Raises:
        SessionError: The key file cannot be used; one line naming it and why (exit 1).
    """
    path = getattr(args, "api_key_file", None)
    if path is None:
        return getattr(args, "api_key", None) or None
    from orchestrator._rpc.access import read_secret_file  # only when a key file is named

    try:
        return read_secret_file(path, "API key")
    except ValueError as exc:
        raise SessionError(str(exc)) from None


def add_cluster_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--temporal HOST:PORT``, ``--database URL`` and ``--task-queue``."""
    parser.add_argument(
        "--temporal",
        required=required,
        metavar="HOST:PORT",
        help="the Temporal server (for example 127.0.0.1:7233)",
    )
    parser.add_argument(
        "--database",
        required=required,
        metavar="URL",
        help="the shared store: postgresql://USER@HOST/DB, or a directory of <session id>.jsonl",
    )
    parser.add_argument(
        "--task-queue",
        default="orchestrator-sessions",
        help="the Temporal task queue (default: orchestrator-sessions)",
    )


def check_cluster_database(database: str) -> None:
    """Refuse a ``--database`` the cluster could not use, before any work is taken.

    A PostgreSQL URL is connected to once (the schema migrated if needed); anything else must
    be a directory of sessions.

    Raises:
        SessionError: A URL libpq refuses, a server that cannot be reached, a login refused, a
            database that does not exist; a path that is not a directory. One line.
    """
    from orchestrator._store.factory import is_database_url

    if is_database_url(database):
        require_database_driver()
        from orchestrator._store.postgres_schema import connect

        connect(database).close()
    elif not Path(database).is_dir():
        raise SessionError(
            f"{database}: not a directory (nor a postgresql://USER@HOST/DATABASE URL)"
        )


CLUSTER_INSTALL = "pip install -e '.[cluster]'"
"""How the README says to install the ``cluster`` extra (section "Scale out")."""


def require_cluster() -> None:
    """Refuse, in one line, when the ``cluster`` extra is not installed.

    Raises:
        MissingExtraError: temporalio is missing.
    """
    if not _installed("temporalio"):
        raise MissingExtraError(f"the cluster needs the 'cluster' extra: {CLUSTER_INSTALL}")


def require_database_driver() -> None:
    """Refuse, in one line, when psycopg (of the ``cluster`` extra) is not installed.

    ``import``, ``export`` and every ``--database`` option call this before importing the
    database store: without it they ended in a ``ModuleNotFoundError`` traceback.

    Raises:
        MissingExtraError: psycopg is missing.
    """
    if not _installed("psycopg"):
        raise MissingExtraError(
            f"--database needs psycopg, from the 'cluster' extra: {CLUSTER_INSTALL}"
        )


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # None in sys.modules: its import is blocked, as if not installed
        return False
