"""The owner lock of a session file: one process changes a session at a time (D4, D27).

Design. The lock is an exclusive, non-blocking ``flock`` on a side file ``<session>.lock``
that holds the owner's pid and name (``"4242 orchestrator compact"``), so that a refused
process can say who holds it. Three facts shaped it:

* **Not the session file itself.** An atomic rewrite renames a new inode over the session
  file; a lock on the old inode would stop excluding anyone, and the refusal message needs a
  place for the owner's name, which the session file cannot hold.
* **No litter.** The owner deletes the side file when it lets go, *while still holding the
  lock*, and every process that takes the lock checks, after ``flock`` succeeds, that the path
  still names the inode it locked; if not (the previous owner deleted it in between), it starts
  over with a fresh file. So deleting never lets two owners in, and a session folder holds
  only the session and its journal once nobody is changing it. A process killed while owning
  leaves the side file behind; the kernel released its lock, and the next owner takes the file
  over and deletes it in turn. Taking over a file that still names an owner is how the next
  owner learns that one was killed (:attr:`OwnerLock.took_over`), and so that anything the
  killed owner was writing under the lock (a rewrite's temporary file) is litter to remove.
* **Per open file description.** ``flock`` belongs to one open file description, so two
  stores in one process exclude each other exactly as two processes do; a POSIX ``fcntl``
  lock would not, and would vanish when any descriptor of the file was closed.

The side file is opened with ``O_NOFOLLOW``: a planted symbolic link is refused, never
followed out of the session's folder.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from orchestrator._core.errors import SessionError, SessionLockedError
from orchestrator._store.files import open_side_file, session_file

LOCK_SUFFIX = ".lock"


def lock_path(session_path: str | os.PathLike[str]) -> Path:
    """The owner lock's side file of a session: the session file's path plus ``.lock``.

    A session opened through a symbolic link has the lock of the file it points to
    (:func:`~orchestrator._store.files.session_file`).
    """
    return Path(os.fspath(session_file(session_path)) + LOCK_SUFFIX)


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _holder(fd: int) -> str:
    """Who holds the lock, from the side file: ``pid N (name)``, as far as it can be read."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, name = text.partition(" ")
    if not pid.isdigit():
        return "another process"
    return f"pid {pid} ({name})" if name else f"pid {pid}"


class OwnerLock:
    """The owner lock of one session file.

    Args:
        session_path: The session file (it need not exist).
    """

    def __init__(self, session_path: str | os.PathLike[str]) -> None:
        self.session_path = Path(session_path)
        self.path = lock_path(session_path)
        self._fd: int | None = None
        self.took_over = False
        """Whether the last :meth:`acquire` found the side file naming an owner it outlived."""

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self, owner: str) -> None:
        """Take the lock without waiting and write ``pid owner`` into the side file.

        Args:
            owner: Who changes the session (``"orchestrator compact"``).

        Raises:
            SessionLockedError: Another store or process holds it.
            SessionError: The side file cannot be created (a read-only folder, a missing
                folder, a symbolic link planted in its place).
        """
        if self._fd is not None:
            return
        while True:
            doing = f"create the lock file needed to change {self.session_path.name}"
            fd = open_side_file(self.path, os.O_RDWR | os.O_CREAT, doing)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise SessionLockedError(
                    f"{self.session_path}: session is being changed by {holder}"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise SessionError(f"{self.path}: cannot lock it: {exc.strerror}") from exc
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the previous owner deleted this file as it let go: take a fresh one
        # Every owner writes its name into the file and deletes the file as it lets go, so a
        # file that holds a name was left by a process killed while owning (or by one that
        # could not delete it, a folder turned read-only: then the caution is needless).
        self.took_over = os.fstat(fd).st_size > 0
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {' '.join(owner.split())}\n".encode(), 0)
        except OSError:
            pass  # the name is a courtesy for the refusal message; the lock is what counts
        self._fd = fd

    def release(self) -> None:
        """Delete the side file and let go of the lock. Idempotent.

        The file is deleted while the lock is still held, and only if the path still names the
        file this object locked, so a newcomer either finds it gone or finds its own.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a folder that became read-only: the file stays, harmless without the lock
        finally:
            os.close(fd)
