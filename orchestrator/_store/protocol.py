"""The store protocol: where a session's lines live (decisions D3, D4, D27).

A store holds one session: a header and entries in file order. The core never sees a file;
:class:`~orchestrator.Session` talks to a store through this protocol, so a database store can be
added later without touching the core.

Two promises make a session safe across processes (D27). **Ownership**: a process that will
change a session calls :meth:`SessionStore.own` before it reads the state it acts on, and keeps
it until :meth:`SessionStore.close`; a second owner is refused at once with
:class:`~orchestrator._core.errors.SessionLockedError`. Readers never own. **Conditional
writes**: programs that do not take our lock (pi) may still append, so a commit names the
:class:`Tail` it planned from, and the store refuses with
:class:`~orchestrator._core.errors.ConflictError`, writing nothing, when the session no longer
ends there. A database store would use a row version where the file store uses the last id and
the byte length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from orchestrator._core.entries import Entry

# Tail is part of this protocol (D27); it is defined beside LoadResult, which carries one.
from orchestrator._core.load_result import EMPTY_TAIL as EMPTY_TAIL
from orchestrator._core.load_result import LoadResult
from orchestrator._core.load_result import Tail as Tail

FsyncPolicy = Literal["always", "per_turn", "never"]


class SessionStore(Protocol):
    """Where one session's header and entries are kept."""

    @property
    def location(self) -> str:
        """Where the session lives (a path for files), for messages and ``parentSession``."""
        ...

    def exists(self) -> bool:
        """True when something is stored (for files: the file exists and is not empty)."""
        ...

    def load(self) -> LoadResult:
        """Read everything, reporting problems instead of raising on damaged data (D3)."""
        ...

    def tail(self) -> Tail:
        """Where the stored session ends now (read fresh, not remembered)."""
        ...

    def own(self, owner: str) -> None:
        """Take the writer lock now, without waiting, and keep it until :meth:`close` (D27).

        Args:
            owner: Who changes the session, for the refusal others see
                (``"orchestrator compact"``).

        Raises:
            SessionLockedError: Another store or process owns the session.
        """
        ...

    def append(self, entries: Sequence[Entry], *, expect: Tail | None = None) -> Tail:
        """Append whole entries durably, per the fsync policy (D4).

        Args:
            entries: The entries, written as whole lines in one write.
            expect: Write only if the store still ends here (D27); ``None`` writes regardless.

        Returns:
            Where the store ends after the write.

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
        """
        ...

    def rewrite(
        self, header: Entry, entries: Sequence[Entry], *, expect: Tail | None = None
    ) -> Tail:
        """Replace the whole content atomically (temporary file, fsync, rename) (D4).

        Args:
            header: The session header.
            entries: Every entry, in order.
            expect: Replace only if the store still ends here (D27).

        Returns:
            Where the store ends after the rewrite.

        Raises:
            ConflictError: The store no longer ends at ``expect``; nothing was written.
        """
        ...

    def sync(self) -> None:
        """Make everything appended so far durable (the ``per_turn`` policy's turn boundary)."""
        ...

    def close(self) -> None:
        """Release the writer lock and any handle."""
        ...
