"""The paths a one-process server takes: inside the served directory, names a file can have."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from orchestrator._core.errors import SessionError
from orchestrator._rpc.errors import INVALID_PARAMS, RpcError, one_line
from orchestrator._store.files import refuse_folder_name


def joined(path: str, root: Path | None) -> Path:
    """``path`` inside the served directory (or the working one), its links not followed.

    Raises:
        RpcError: a path no file can have (a NUL, a lone surrogate, an unknown ``~user``).
    """
    if "\0" in path:
        raise RpcError(INVALID_PARAMS, f"{path!r}: a path cannot hold a NUL character")
    try:
        given = Path(path).expanduser()
    except RuntimeError as exc:
        raise RpcError(INVALID_PARAMS, f"{path}: {one_line(str(exc))}") from None
    return given if given.is_absolute() else (root or Path.cwd()) / given


def resolve(path: str, root: Path | None) -> Path:
    """``path`` resolved, its links followed; refused outside ``root`` when one is given.

    Raises:
        RpcError: a path no file can have, a link loop, or outside the served directory.
    """
    if "\0" in path:
        raise RpcError(INVALID_PARAMS, f"{path!r}: a path cannot hold a NUL character")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        # A lone surrogate outside \udc80-\udcff (those stand for undecodable bytes) is
        # in no file name on this system.
        raise RpcError(
            INVALID_PARAMS, f"{path!r}: not a file name (it holds a lone surrogate)"
        ) from None
    try:
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = (root or Path.cwd()) / candidate
    except (OSError, RuntimeError) as exc:  # an unknown ~user: the caller's path, not a bug
        raise RpcError(INVALID_PARAMS, f"{path}: {one_line(str(exc))}") from None
    try:
        candidate = candidate.resolve()
    except (OSError, RuntimeError) as exc:
        # A symbolic link loop: Python 3.11 and 3.12 raise RuntimeError (nothing else in
        # resolve does), 3.13 an OSError with ELOOP. Told by type and number, not by its text.
        if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
            raise RpcError(
                INVALID_PARAMS,
                f"{path}: symbolic link loop (following its links never reaches a file)",
            ) from None
        raise RpcError(INVALID_PARAMS, f"{path}: {one_line(str(exc))}") from None
    if root is not None and not candidate.is_relative_to(root.resolve()):
        raise RpcError(INVALID_PARAMS, f"{path}: outside the served directory")
    return candidate


def fork_target(path: str, root: Path | None) -> Path:
    """Where ``session.fork`` writes: a new name inside the served directory.

    The name itself must be free: a symbolic link there, even one that points nowhere, is
    "already exists" (resolving it first created the file it points to, through it).
    """
    if not path:
        raise RpcError(
            INVALID_PARAMS, "session.fork: 'path' is empty; leave it out for a default name"
        )
    target = resolve(path, root)
    try:
        refuse_folder_name(path)
    except SessionError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None
    if os.path.lexists(joined(path, root)):
        raise RpcError(INVALID_PARAMS, f"{path}: already exists")
    return target
