"""The JSON-RPC errors this server answers with, and how an exception becomes one.

Handlers raise; they never build error responses themselves. One function (:func:`error_for`)
maps our error hierarchy onto codes, so every method reports a bad id, a busy session or a model
failure the same way:

======  ==================  ================================================================
code    name                when
======  ==================  ================================================================
-32700  parse error         the line is not JSON (not UTF-8, NaN, nested too deeply, too long)
-32600  invalid request     not a JSON-RPC 2.0 request object; an empty or over-long batch
-32601  method not found    unknown method; ``session.prompt`` with no agent configured
-32602  invalid params      missing/unknown/mistyped parameter, unknown session or entry id
-32603  internal error      a bug: the exception's type and message
-32001  busy                the session is working (navigation, close, a second compaction)
-32002  model failed        the summarizer or model call failed; nothing was applied
-32003  cancelled           the operation was cancelled; nothing was applied (also every
                            request still running when the server stops)
-32004  session locked      another process holds the session file's write lock
-32005  limit               a server bound was hit (connections, output waiting for the client,
                            file descriptors for the request: then nothing was applied)
-32006  unauthorized        the connection did not start with the server's token
-32007  conflict            another program changed the session meanwhile; nothing was applied
-32008  unavailable         the cluster (Temporal, its store) cannot be reached or failed
-32009  storage             the server's disk refused a write (full, a quota, read-only, an I/O
                            error); the message names the file
-32010  unknown operation   ``session.operation`` for an id the server does not know
======  ==================  ================================================================

Split from ``protocol.py`` (the envelopes and the dispatcher), which every answer goes through.
"""

from __future__ import annotations

import errno
from typing import Any

from orchestrator._core.errors import (
    BusyError,
    Cancelled,
    ConflictError,
    ModelError,
    NoAgentError,
    OrchestratorError,
    SessionError,
    SessionLockedError,
    StorageError,
    TransitionError,
    UnavailableError,
    error_name,
)
from orchestrator._store.files import DISK_REFUSED

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BUSY = -32001
MODEL_FAILED = -32002
CANCELLED = -32003
SESSION_LOCKED = -32004
LIMIT = -32005
UNAUTHORIZED = -32006
CONFLICT = -32007
UNAVAILABLE = -32008
STORAGE = -32009


class RpcError(OrchestratorError):
    """A JSON-RPC error to send back as is.

    Raised by handlers for protocol-level refusals (an unknown method, a bad parameter, a
    busy session). The caller is at fault; the session is unchanged.

    Attributes:
        code: The JSON-RPC error code.
        data: Optional structured details (sent as the error's ``data``).
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(one_line(message))
        self.code = code
        self.data = data


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


def error_for(exc: BaseException, method: str = "") -> RpcError:
    """The :class:`RpcError` a handler's exception is reported as.

    Args:
        exc: What the handler raised.
        method: The request's method, named in the message of a descriptor shortage.
    """
    if isinstance(exc, RpcError):
        return exc
    message = one_line(str(exc)) or error_name(exc)
    if isinstance(exc, Cancelled):
        return RpcError(CANCELLED, message)
    shortage = out_of_files(method or "the request", exc)
    if shortage is not None:
        return shortage
    if isinstance(exc, StorageError) or _system_error(exc, DISK_REFUSED) is not None:
        return RpcError(STORAGE, message, {"kind": "storage"})
    if isinstance(exc, ModelError):
        data: dict[str, Any] = {"kind": exc.kind}
        if exc.retry_after is not None:
            data["retryAfter"] = exc.retry_after
        return RpcError(MODEL_FAILED, message, data)
    # Before SessionError: a store that cannot be reached is one too, but no parameter was wrong.
    if isinstance(exc, UnavailableError):
        return RpcError(UNAVAILABLE, message, {"kind": "unavailable"})
    if isinstance(exc, SessionError):
        return _session_error(exc, message)
    if isinstance(exc, TransitionError):
        return RpcError(BUSY, message)
    return RpcError(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {message}")


def _session_error(exc: SessionError, message: str) -> RpcError:
    # Both are SessionErrors, but no parameter was wrong: the session is someone else's, or
    # changed under the operation (D27). Asking again later can succeed; nothing was applied.
    if isinstance(exc, BusyError):
        return RpcError(BUSY, message)
    if isinstance(exc, NoAgentError):
        return RpcError(METHOD_NOT_FOUND, message)
    if isinstance(exc, SessionLockedError):
        return RpcError(SESSION_LOCKED, message, {"kind": "locked", "applied": False})
    if isinstance(exc, ConflictError):
        return RpcError(CONFLICT, message, {"kind": "conflict", "applied": False})
    return RpcError(INVALID_PARAMS, message)


_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE})


def _system_error(exc: BaseException, numbers: frozenset[int]) -> OSError | None:
    """The ``OSError`` with one of ``numbers`` in ``exc``'s chain, else ``None``.

    ``exc`` itself, then what it was raised from or while handling (causes and contexts
    followed, each once; a context hidden with ``from None`` is not).
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in numbers:
            return error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return None


def out_of_files(shown: str, exc: BaseException) -> RpcError | None:
    """The ``-32005`` for a request the process had no file descriptor for, else ``None``.

    Running out of file descriptors is the server's limit, not the caller's fault nor a bug:
    each open session holds files (its lock and journal). The operating system's error may be
    wrapped, more than once, in the store's :class:`SessionError` (``cannot create the lock file
    ...``), a :class:`DefinitionError` (a table that could not be read) or another exception
    raised while handling it, so its causes and contexts are followed.
    """
    error = _system_error(exc, _SHORTAGE)
    if error is None:
        return None
    return RpcError(
        LIMIT,
        f"{shown}: the server has too many files open ({error.strerror}); "
        "close sessions, or raise its limit (ulimit -n)",
    )
