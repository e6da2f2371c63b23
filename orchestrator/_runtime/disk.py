"""Disk work the event loop does not wait for (issue 9).

On a file system with a journal of its own (ext4), creating a file, or the first write that
extends one, can wait for a commit of that journal which another thread's fsync started. A
server compacting many sessions at once fsyncs all the time, and a journal file created on the
event loop then stalls every session for up to a millisecond. So:

* before a turn's first record, the session's journal and its store are opened for writing in a
  worker thread (:func:`ready_to_write`); they stay open until the session closes, so this costs
  one hop per session, and a record is then one ``write`` on an open descriptor;
* an operation's commit (the journal's fsync on entering ``committing``, the append, the
  append's fsync, in that order) is one piece of work for the loop's one disk thread
  (:func:`off_loop`, :data:`DISK_THREADS`). The commits asked for while the thread is busy go
  together in its next call, in the order asked (:class:`_DiskQueue`): handing the thread one
  commit at a time cost two passes of the event loop between commits, and with 1,000 sessions
  committing at once the thread was idle more than half the time while commits queued;
* the journal's fsync on reaching a final state goes to a background thread and is not waited
  for (:func:`sync_later`). Nothing depends on it: a crash before it leaves the journal at
  ``committing``, and reopening settles the operation from the file, to the same end (D24).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
from anyio.lowlevel import RunVar

from orchestrator._store.journal import Journal
from orchestrator._store.memory import MemoryStore
from orchestrator._store.session import Session

T = TypeVar("T")

_log = logging.getLogger("orchestrator")


async def ready_to_write(session: Session | None, journal: Journal | None) -> None:
    """Open the journal and the session's store for writing, in a worker thread, if not open.

    Raises:
        SessionError: Either cannot be opened (a symbolic link, permissions, a lock).
    """
    journal_closed = journal is not None and not journal.is_open
    store_closed = session is not None and not session.ready_to_write
    if not (journal_closed or store_closed):
        return

    def open_both() -> None:
        if journal_closed and journal is not None:
            journal.open_file()
        if store_closed and session is not None:
            session.open_writer()

    await anyio.to_thread.run_sync(open_both, limiter=disk_threads())


async def off_loop(session: Session, work: Callable[[], T]) -> T:
    """Run ``work`` on the loop's disk thread, or at once for a session kept in memory.

    Once handed over, the work runs to its end: a cancellation waits for it (the disk work of a
    commit is short, and leaving before it ends would leave the caller not knowing).

    Raises:
        BaseException: Whatever ``work`` raised.
    """
    if isinstance(session.store, MemoryStore):
        return work()  # nothing to wait for
    with anyio.CancelScope(shield=True):
        result = await _queue().run(work)
    return result


class _Asked:
    """One piece of disk work and what came of it."""

    __slots__ = ("error", "finished", "result", "wake", "work")

    def __init__(self, work: Callable[[], object]) -> None:
        self.work = work
        self.wake = anyio.Event()
        self.finished = False
        self.result: object = None
        self.error: BaseException | None = None


class _DiskQueue:
    """The disk work of one event loop, carried to its disk thread in batches.

    Whoever asks while no batch is in the thread carries one: everything asked so far, run in
    the thread one after another, in the order asked. Those asking meanwhile wait; when the
    batch is back, each of them learns its outcome, and the first still waiting is woken to
    carry the next batch. The thread thus goes from one commit to the next without waiting for
    the event loop, and the loop hears of a whole batch at once.
    """

    def __init__(self) -> None:
        self._waiting: list[_Asked] = []
        self._carrying = False

    async def run(self, work: Callable[[], T]) -> T:
        asked = _Asked(work)
        self._waiting.append(asked)
        while not asked.finished:
            if self._carrying:
                await asked.wake.wait()  # its batch is back, or it is to carry the next one
                asked.wake = anyio.Event()
            else:
                await self._carry()
        if asked.error is not None:
            raise asked.error
        return asked.result  # type: ignore[return-value]

    async def _carry(self) -> None:
        self._carrying = True
        batch, self._waiting = self._waiting, []
        try:
            await anyio.to_thread.run_sync(_run_batch, batch, limiter=disk_threads())
        except BaseException as error:
            for asked in batch:  # the thread call itself failed: none of the rest ran
                if not asked.finished:
                    asked.error, asked.finished = error, True
            raise
        finally:
            self._carrying = False
            for asked in batch:
                asked.wake.set()
            if self._waiting:
                self._waiting[0].wake.set()


def _run_batch(batch: list[_Asked]) -> None:
    for asked in batch:
        try:
            asked.result = asked.work()
        except BaseException as error:  # noqa: BLE001 - handed to the one who asked
            asked.error = error
        asked.finished = True


_QUEUE: RunVar[_DiskQueue] = RunVar("orchestrator_disk_queue")


def _queue() -> _DiskQueue:
    try:
        return _QUEUE.get()
    except LookupError:
        queue = _DiskQueue()
        _QUEUE.set(queue)
        return queue


DISK_THREADS = 1
"""Worker threads for the commits of one event loop. More would not write faster: each holds
the interpreter between its system calls, and the event loop, which gives the interpreter up at
each of its own (a journal record's write), then waits behind every one of them in turn. With
1,000 compactions at once that wait was 1.2 s of the loop's time with anyio's 40 threads and
0.5 s with one (issue 9). Commits of different sessions are written one after another: an
fsync takes a fraction of a millisecond here, several on a slow disk."""

_DISK: RunVar[anyio.CapacityLimiter] = RunVar("orchestrator_disk")


def disk_threads() -> anyio.CapacityLimiter:
    """The running event loop's disk thread (as a limiter for ``anyio.to_thread.run_sync``)."""
    try:
        return _DISK.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DISK_THREADS)
        _DISK.set(limiter)
        return limiter


class _Background:
    """One daemon thread running the fsyncs nobody waits for, in the order they were asked."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], object]) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    thread = threading.Thread(
                        target=self._run, name="orchestrator-fsync", daemon=True
                    )
                    thread.start()
                    self._thread = thread
        self._queue.put(work)

    def drain(self) -> None:
        """Wait until what was asked so far is done (at exit too: these are for a durable end)."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done.set)
            done.wait(10)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            try:
                work()
            except Exception as error:  # noqa: BLE001 - nobody waits; say it and go on
                _log.warning("a background journal fsync failed: %s", error)

    def _after_fork(self) -> None:
        # A forked child has the queue's contents but not the thread: start afresh.
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()


_BACKGROUND = _Background()
atexit.register(_BACKGROUND.drain)
os.register_at_fork(after_in_child=_BACKGROUND._after_fork)


def sync_later(journal: Journal | None) -> None:
    """Fsync the journal in the background; a failure is logged, not raised (see above)."""
    if journal is not None and not journal.in_memory_only:
        _BACKGROUND.submit(journal.sync)


def drain_background() -> None:
    """Wait until every background fsync asked so far is done (tests, shutdown)."""
    _BACKGROUND.drain()
