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
import sys
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from orchestrator._core.errors import SessionError, SessionLockedError
from orchestrator._core.printable import printable
from orchestrator._store.files import mode_like, open_side_file, session_file

LOCK_SUFFIX = ".lock"


def default_owner() -> str:
    """The owner name of a store that writes without being told one: the running command's name.

    ``orchestrator`` for our command, the script's name for a program using the library, and
    ``python`` only when there is nothing better (an interactive interpreter).
    """
    name = Path(sys.argv[0]).name if sys.argv else ""
    return name if name and not name.startswith("-") else "python"


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


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a session's lock, as its side file says.

    Attributes:
        pid: The owner's process id, or ``None`` when the file does not start with one.
        name: The owner's name (``orchestrator compact``); empty when it gave none.
    """

    pid: int | None
    name: str

    def __str__(self) -> str:
        """``pid N (name)``, ``pid N`` or ``another process``: for one-line messages.

        The name is the lock file's text: its control characters are shown escaped.
        """
        if self.pid is None:
            return "another process"
        return f"pid {self.pid} ({printable(self.name)})" if self.name else f"pid {self.pid}"


def _holder(fd: int) -> Holder:
    """Who holds the lock, from the side file, as far as it can be read."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, name = text.partition(" ")
    if not (pid.isascii() and pid.isdigit()):
        return Holder(None, "")
    return Holder(int(pid), name)


def current_owner(session_path: str | os.PathLike[str]) -> Holder | None:
    """Who owns the session now, or ``None``: without taking the lock or creating any file.

    Inspection commands use it to tell an operation in progress from one a dead process left
    (D27). Taking the lock, even shared and for an instant, could refuse a real owner starting
    at that moment, and opening the side file to create it would leave litter; so the side file
    is only opened for reading, and the kernel's lock table says whether its ``flock`` is held.
    Where that table cannot be read (not Linux), a live process with the file's pid stands in.
    """
    try:
        fd = os.open(lock_path(session_path), os.O_RDONLY | _NO_WAIT_NO_LINK)
    except OSError:
        return None  # no lock file (nobody owns the session), or none we may look at
    try:
        info = os.fstat(fd)
        holder = _holder(fd) if S_ISREG(info.st_mode) else None
    finally:
        os.close(fd)
    if holder is None:
        return None
    held = _flock_held(info, holder.pid)
    if held is None:
        held = holder.pid is not None and _alive(holder.pid)
    return holder if held else None


_NO_WAIT_NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KERNEL_LOCKS = Path("/proc/locks")


def _flock_held(info: os.stat_result, pid: int | None) -> bool | None:
    """Whether the kernel lists a ``flock`` on the file ``info`` describes; ``None``: unknown.

    A line reads ``1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146887 0 EOF`` (device in hex, inode
    in decimal); a waiter's line has ``->`` after the number. Some file systems (btrfs) show
    another device number there than ``stat`` gives, so the lock's pid may stand in for it.
    """
    try:
        table = _KERNEL_LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        where = fields[5].rsplit(":", 1)
        if len(where) == 2 and where[1] == str(info.st_ino):
            if where[0] == device or fields[4] == str(pid):
                return True
    return False


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False  # signal 0 to 0 would ask about our own process group
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # someone else's process
    return True


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
            fd = open_side_file(
                self.path, os.O_RDWR | os.O_CREAT, doing, mode_like(self.session_path)
            )
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
