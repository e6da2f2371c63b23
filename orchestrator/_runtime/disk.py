"""Disk work the event loop does not wait for (issue 9).

On a file system with a journal of its own (ext4), creating a file, or the first write that
extends one, can wait for a commit of that journal which another thread's fsync started. A
server compacting many sessions at once fsyncs all the time, and a journal file created on the
event loop then stalls every session for up to a millisecond. So:

* a runtime built from a :class:`Session` (not by ``AgentSession.open``, which opens them with
  the session) opens the session's journal and its store for writing in a worker thread before
  a turn's first record (:func:`ready_to_write`); they stay open until the session closes, so
  a record is then one ``write`` on an open descriptor;
* an operation's commit (the journal's fsync on entering ``committing``, the append, the
  append's fsync, in that order) is one piece of work for the loop's disk threads
  (:func:`off_loop`, :data:`DISK_THREADS`). The commits asked for while those are busy go
  together in their next calls (:class:`_DiskQueue`), split over the threads, each session's
  work in the order asked: handing a thread one commit at a time cost two passes of the event
  loop between commits, and with 1,000 sessions committing at once the thread was idle more
  than half the time while commits queued;
* no fsync when an operation reaches its final state: that record becomes durable with the
  journal's next fsync (the next commit's, or the session's close, which makes everything
  written durable once). A power cut before it leaves the operation at ``committing`` or
  before, and reopening settles it from the file, to the same end (D24).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
from anyio.lowlevel import RunVar

from orchestrator._store.journal import Journal
from orchestrator._store.memory import MemoryStore
from orchestrator._store.session import Session

T = TypeVar("T")


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
        result = await _queue().run(work, session)
    return result


class _Asked:
    """One piece of disk work and what came of it."""

    __slots__ = ("error", "finished", "key", "result", "wake", "work")

    def __init__(self, work: Callable[[], object], key: object) -> None:
        self.work = work
        self.key = key
        self.wake = anyio.Event()
        self.finished = False
        self.result: object = None
        self.error: BaseException | None = None


class _DiskQueue:
    """The disk work of one event loop, carried to its disk threads in batches.

    Whoever asks while no batch is out carries one: everything asked so far, split over the
    threads by key (a session's work stays in one thread, in the order asked), each thread
    running its share one after another. Those asking meanwhile wait; when the batch is back,
    each of them learns its outcome, and the first still waiting is woken to carry the next
    batch. A thread thus goes from one commit to the next without waiting for the event loop,
    and the loop hears of a whole batch at once.
    """

    def __init__(self) -> None:
        self._waiting: list[_Asked] = []
        self._carrying = False

    async def run(self, work: Callable[[], T], key: object = None) -> T:
        asked = _Asked(work, key)
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
            lanes = _lanes(batch, DISK_THREADS)
            if len(lanes) == 1:
                await anyio.to_thread.run_sync(_run_batch, lanes[0], limiter=disk_threads())
            else:
                async with anyio.create_task_group() as group:
                    for lane in lanes:
                        group.start_soon(_run_lane, lane)
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


def _lanes(batch: list[_Asked], count: int) -> list[list[_Asked]]:
    """Split a batch into at most ``count`` lanes; work of one key stays in one lane, in order."""
    if count <= 1 or len(batch) <= 1:
        return [batch]
    lanes: list[list[_Asked]] = [[] for _ in range(min(count, len(batch)))]
    placed: dict[object, int] = {}
    for asked in batch:
        lane = placed.setdefault(asked.key, len(placed) % len(lanes))
        lanes[lane].append(asked)
    return [lane for lane in lanes if lane]


async def _run_lane(lane: list[_Asked]) -> None:
    await anyio.to_thread.run_sync(_run_batch, lane, limiter=disk_threads())


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


DISK_THREADS = 2
"""Worker threads for the disk work of one event loop. Two fsyncs in flight let the file
system commit them together (one journal commit of ext4 for both); more did not write faster
here: each thread holds the interpreter between its system calls, and the event loop, which
gives the interpreter up at each of its own (a journal record's write), then waits behind every
one of them in turn (with anyio's 40 threads that wait was 1.2 s of the loop's time for 1,000
compactions at once, issue 9). An fsync takes a fraction of a millisecond here, several on a
slow disk."""

_DISK: RunVar[anyio.CapacityLimiter] = RunVar("orchestrator_disk")


def disk_threads() -> anyio.CapacityLimiter:
    """The running event loop's disk thread (as a limiter for ``anyio.to_thread.run_sync``)."""
    try:
        return _DISK.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DISK_THREADS)
        _DISK.set(limiter)
        return limiter
