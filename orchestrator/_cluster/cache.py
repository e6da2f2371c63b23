"""A worker's cache of parsed sessions, never used stale (issue 10).

Theory of operation. Every activity of an operation reads the same session, and a worker runs
many activities of the same sessions, so a worker keeps what it parsed: per session the parse
(:class:`~orchestrator._core.loading.ParsedSession`) and the store's **stamp** when it was
made. A stamp is a value that changes with every write to the session, by anyone: for
PostgreSQL the session row's version, rewrite count, tail and creation time (one indexed
query); for a file its inode, size and change time (one ``stat``).

Before an activity uses a cached parse it reads the stamp fresh; a different stamp (another
worker or program wrote) drops the entry and the session is read again. So a cached session is
never older than the store was when the activity began. It may still be older than the store is
when the activity commits, which is what the conditional append is for: the commit names the
tail the operation planned from and the store refuses it, in its own transaction, when the
session ended elsewhere (D27). The cache gives the store the parse it checks refusals against
(``prime``), never the tail it compares.

What an operation plans from a session (the compaction plan, the branch it reads, the messages
it keeps) depends only on the entries up to the tail it planned at, so it is kept with the
parse, by that tail, and later activities of the operation skip planning again.

Bounded: at most ``max_sessions`` sessions and ``max_bytes`` of them as stored (a session's
stored length; parsed, a session takes several times that in memory), least recently used
dropped first. A session larger than ``max_bytes`` is never kept; either bound 0 keeps none
(``orchestrator worker --cache-sessions`` and ``--cache-mib`` set them). Entries are handed out, not
copied: the parse and plans are shared between threads and never changed in place (a
:class:`~orchestrator._core.tree.SessionTree` copies the entry list it indexes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.loading import ParsedSession

MAX_SESSIONS = 1000
"""Sessions a worker keeps parsed, by default (``--cache-sessions``)."""
MAX_MIB = 256
"""Stored MiB a worker keeps parsed, by default (``--cache-mib``; in memory several times more)."""
MAX_BYTES = MAX_MIB << 20
"""The same in bytes."""


@dataclass(slots=True)
class Cached:
    """One session's parse at one stamp, and what operations planned from it.

    Attributes:
        stamp: The store's stamp when it was parsed.
        parsed: The parse.
        size: Its stored length in bytes (what the byte bound counts).
        plans: What was planned from it, by the tail planned at and the settings (opaque to
            the cache).
    """

    stamp: tuple[Any, ...]
    parsed: ParsedSession
    size: int
    plans: dict[Hashable, Any] = field(default_factory=dict)


@dataclass(slots=True)
class CacheStats:
    """How the cache fared.

    Attributes:
        hits: Uses of a current parse.
        misses: Sessions not kept.
        stale: Parses found outdated (another writer wrote) and dropped.
        evicted: Parses dropped for room.
    """

    hits: int = 0
    misses: int = 0
    stale: int = 0
    evicted: int = 0


class SessionCache:
    """Parsed sessions by id, least recently used first out, safe across threads.

    Args:
        max_sessions: Sessions kept at most (0 keeps none).
        max_bytes: Stored bytes kept at most (0 keeps none).
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._entries: OrderedDict[str, Cached] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Stored bytes of the sessions kept now."""
        return self._bytes

    def get(self, session_id: str, stamp: tuple[Any, ...] | None) -> Cached | None:
        """The session's parse if it was made at ``stamp`` (the store's stamp read just now).

        An entry made at another stamp is dropped: the session changed since.
        """
        with self._lock:
            found = self._entries.get(session_id)
            if found is None:
                self.stats.misses += 1
                return None
            if stamp is None or found.stamp != stamp:
                self.stats.stale += 1
                self._remove(session_id)
                return None
            self._entries.move_to_end(session_id)
            self.stats.hits += 1
            return found

    def put(self, session_id: str, stamp: tuple[Any, ...], parsed: ParsedSession) -> Cached:
        """Keep ``parsed``, made at ``stamp``, replacing what was kept; returns the entry."""
        size = parsed.result.tail.length
        entry = Cached(stamp=stamp, parsed=parsed, size=size)
        with self._lock:
            self._remove(session_id)
            if self.max_sessions <= 0 or self.max_bytes <= 0 or size > self.max_bytes:
                return entry  # too big to keep: used once, not stored
            self._entries[session_id] = entry
            self._bytes += size
            while len(self._entries) > self.max_sessions or self._bytes > self.max_bytes:
                oldest = next(iter(self._entries))
                self._remove(oldest)
                self.stats.evicted += 1
        return entry

    def drop(self, session_id: str) -> None:
        """Forget the session (this worker wrote it, and cannot vouch for the stamp after)."""
        with self._lock:
            self._remove(session_id)

    def clear(self) -> None:
        """Forget every session."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _remove(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._bytes -= entry.size
