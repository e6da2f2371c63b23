"""One error hierarchy for the whole library.

Every error we raise is an :class:`OrchestratorError`; callers can catch that one class.
Each child names who is at fault::

    OrchestratorError
    ├── DefinitionError    a machine table or prompt file is wrong (ours or yours), found at load
    ├── SessionError       a session file, entry id or argument is wrong: the caller's input
    │   ├── NotASessionError     the store holds no session header: nothing loads
    │   ├── EntryNotFoundError   an entry id the session does not hold
    │   ├── SessionLockedError   another process owns the session (D27)
    │   ├── ConflictError        the session changed since it was read; nothing written (D27)
    │   ├── BusyError            something runs that may not run with this request now
    │   ├── NoAgentError         a prompt to a host with no agent configured
    │   └── StorageError         the disk refused a read or write (full, a quota, read-only, EIO)
    ├── TransitionError    an event the table does not list for the current state: a caller bug
    ├── ModelError         the model provider failed (wraps its exception with ``from exc``)
    ├── UnavailableError   a service the cluster needs (the Temporal server) cannot be reached
    │   └── StoreUnavailableError   the PostgreSQL store cannot be reached (also a SessionError)
    └── Cancelled          the operation was cancelled on request; nothing was applied

The first design had four children. I added ``SessionError`` because bad input (a corrupt file,
an unknown id) is neither a definition problem nor a model problem, and callers need to tell it
apart to print one clear line without a traceback.

Errors are raised, never returned, and never used for control flow inside the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator._core.redact import redact

if TYPE_CHECKING:
    from orchestrator._core.load_result import Problem


class OrchestratorError(Exception):
    """Base of every error this library raises."""


class DefinitionError(OrchestratorError):
    """A machine table or prompt template is malformed. Raised at load time."""


class SessionError(OrchestratorError):
    """A session file, entry id or argument given by the caller cannot be used."""


class NotASessionError(SessionError):
    """The store holds something that is not a session: no header, so nothing loads (D3).

    Attributes:
        problems: What loading found, with line numbers (never empty): ``check`` reports them.
    """

    def __init__(self, message: str, problems: Sequence[Problem]) -> None:
        super().__init__(message)
        self.problems = list(problems)


class EntryNotFoundError(SessionError):
    """An entry id the session does not hold: ``Entry <id> not found``, as pi says it.

    Attributes:
        entry_id: The id asked for; the command line quotes it after the session's name.
    """

    def __init__(self, entry_id: str) -> None:
        super().__init__(f"Entry {entry_id} not found")
        self.entry_id = entry_id


class SessionLockedError(SessionError):
    """Another store or process owns the session: it holds the writer lock (D4, D27)."""


class ConflictError(SessionError):
    """A conditional write found the session no longer ending where the caller read it (D27).

    Another program (pi appends without asking) changed the session after the caller planned
    from it. Nothing was written.
    """


class BusyError(SessionError):
    """The session machine refused a request: something runs that may not run with it.

    ``machines/session.toml`` decides which operations may run together on one session (a
    second manual compaction, a prompt during a navigation, a close while anything runs). The
    JSON-RPC server answers ``-32001`` by this type, never by the message's words.
    """


class NoAgentError(SessionError):
    """A prompt to a host that has no agent (a server or worker started without ``--model``).

    The JSON-RPC server answers ``-32601`` (the method is not available there).
    """


class StorageError(SessionError):
    """The disk refused to read or write a session's file; the message names the file.

    Full, a quota, a read-only file system, an I/O error, a file too large: nobody's input was
    wrong, and once there is room (or the disk is back) the same call works. Refused before an
    operation's commit, nothing was applied; refused after it (the disk filling during the
    commit), the entry is in the session and reopening settles the operation as committed. It is
    a :class:`SessionError` too, as every failure to use a session's files was before it had its
    own class, so code that catches that keeps working.

    Attributes:
        errno: The operating system's error number (``errno.ENOSPC`` ...).
    """

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class TransitionError(OrchestratorError):
    """An event is not allowed in the machine's current state.

    Attributes:
        machine: Name of the machine table.
        state: The state the machine was in (it is left unchanged).
        event: The event that was refused.
    """

    def __init__(self, machine: str, state: str, event: str) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        super().__init__(f"{machine}: can't {event} when in {state}")


class ModelError(OrchestratorError):
    """A model call failed.

    The message is redacted (:func:`~orchestrator._core.redact.redact`): a provider's text that
    echoes the key, an ``Authorization`` header or anything shaped like a key keeps
    ``[redacted]`` in its place.

    Attributes:
        kind: ``"overflow"`` (context too long: never retried, compact instead),
            ``"transient"`` (worth retrying), ``"truncated"`` (stopped by the length limit),
            ``"empty"`` (no usable text) or ``"fatal"``.
        retry_after: Seconds the provider asked us to wait, when it said so.
        status: HTTP status when known.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "fatal",
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        # A provider's text may echo the key it was sent: never kept (redact.py).
        super().__init__(redact(message))
        self.kind = kind
        self.retry_after = retry_after
        self.status = status


class UnavailableError(OrchestratorError):
    """A service the cluster needs cannot be reached: no input was wrong, asking later may work.

    ``serve --temporal`` reports it as ``-32008`` (docs/scale-out.md); ``orchestrator worker``
    refuses to start with it.
    """


class OutcomeUnknownError(UnavailableError):
    """The cluster stopped answering while a request was sent: it may have been taken.

    The work it asked for may go on in the cluster; ``session.operation`` asks the cluster for
    its outcome later (docs/scale-out.md).
    """


class StoreUnavailableError(SessionError, UnavailableError):
    """A PostgreSQL store cannot be reached: a connection attempt failed, nothing was written.

    It is both. To a command given ``--database`` it is that argument's fault (a
    :class:`SessionError`: one line, exit 2, as a bad URL is). To ``serve --temporal``, whose
    client named a session correctly while the database was down, it is a service that went
    away (an :class:`UnavailableError`, ``-32008``), not a wrong parameter.
    """


class Cancelled(OrchestratorError):
    """The operation was cancelled; history and leaf are unchanged (decision D22)."""
