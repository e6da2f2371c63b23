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
    │   ├── FatalModelError      not worth asking again (a rejected key, a bad request)
    │   ├── TransientModelError  worth asking again after a wait (429, 5xx, a dropped link)
    │   │   └── ModelTimeoutError    no answer in time: retried as a transient failure is
    │   ├── ContextOverflowError the context is too long for the model: compact, never retry
    │   ├── TruncatedReplyError  the answer stopped at the length limit
    │   ├── EmptyReplyError      the answer carried no usable text
    │   └── SummaryRefusedError  the summary gate refused every summary there was (D32)
    ├── UnavailableError   a service the cluster needs (the Temporal server) cannot be reached
    │   └── StoreUnavailableError   the PostgreSQL store cannot be reached (also a SessionError)
    └── Cancelled          the operation was cancelled on request; nothing was applied

The first design had four children. I added ``SessionError`` because bad input (a corrupt file,
an unknown id) is neither a definition problem nor a model problem, and callers need to tell it
apart to print one clear line without a traceback.

Errors are raised, never returned, and never used for control flow inside the core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Self, cast

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
    """A model call failed; its class says which way (the kinds below).

    Catch ``ModelError`` for any model failure, or one of its children for one kind. Each child
    names its kind in :attr:`kind`, the word the journal, the Temporal results, the simulation
    scenarios, the traces and ``--json`` carry (those records keep the text they always had).

    ``ModelError(message, kind="transient")`` is still accepted, as it was before the kinds had
    classes, and builds the class of that kind (a :class:`TransientModelError` here); a bare
    ``ModelError(message)`` is a :class:`FatalModelError`. So a route that raises the old way is
    classified as before, by type. An unknown kind is a :class:`ValueError`.

    The message is redacted (:func:`~orchestrator._core.redact.redact`): a provider's text that
    echoes the key, an ``Authorization`` header or anything shaped like a key keeps
    ``[redacted]`` in its place.

    Attributes:
        kind: ``"overflow"``, ``"transient"``, ``"timeout"``, ``"truncated"``, ``"empty"``,
            ``"refused"`` or ``"fatal"``: the class's kind, fixed by the class.
        retry_after: Seconds the provider asked us to wait, when it said so.
        status: HTTP status when known.
    """

    kind: ClassVar[str] = "fatal"

    def __new__(
        cls,
        message: str,
        *,
        kind: str | None = None,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> Self:
        # Every instance is of exactly one kind's class, so `except TransientModelError` and
        # `isinstance` see what a route built the old way (`kind=`) as well as the new way.
        target: type[ModelError] = cls
        if kind is not None:
            target = error_class(kind)
            if not issubclass(target, cls):
                raise ValueError(f"{cls.__name__} cannot be of kind {kind!r} (a {target.__name__})")
        elif cls is ModelError:
            target = FatalModelError
        return cast(Self, super().__new__(target, message))

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        # A provider's text may echo the key it was sent: never kept (redact.py).
        super().__init__(redact(message))
        self.retry_after = retry_after
        self.status = status


class FatalModelError(ModelError):
    """A model failure that asking again will not cure (``kind == "fatal"``).

    A rejected key, a bad request, a route that answered nonsense: the operation fails.
    """

    kind: ClassVar[str] = "fatal"


class TransientModelError(ModelError):
    """A model failure a wait and another attempt may cure (``kind == "transient"``, D21).

    A 429, a 5xx, a dropped connection. ``retry_after`` holds the provider's hint, if any.
    """

    kind: ClassVar[str] = "transient"


class ModelTimeoutError(TransientModelError):
    """The model did not answer in time (``kind == "timeout"``).

    A child of :class:`TransientModelError` because both tables retry it as one: a timeout is
    the same "ask again later" as a 503, only with its own word in the records.
    """

    kind: ClassVar[str] = "timeout"


class ContextOverflowError(ModelError):
    """The request is longer than the model's context window (``kind == "overflow"``).

    Never retried as it is: the turn compacts and tries once more; a summary request is halved
    (D14).
    """

    kind: ClassVar[str] = "overflow"


class TruncatedReplyError(ModelError):
    """The answer stopped at the length limit (``kind == "truncated"``)."""

    kind: ClassVar[str] = "truncated"


class EmptyReplyError(ModelError):
    """The answer carried no usable text (``kind == "empty"``)."""

    kind: ClassVar[str] = "empty"


class SummaryRefusedError(ModelError):
    """The summary gate refused the summary and nothing else could write one (D32).

    ``kind == "refused"``; the message names the check that failed.
    """

    kind: ClassVar[str] = "refused"


MODEL_ERRORS: Mapping[str, type[ModelError]] = MappingProxyType(
    {
        c.kind: c
        for c in (
            FatalModelError,
            TransientModelError,
            ModelTimeoutError,
            ContextOverflowError,
            TruncatedReplyError,
            EmptyReplyError,
            SummaryRefusedError,
        )
    }
)
"""Each kind's word to its class: how a kind read back from a record becomes a type again."""


def error_class(kind: str) -> type[ModelError]:
    """The :class:`ModelError` class of a kind's word.

    Raises:
        ValueError: ``kind`` is not one of :data:`MODEL_ERRORS` (a record from elsewhere, or
            a typo): the message names the known kinds.
    """
    try:
        return MODEL_ERRORS[kind]
    except (KeyError, TypeError):
        known = ", ".join(sorted(MODEL_ERRORS))
        raise ValueError(f"unknown model error kind {kind!r}; the kinds are {known}") from None


def error_name(error: BaseException) -> str:
    """The error's class name as our records write it: ``ModelError`` for any model failure.

    A span's status, a simulation report's line and a failed reply's ``errorMessage`` (when the
    error has no text) named the class before the kinds had classes of their own; the kind is
    written beside them, so they keep the name they had and nothing recorded changes.
    """
    return "ModelError" if isinstance(error, ModelError) else type(error).__name__


def model_error(
    kind: str, message: str, *, retry_after: float | None = None, status: int | None = None
) -> ModelError:
    """Rebuild a model failure from its recorded kind, message and hints.

    Where a failure crossed a record (a Temporal activity's result, an operation's report, a
    scenario file) only its kind's word is left; this gives back the class a route raised.

    Raises:
        ValueError: an unknown kind (see :func:`error_class`).
    """
    return error_class(kind)(message, retry_after=retry_after, status=status)


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
