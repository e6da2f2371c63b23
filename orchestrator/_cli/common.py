"""Helpers shared by the command modules: opening sessions and printing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from orchestrator._core.errors import SessionError
from orchestrator._store.session import Session


def require_file(path: str) -> None:
    """Refuse a path that is not an existing file (opening would create a new session).

    Raises:
        SessionError: the file does not exist.
    """
    if not Path(path).is_file():
        raise SessionError(f"{path}: no such session file")


def warn_problems(path: str, session: Session) -> None:
    """Report what loading found wrong (D3), one line each on stderr."""
    for problem in session.problems:
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


def print_json(value: Any) -> None:
    """Print one JSON object on stdout."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
