"""Appending a whole line or nothing: a refused append cuts the file back to where it ended.

Theory of operation
-------------------

A session file and its journal are appended to with ``O_APPEND``, one ``write`` per line (or
per batch of lines). On Linux a ``write`` to a regular file that fails wrote nothing: an error
is only returned when not one byte went out. What tears a line is the *short* write: with 8 KB
left on the disk, a 10 KB compaction line writes 8 KB and returns 8,192; the next ``write`` of
the rest fails with ``ENOSPC``. Those 8 KB end the file without a newline, and pi, which
appends without looking, glues its next line onto them: that message is then one unreadable
line and drops out of the context.

So :func:`append_whole` writes the rest after a short write (a file at its size limit, a quota
or a full disk answers the second ``write`` with the reason), and when the line still is not
whole it cuts the file back by exactly the bytes it wrote (``ftruncate``), fsyncs the cut, and
raises :class:`~orchestrator._core.errors.StorageError` naming the file. The file then holds the
bytes it held before, and ends on the line boundary it ended on.

The trade-off I accept: the cut is by *our* byte count from the file's end. A program that
appends between our short write and the cut (pi, ignoring the lock) would have its line glued
to our torn piece anyway, and the cut takes its tail. That window is one failed ``write`` wide
and only opens on a full disk. Should the cut itself fail (the disk went away), the error says
the torn bytes are still there; the session store then closes its descriptor, and its next
writer moves them to ``.corrupt`` before writing (``jsonl.py``, D3).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from orchestrator._core.errors import SessionError
from orchestrator._store.files import os_failure


def append_whole(fd: int, path: Path, data: bytes, doing: str) -> None:
    """Append ``data`` on ``fd`` (opened ``O_APPEND``) whole, or leave the file as it was.

    Args:
        fd: The file, open for appending.
        path: Its name, for the message.
        data: The bytes to append: whole lines.
        doing: What was attempted, for the message (``"append to it"``).

    Raises:
        StorageError: The disk refused (full, a quota, an I/O error, a file too large); the
            bytes written were cut off again unless the message says otherwise.
        SessionError: Another operating-system error (its message names the file).
    """
    view = memoryview(data)
    written = 0
    try:
        while written < len(view):
            step = os.write(fd, view[written:])
            if step == 0:  # never seen on a regular file: the disk takes nothing more
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += step
    except OSError as exc:
        raise _refused(fd, path, doing, exc, written) from exc


def _refused(fd: int, path: Path, doing: str, exc: OSError, written: int) -> SessionError:
    """The error for a refused append, after cutting off the ``written`` bytes of its line."""
    refusal = os_failure(path, doing, exc)
    if written and not _cut_back(fd, written):
        refusal.args = (
            f"{refusal}; {written} bytes of a torn line are left at its end (cutting them "
            "off failed too; the next writer of the session moves them aside)",
        )
    return refusal


def _cut_back(fd: int, written: int) -> bool:
    """Cut the last ``written`` bytes off the file and fsync the cut; whether it worked."""
    try:
        os.ftruncate(fd, os.fstat(fd).st_size - written)
    except OSError:
        return False
    # The cut is durable or the disk is gone: the refusal already says it failed either way.
    with contextlib.suppress(OSError):
        os.fsync(fd)
    return True
