r"""The ``sessions`` command: list the session files pi keeps for a directory, newest first.

pi writes each session to ``~/.pi/agent/sessions/--<path>--/<timestamp>_<id>.jsonl``, where
``<path>`` is the working directory with its leading separator removed and every ``/``, ``\``
and ``:`` replaced by ``-`` (pi's ``getDefaultSessionDir``); ``PI_CODING_AGENT_DIR`` replaces
``~/.pi/agent``. A new user knows the directory they worked in, not that name: this prints the
paths, one a line, so that ``orchestrator tree "$(orchestrator sessions | head -n 1)"`` opens the
latest. The encoding loses information (``a-b`` and ``a/b`` share a folder); I list what is there.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator._core.errors import SessionError


def register(commands: Any) -> None:
    """Add the ``sessions`` command."""
    sessions = commands.add_parser(
        "sessions",
        help="list pi's session files for a directory, newest first",
        description="List the session files pi keeps for a working directory "
        "(~/.pi/agent/sessions/--<path>--/), most recently changed first, one path a line.",
    )
    sessions.add_argument(
        "cwd", nargs="?", default=".", help="the directory pi ran in (default: this one)"
    )
    sessions.set_defaults(handler=_sessions)


def pi_session_folder(cwd: str, environ: Mapping[str, str] | None = None) -> Path:
    """The folder where pi keeps the sessions of working directory ``cwd``."""
    env = os.environ if environ is None else environ
    agent = env.get("PI_CODING_AGENT_DIR")
    root = Path(agent).expanduser() if agent else Path.home() / ".pi" / "agent"
    # pi resolves the path without following links (Node's path.resolve): abspath, not resolve.
    absolute = os.path.abspath(cwd)
    name = "--" + re.sub(r"[/\\:]", "-", re.sub(r"^[/\\]", "", absolute)) + "--"
    return root / "sessions" / name


def _sessions(args: argparse.Namespace) -> int:
    folder = pi_session_folder(args.cwd)
    files = sorted(
        (path for path in folder.glob("*.jsonl") if path.is_file()),
        key=lambda path: (path.stat().st_mtime_ns, path.name),
        reverse=True,
    )
    if not files:
        where = os.path.abspath(args.cwd)
        raise SessionError(f"no pi sessions for {where}: none in {folder}")
    for path in files:
        print(path)
    return 0
