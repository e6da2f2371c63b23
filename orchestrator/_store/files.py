"""Opening a session's files safely, and saying in one line why one cannot be opened.

Side files (``.lock``, ``.journal``, ``.corrupt``) are opened with ``O_NOFOLLOW``: a side file
that someone replaced with a symbolic link would otherwise make us read, or worse append to, a
file anywhere the link points, outside the session's folder. I refuse such a link with a clear
error instead of following it, and, opening without waiting, a named pipe or a device in a side
file's place. A side file opened for writing that has other names too (a hard link, ``st_nlink``
above 1) is refused as well: writing it would write the other file, wherever it is (a lock
text over another session, journal records or torn bytes appended to it). The count is read
from the opened descriptor (``fstat``), so the file checked is the file written, with no window
in between. A side file is created no more open than its session (:func:`mode_like`): the
journal, the lock and the torn bytes of a private session stay private. Operating-system errors
become a
:class:`~orchestrator._core.errors.SessionError` naming the file and the reason, so the command
line prints one line instead of a ``PermissionError`` traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG

from orchestrator._core.errors import SessionError, StorageError


def session_file(path: str | os.PathLike[str]) -> Path:
    """The file a session path names: a symbolic link is followed to the file it points to.

    A session's side files (lock, journal, ``.corrupt``) and its rewrites are named after the
    file itself, not after the name it was opened by: a session opened through a link and the
    same session opened by its own name (``orchestrator serve`` resolves every path) then share
    one lock and one journal, and a rewrite replaces the file, not the link. Otherwise two
    writers could hold two locks on one file, a half-done operation journaled under one name
    would not be settled when the file is opened under the other, and the first rewrite of a
    migrated file would replace the link with a copy, leaving the file itself as it was. The
    session file is the one file of a session that may be a link; side files that are links
    are still refused (:func:`open_side_file`).
    """
    given = Path(path)
    return Path(os.path.realpath(given)) if given.is_symlink() else given


SIDE_SUFFIXES = (".lock", ".journal", ".corrupt")
"""The endings of a session's side files (``<session>.lock`` and so on)."""


def mode_like(session_path: Path) -> int:
    """The mode to create a session's side file (or a fork of it) with: no more open than it.

    The owner may read and write it (we create it to write it); the group and others get what
    they have on the session, within what a new file gets anyway (the umask still applies). A
    session ``0600`` gives ``0600``: a journal holding its error messages, or a ``.corrupt``
    file holding its torn bytes, readable by every user where the session is not, would leak
    it. A session that is not there (yet) gives ``0o666``, what any new file gets.
    """
    try:
        mode = os.stat(session_path).st_mode
    except OSError:
        return 0o666
    return 0o666 & (mode | 0o600)


def side_file_name(path: Path) -> bool:
    """Whether ``path`` is named as a side file of some session, or a rewrite's temporary.

    A new session under such a name (a fork to ``s.jsonl.lock``) would be taken for the side
    file of ``s.jsonl``: its lock text written over it, journal records appended to it, and
    the file deleted as a stale lock.
    """
    name = path.name
    return name.endswith(SIDE_SUFFIXES) or (name.startswith(".") and name.endswith(".tmp"))


_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)


def refuse_folder_name(shown: str) -> None:
    """Refuse a session path that ends in a slash: it names a folder, whatever is there.

    ``Path("s.jsonl/")`` is ``Path("s.jsonl")``: pathlib drops the slash the system would not
    (``stat("s.jsonl/")`` is ``ENOTDIR``), so the name would open, create or fork onto the file
    ``s.jsonl``.

    Args:
        shown: The path as the caller gave it (a string, which keeps its slash).

    Raises:
        SessionError: ``shown`` ends in a slash.
    """
    if shown.endswith(_SEPARATORS):
        raise SessionError(f"{shown}: a name ending in '/' names a folder, not a session file")


def require_session_file(target: Path, shown: str) -> None:
    """Refuse a path that is not an existing regular file, saying what it is instead.

    The command line and ``session.open`` say the same: a folder, a pipe, a symbolic link loop
    or one that points nowhere are each named, not all "no such session file"; so is a name
    ending in a slash (:func:`refuse_folder_name`).

    Args:
        target: The path to look at (not resolved: its links are what is described).
        shown: The path as the caller gave it, for the message and its trailing slash.

    Raises:
        SessionError: ``target`` is not an existing regular file, or ``shown`` names a folder.
    """
    try:
        _require_session_file(target, shown)
    except OSError as exc:
        # pathlib's is_dir() and is_file() let through what is not "no such file": a name over
        # 255 bytes (ENAMETOOLONG), a folder on the way we may not search (EACCES). Still the
        # path the caller gave, not a bug: ``session.open`` answered -32603 for it.
        raise SessionError(f"{shown}: {exc.strerror or exc}") from None


def _require_session_file(target: Path, shown: str) -> None:
    if target.is_dir():
        raise SessionError(f"{shown}: is a directory, not a session file")
    refuse_folder_name(shown)
    if target.is_file():
        return
    if target.exists():  # a named pipe, a device: there, but not a file of JSON lines
        raise SessionError(f"{shown}: not a regular file; a session is a file of JSON lines")
    try:
        os.stat(target)
    except OSError as exc:  # exists() says False for a loop too
        if exc.errno == errno.ELOOP:
            raise SessionError(
                f"{shown}: symbolic link loop (following its links never reaches a file)"
            ) from None
    if target.is_symlink():
        raise SessionError(f"{shown}: symbolic link to {os.readlink(target)}, which does not exist")
    raise SessionError(f"{shown}: no such session file")


DISK_REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
"""Errors of the disk, not of the caller's input (a :class:`StorageError`, :func:`os_failure`)."""


def os_failure(path: str | os.PathLike[str], doing: str, exc: OSError) -> SessionError:
    """The error to raise (``from exc``) for an operating-system error on a session's file.

    A :class:`StorageError` when the disk refused (:data:`DISK_REFUSED`), else the plain
    :class:`SessionError` of a path that cannot be used (permissions, a missing folder...);
    either names the file (:func:`describe_os_error`).
    """
    message = describe_os_error(path, doing, exc)
    if exc.errno in DISK_REFUSED:
        return StorageError(message, exc.errno)
    return SessionError(message)


def describe_os_error(path: str | os.PathLike[str], doing: str, exc: OSError) -> str:
    """One readable line for an operating-system error on ``path``.

    Args:
        path: The file concerned.
        doing: What was attempted (``"read"``, ``"write"``, ``"create the lock file"``).
        exc: The error.
    """
    if exc.errno == errno.ELOOP:
        return f"{path}: is a symbolic link; refusing to follow it ({doing})"
    if exc.errno in (errno.EACCES, errno.EPERM):
        if doing.startswith("create ") and os.path.lexists(path):
            # It is there already (a stale one, say, made by another user): what failed is
            # opening it for writing, not creating it.
            return f"{path}: permission denied (it exists and cannot be opened for writing)"
        return f"{path}: permission denied (cannot {doing})"
    if exc.errno == errno.ENOENT:
        return f"{path}: its folder {Path(path).parent} does not exist (cannot {doing})"
    if exc.errno == errno.EROFS:
        return f"{path}: read-only file system (cannot {doing})"
    reason = exc.strerror or str(exc)
    return f"{path}: cannot {doing}: {reason}"


def open_side_file(path: Path, flags: int, doing: str, mode: int = 0o666) -> int:
    """Open a side file without following a symbolic link, and, to write it, one name only.

    Raises:
        SessionError: The side file is a symbolic link, not a regular file, opened for writing
            while it has other names (hard links), or cannot be opened (permissions, a missing
            folder...).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise os_failure(path, doing, exc) from exc
    return _regular(fd, path, doing, writing=bool(flags & (os.O_WRONLY | os.O_RDWR)))


def _regular(fd: int, path: Path, doing: str, *, writing: bool = False) -> int:
    """``fd`` if it is a regular file, and, for ``writing``, one with no name but ``path``.

    A hard link is not followed, it *is* the other file: ``O_NOFOLLOW`` cannot see it, and
    writing through it loses that file's data. Both are read from one ``fstat`` of the opened
    descriptor (a journal is opened at every session opening, issue 9). Opening wrote nothing
    (no side file is opened with ``O_TRUNC``), so a refusal leaves every file as it was.

    Raises:
        SessionError: Not a regular file, or, for ``writing``, a file with other names too.
    """
    try:
        stat = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    refusal = None
    if not S_ISREG(stat.st_mode):
        refusal = f"{path}: cannot {doing}: not a regular file"
    elif writing and stat.st_nlink > 1:
        refusal = (
            f"{path}: has {stat.st_nlink} names (hard links); "
            "refusing to write a side file another file shares"
        )
    if refusal is not None:
        os.close(fd)
        raise SessionError(refusal)
    return fd


def only_regular(fd: int, refusal: str) -> int:
    """``fd`` if it is a regular file; else it is closed and ``refusal`` raised.

    Opened with ``O_NONBLOCK``, a named pipe does not hold the open for ever; then anything but
    a regular file (a pipe, a device) is refused rather than read or written.

    Raises:
        SessionError: ``refusal``: the file is not a regular file.
    """
    try:
        regular = S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise SessionError(refusal)
    return fd


def _open_to_read(path: Path, doing: str) -> int | None:
    """A side file opened for reading, never through a symbolic link; ``None`` when missing.

    Raises:
        SessionError: The side file is a symbolic link, not a regular file, or cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_failure(path, doing, exc) from exc
    return _regular(fd, path, doing)


def read_side_file_tail(
    path: Path, doing: str, start: Callable[[bytes, bool], int | None], *, first: int = 1 << 16
) -> bytes | None:
    """The end of a side file, read backwards until ``start`` says where the part wanted begins.

    ``start(data, whole)`` gets the file's last bytes (``whole``: all of them) and returns the
    offset in ``data`` where the wanted part begins, or ``None`` to be given more (``first``
    bytes, then each read twice the last). A file read this way is never held whole unless
    the part wanted is.

    Returns:
        The wanted part; ``None`` when the file is missing.

    Raises:
        SessionError: The side file is a symbolic link or cannot be read.
    """
    fd = _open_to_read(path, doing)
    if fd is None:
        return None
    try:
        position = os.fstat(fd).st_size
        data, step = b"", max(1, first)
        while True:
            step = min(step, position)
            position -= step
            data = _read_exactly(fd, step, position) + data
            found = start(data, position == 0)
            if found is not None:
                return data[found:]
            if position == 0:  # pragma: no cover - start() answers for the whole file
                return data
            step *= 2
    except OSError as exc:
        raise os_failure(path, doing, exc) from exc
    finally:
        os.close(fd)


def _read_exactly(fd: int, length: int, offset: int) -> bytes:
    pieces = []
    while length > 0:
        piece = os.pread(fd, length, offset)
        if not piece:  # shorter than it was (another program truncated it): what is there
            break
        pieces.append(piece)
        length -= len(piece)
        offset += len(piece)
    return b"".join(pieces)


def read_side_file(path: Path, doing: str = "read") -> bytes | None:
    """Read a whole side file without following a symbolic link; ``None`` when missing.

    Raises:
        SessionError: The side file is a symbolic link or cannot be read.
    """
    fd = _open_to_read(path, doing)
    if fd is None:
        return None
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise os_failure(path, doing, exc) from exc
    finally:
        os.close(fd)
