"""Making a new file's name durable: an fsync of its folder, shared by the files made before it.

A file's name is durable (survives a power cut) only once its folder is fsynced. Each journal
is a new file beside its session, so a thousand sessions opened in one folder used to fsync
that folder a thousand times, once per journal at its first durable record: a third of the
disk work of a thousand compactions at once (issue 9). One fsync of a folder makes durable
every name made in it before the fsync started, so a journal whose folder was fsynced since it
was made need not fsync it again.

How it is known: each file takes a ticket from :data:`DIRECTORIES` once it exists on disk
(:meth:`Folders.ticket`), and each folder remembers the newest ticket an fsync covered. An
fsync covers the tickets taken before it starts; two threads needing the same folder take turns,
and the second usually finds its ticket covered by the first's fsync.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make the names made so far in a folder durable (an fsync of the folder).

    Raises:
        OSError: It cannot be opened or the disk refused the fsync.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Folders:
    """The folder fsyncs of one process, and the files each one covered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued = 0
        self._covered: dict[str, int] = {}  # folder -> newest ticket a finished fsync covered
        self._turns: dict[str, threading.Lock] = {}  # one fsync of a folder at a time

    def ticket(self) -> int:
        """A ticket for a file that exists now (take it after creating the file, not before)."""
        with self._lock:
            self._issued += 1
            return self._issued

    def sync(self, directory: Path, ticket: int) -> None:
        """Make the names made in ``directory`` before ``ticket`` was taken durable.

        Returns at once when an fsync of the folder that started after the ticket was taken
        has finished; otherwise fsyncs it, after any fsync of it already under way.

        Raises:
            OSError: The folder cannot be opened or the disk refused the fsync.
        """
        key = os.fspath(directory)
        with self._lock:
            if self._covered.get(key, 0) >= ticket:
                return
            turn = self._turns.setdefault(key, threading.Lock())
        with turn:
            with self._lock:
                if self._covered.get(key, 0) >= ticket:
                    return  # the fsync this one waited for covered it
                # Every ticket issued so far is for a file that existed before now, so before
                # the fsync below starts: it covers them all.
                upto = self._issued
            fsync_dir(directory)
            with self._lock:
                self._covered[key] = max(self._covered.get(key, 0), upto)


DIRECTORIES = Folders()
"""The process's folder fsyncs (a file made by another process needs its own: it has no ticket)."""
