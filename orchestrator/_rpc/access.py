"""Who may connect (D30): loopback-only TCP, the token, 0600 Unix sockets, secret files.

A Unix socket is created with mode 0600, so only its owner (and root) can connect: the kernel
checks write permission on the socket file at ``connect``. I set the umask for the ``bind`` as
well as calling ``chmod`` after it, so the socket never exists with a wider mode, not even for an
instant. A TCP port is reachable by every local user, so a TCP listener binds to a loopback
address only and every connection must first present a random token that only the owner can
read: it is written to a new 0600 file in a new 0700 directory, or read from a file the owner
names (``--token-file``), which must not be readable by anyone else.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import anyio
import anyio.abc

TOKEN_FILE_NAME = "token"


def loopback_host(host: str) -> str:
    """``host`` as an address to bind, when it is a loopback address.

    ``localhost`` means ``127.0.0.1``: a name could resolve anywhere, an address cannot.

    Raises:
        ValueError: ``host`` is not a loopback address.
    """
    address = "127.0.0.1" if host == "localhost" else host
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"--host {host}: not a loopback address; the server listens on loopback only "
            "(127.0.0.1, ::1 or localhost; use an SSH tunnel to reach it from elsewhere)"
        )
    return address


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def write_token_file(token: str) -> Path:
    """Write ``token`` to a new 0600 file in a new 0700 directory; returns the file's path.

    The directory is made in ``$XDG_RUNTIME_DIR`` when that is set (a per-user directory the
    system cleans at logout), else in the system's temporary folder.
    """
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    parent = runtime_dir if runtime_dir and os.path.isdir(runtime_dir) else None
    folder = Path(tempfile.mkdtemp(prefix="orchestrator-serve-", dir=parent))
    path = folder / TOKEN_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return path


def remove_token_file(path: Path) -> None:
    """Remove a file made by :func:`write_token_file`, with its directory."""
    shutil.rmtree(path.parent, ignore_errors=True)


def read_secret_file(path: Path, what: str) -> str:
    """The secret held in ``path`` (surrounding whitespace removed).

    Args:
        path: The file.
        what: What the secret is, for messages (``token``, ``API key``).

    Raises:
        ValueError: the file is missing, not a regular file, not ours, readable or writable by
            other users, or empty. The message is one line naming the file.
    """
    try:
        # O_NONBLOCK: opening a named pipe would otherwise wait for a writer, for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            # O_NOFOLLOW's refusal reads "Too many levels of symbolic links": say what it is.
            raise ValueError(
                f"{what} file {path}: is a symbolic link; refused (name the file itself)"
            ) from None
        raise ValueError(f"{what} file {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        # Checked before wrapping the descriptor: a folder cannot even be wrapped.
        os.close(fd)
        raise ValueError(f"{what} file {path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_uid != os.getuid():
            raise ValueError(f"{what} file {path}: owned by another user")
        if info.st_mode & 0o077:
            raise ValueError(
                f"{what} file {path}: other users may read or change it "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run chmod 600 on it"
            )
        data = handle.read(65536)
    secret = data.decode("utf-8", errors="replace").strip()
    if not secret:
        raise ValueError(f"{what} file {path}: empty")
    return secret


async def unix_listener(path: Path) -> anyio.abc.SocketListener:
    """Listen on a new Unix socket at ``path``, mode 0600.

    A socket left behind by a server that is gone is replaced; anything else is refused.

    Raises:
        OSError: ``path`` is in use by a live server (``EADDRINUSE``), is not a socket
            (``EEXIST``), or cannot be created.
    """
    _check_socket_path(path)
    previous = os.umask(0o177)
    try:
        return await anyio.create_unix_listener(path, mode=0o600)
    finally:
        os.umask(previous)


def _check_socket_path(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(errno.EEXIST, "exists and is not a socket", str(path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return  # nobody listens: a stale socket, which the listener replaces
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, "another server is listening there", str(path))


def file_identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of ``path`` itself (``None``: there is nothing there)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def remove_socket(path: Path, identity: tuple[int, int] | None) -> None:
    """Remove the socket file at ``path`` if it is still the one with ``identity``.

    Another server may have replaced a socket I made (after I stopped answering on it); that one
    is not mine to remove.
    """
    if identity is not None and file_identity(path) == identity:
        path.unlink(missing_ok=True)
