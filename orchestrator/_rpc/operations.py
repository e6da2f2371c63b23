"""Operation ids and outcomes: what ``session.operation`` answers (issue 36).

Theory of operation. ``session.compress`` and ``session.tree.navigate`` are operations: each
has an id, the client's ``operationId`` or one the server makes, which the caller gets at once
(in the answer, in every error's ``data``, or alone with ``"wait": false``). The
:class:`OperationBook` of a server keeps, per session and id, what was asked (the method and
its parameters), whether it runs, and then its answer or error, as the original call would have
been answered; ``session.operation`` reads it.

An id names one request: asked again with the same parameters, it is the same operation (its
outcome when it ended, or waiting for it while it runs); with other parameters it is refused
(``-32602``). An operation refused before it started (``-32001`` busy, ``-32602``, ...) leaves
its id free for the same request again.

Memory is bounded: a book keeps at most :data:`KEPT` ended operations, each for at most
:data:`KEPT_S` seconds; older outcomes are forgotten (on the cluster, Temporal still has them:
the host's ``recall``). Operations still running are bounded by the work the server runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator._rpc import errors
from orchestrator._rpc.errors import (
    BUSY,
    INVALID_PARAMS,
    LIMIT,
    METHOD_NOT_FOUND,
    SESSION_LOCKED,
    RpcError,
)
from orchestrator._rpc.protocol import Params
from orchestrator._runtime.soon import on_asyncio

OPERATION_ID = "operationId"
"""The parameter (and answer field) naming an operation."""
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What an ``operationId`` may be: 1 to 64 letters, digits, ``_``, ``.`` or ``-`` (a UUID)."""
UNKNOWN_OPERATION = -32010
"""``session.operation`` for an id no operation of the session has (or one forgotten)."""
KEPT = 1000
"""Most ended operations a server remembers (the oldest ended is forgotten first)."""
KEPT_S = 3600.0
"""How long a server remembers an ended operation, in seconds."""
REFUSED_BEFORE_START = frozenset({BUSY, INVALID_PARAMS, METHOD_NOT_FOUND, SESSION_LOCKED, LIMIT})
"""Codes of a request refused before its work started: its id may be used again for it."""

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"


def requested_id(p: Params) -> str | None:
    """The ``operationId`` a client gave (``None``: none).

    Raises:
        RpcError: Not a string of 1 to 64 letters, digits, ``_``, ``.`` or ``-`` (``-32602``).
    """
    value = p.values.get(OPERATION_ID)
    if value is None:
        return None
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise RpcError(
            INVALID_PARAMS,
            f"{p.method}: '{OPERATION_ID}' must be 1 to 64 letters, digits, '_', '.' or '-' "
            f"(got {json.dumps(value)[:80]})",
        )
    return value


def new_id() -> str:
    """A fresh operation id: ``uuid.uuid4().hex``, without the ``UUID`` object (3 µs a request)."""
    value = int.from_bytes(os.urandom(16), "big")
    # As uuid.UUID(version=4) sets them: the RFC 4122 variant (10xx), version 4 (0100).
    value = (value & ~(0xC000 << 48) | 0x8000 << 48) & ~(0xF000 << 64) | 4 << 76
    return f"{value:032x}"


def with_id(error: RpcError, operation_id: str) -> RpcError:
    """``error`` with ``operationId`` in its ``data``.

    Made an object when it had none: every error this server sends has an object or nothing.
    """
    data = error.data if isinstance(error.data, dict) else {}
    return RpcError(error.code, str(error), {**data, OPERATION_ID: operation_id})


def unknown(method: str, session_id: str, operation_id: str) -> RpcError:
    """The ``-32010`` for an id no operation of the session has (here)."""
    return RpcError(
        UNKNOWN_OPERATION,
        f"{method}: no operation {operation_id} in session {session_id} (never asked for here, "
        f"or forgotten: a server keeps the last {KEPT} for {KEPT_S / 3600:g} h)",
        {OPERATION_ID: operation_id},
    )


def error_json(error: RpcError) -> dict[str, Any]:
    """An error as the answer's ``error`` member holds it."""
    body: dict[str, Any] = {"code": error.code, "message": str(error)}
    if error.data is not None:
        body["data"] = error.data
    return body


@dataclass(slots=True, kw_only=True)
class Operation:
    """One operation a server was asked for.

    Attributes:
        session_id: Its session.
        operation_id: Its id.
        method: The method that asked for it.
        asked: Its parameters, as sent (without ``operationId`` and ``wait``).
        state: ``running``, ``done``, ``failed`` or ``cancelled``.
        result: Its answer, once done.
        error: Its error, once failed or cancelled.
        unsure: It failed because the cluster stopped answering: the work may go on there,
            so ``session.operation`` asks the host again.
        ended_at: When it ended (monotonic seconds).
    """

    session_id: str
    operation_id: str
    method: str
    asked: str
    state: str = RUNNING
    result: Any = None
    error: RpcError | None = None
    unsure: bool = False
    ended_at: float = 0.0
    # Made by the first caller that waits: one asked again while it runs, rarely anyone.
    _ended: anyio.Event | None = field(default=None, repr=False)

    async def wait(self) -> None:
        """Return once it has ended (at once when it has)."""
        if self.state == RUNNING:
            if self._ended is None:
                self._ended = anyio.Event()
            await self._ended.wait()

    def as_json(self) -> dict[str, Any]:
        """``session.operation``'s answer."""
        answer: dict[str, Any] = {OPERATION_ID: self.operation_id, "state": self.state}
        if self.state == DONE:
            answer["result"] = self.result
        elif self.error is not None:
            answer["error"] = error_json(self.error)
        return answer

    def end(self, result: Any = None, error: RpcError | None = None) -> None:
        """Record the answer (or the error) the original call was given."""
        self.result, self.error = result, error
        if error is None:
            self.state = DONE
        else:
            self.state = CANCELLED if error.code == errors.CANCELLED else FAILED
        self.ended_at = time.monotonic()
        if self._ended is not None:
            self._ended.set()


class OperationBook:
    """The operations a server was asked for, by session and id (bounded: see the module)."""

    def __init__(self, *, kept: int = KEPT, kept_s: float = KEPT_S) -> None:
        self.kept, self.kept_s = kept, kept_s
        self._running: dict[tuple[str, str], Operation] = {}
        self._ended: OrderedDict[tuple[str, str], Operation] = OrderedDict()  # oldest first

    def find(self, session_id: str, operation_id: str) -> Operation | None:
        """The operation, or ``None`` when unknown (or forgotten)."""
        self._forget_old()
        key = (session_id, operation_id)
        return self._running.get(key) or self._ended.get(key)

    def begin(self, session_id: str, operation_id: str, method: str, asked: str) -> Operation:
        """Record a new operation as running.

        Raises:
            RpcError: The id names another request of this session (``-32602``).
        """
        key = (session_id, operation_id)
        known = self.find(session_id, operation_id)
        if known is not None and (known.method, known.asked) != (method, asked):
            raise RpcError(
                INVALID_PARAMS,
                f"{method}: operationId {operation_id} already names another request "
                f"({known.method} in session {session_id}); use a new id",
            )
        self._ended.pop(key, None)
        operation = Operation(
            session_id=session_id, operation_id=operation_id, method=method, asked=asked
        )
        self._running[key] = operation
        return operation

    def ended(self, operation: Operation) -> None:
        """Move an operation that ended to the bounded memory of ended ones."""
        key = (operation.session_id, operation.operation_id)
        if self._running.get(key) is operation:
            del self._running[key]
        self._ended[key] = operation
        self._ended.move_to_end(key)
        while len(self._ended) > self.kept:
            self._ended.popitem(last=False)

    def _forget_old(self) -> None:
        horizon = time.monotonic() - self.kept_s
        while self._ended and next(iter(self._ended.values())).ended_at < horizon:
            self._ended.popitem(last=False)

    def __len__(self) -> int:
        return len(self._running) + len(self._ended)


def asked_of(p: Params) -> str:
    """A request's parameters, without ``operationId`` and ``wait``, as comparable text."""
    kept = {k: v for k, v in p.values.items() if k not in (OPERATION_ID, "wait")}
    return _ASKED.encode(kept)


_ASKED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
"""What ``json.dumps(..., sort_keys=True, separators=(",", ":"), default=str)`` makes each call."""


class Background:
    """Work that outlives the request that started it (``"wait": false``).

    Each piece runs in a task of its own (a system task on trio), under a cancel scope
    :meth:`cancel_all` cancels (the server stopping).
    """

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` in a new task; it must not raise."""

        async def run() -> None:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    await work()
                finally:
                    self._scopes.discard(scope)

        if not on_asyncio():
            import trio

            trio.lowlevel.spawn_system_task(run)
            return
        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)  # a reference, or the loop may collect it while it runs
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        """Cancel every piece still running."""
        for scope in self._scopes:
            scope.cancel()
