"""JSON-RPC 2.0 over newline-delimited byte streams: framing, envelopes, the dispatcher.

Nothing here knows about sessions (that is :mod:`orchestrator._rpc.server`). The byte transports are
here because they are the wire: a socket stream or two file descriptors, cut into lines by
:func:`read_lines`.

Theory of operation. A transport hands :meth:`Dispatcher.handle_text` one line of text and
writes back whatever string it returns (``None``: nothing to write, the line was a
notification or blank). The dispatcher parses the envelope, finds the method in its table,
checks the parameter names the table declares, awaits the handler, and turns the outcome into
a response. Handlers raise; they never build error responses themselves. One function
(:func:`error_for`) maps our error hierarchy onto codes, so every method reports a bad id, a
busy session or a model failure the same way:

======  ==================  ================================================================
code    name                when
======  ==================  ================================================================
-32700  parse error         the line is not JSON (or not UTF-8)
-32600  invalid request     not a JSON-RPC 2.0 request object (or an empty batch)
-32601  method not found    unknown method; ``session.prompt`` with no agent configured
-32602  invalid params      missing/unknown/mistyped parameter, unknown session or entry id
-32603  internal error      a bug: the exception's type and message
-32001  busy                the session is working (navigation, close, a second compaction)
-32002  model failed        the summarizer or model call failed; nothing was applied
-32003  cancelled           the operation was cancelled; nothing was applied
-32004  session locked      another process holds the session file's write lock
======  ==================  ================================================================

Messages are one line (whitespace collapsed), so a client can show them as they are.

Batches (a JSON array of requests) are answered as the specification says: every request of
the batch runs concurrently, the responses come back in one array, and a batch made only of
notifications gets no answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.abc

from orchestrator._core.errors import (
    Cancelled,
    ModelError,
    OrchestratorError,
    SessionError,
    SessionLockedError,
    TransitionError,
)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BUSY = -32001
MODEL_FAILED = -32002
CANCELLED = -32003
SESSION_LOCKED = -32004

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A longer line is answered with a parse error and skipped up to its newline."""

_UNSET = object()


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


def error_for(exc: BaseException) -> RpcError:
    """The :class:`RpcError` a handler's exception is reported as."""
    if isinstance(exc, RpcError):
        return exc
    message = one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, Cancelled):
        return RpcError(CANCELLED, message)
    if isinstance(exc, ModelError):
        data: dict[str, Any] = {"kind": exc.kind}
        if exc.retry_after is not None:
            data["retryAfter"] = exc.retry_after
        return RpcError(MODEL_FAILED, message, data)
    if isinstance(exc, SessionLockedError):
        return RpcError(SESSION_LOCKED, message)
    if isinstance(exc, SessionError):
        return RpcError(INVALID_PARAMS, message)
    if isinstance(exc, TransitionError):
        return RpcError(BUSY, message)
    return RpcError(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {message}")


# -- parameters --------------------------------------------------------------------------------


class Params:
    """Typed access to a request's named parameters; a wrong one is ``-32602``."""

    def __init__(self, method: str, values: Mapping[str, Any]) -> None:
        self.method = method
        self.values = values

    def _get(self, name: str, kinds: tuple[type, ...], what: str, default: Any) -> Any:
        value = self.values.get(name, _UNSET)
        if value is _UNSET or (value is None and default is not _UNSET):
            if default is _UNSET:
                raise RpcError(INVALID_PARAMS, f"{self.method}: missing parameter '{name}'")
            return default
        # bool is an int in Python; JSON booleans are never accepted where text is wanted.
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise RpcError(INVALID_PARAMS, f"{self.method}: '{name}' must be {what}")
        return value

    def text(self, name: str) -> str:
        """A required non-empty string."""
        value: str = self._get(name, (str,), "a non-empty string", _UNSET)
        if not value:
            raise RpcError(INVALID_PARAMS, f"{self.method}: '{name}' must be a non-empty string")
        return value

    def optional_text(self, name: str) -> str | None:
        """An optional string (absent or ``null``: ``None``)."""
        value: str | None = self._get(name, (str,), "a string", None)
        return value

    def flag(self, name: str) -> bool:
        """An optional boolean (absent or ``null``: false)."""
        value: bool = self._get(name, (bool,), "a boolean", False)
        return value


Handler = Callable[[Params], Awaitable[Any]]
"""A method: takes its parameters, returns the JSON result or raises."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Method:
    """One row of the method table.

    Attributes:
        handler: The coroutine that runs it.
        params: Every parameter name it accepts; any other name is ``-32602``.
    """

    handler: Handler
    params: frozenset[str] = frozenset()


# -- envelopes ---------------------------------------------------------------------------------


def success(request_id: Any, result: Any) -> dict[str, Any]:
    """A success response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def failure(request_id: Any, error: RpcError) -> dict[str, Any]:
    """An error response."""
    body: dict[str, Any] = {"code": error.code, "message": str(error)}
    if error.data is not None:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A notification (no id): what the server sends for session events."""
    return {"jsonrpc": "2.0", "method": method, "params": dict(params)}


def encode(message: Any) -> str:
    """One line of JSON (no newline); values JSON cannot hold are sent as their text."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str)


def _valid_id(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int | float) and not isinstance(value, bool))
    )


class Dispatcher:
    """Answers JSON-RPC 2.0 requests from a method table.

    Args:
        methods: Method name to :class:`Method`.
    """

    def __init__(self, methods: Mapping[str, Method]) -> None:
        self.methods = dict(methods)

    async def handle_text(self, text: str | bytes) -> str | None:
        """Answer one line; returns the response line, or ``None`` when none is due."""
        try:
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            if not text.strip():
                return None
            message = json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            error = RpcError(PARSE_ERROR, f"Parse error: {one_line(str(exc))}")
            return encode(failure(None, error))
        answer = await self.handle(message)
        return None if answer is None else encode(answer)

    async def handle(self, message: Any) -> Any:
        """Answer a decoded message: a request, a notification or a batch."""
        if isinstance(message, list):
            return await self._batch(message)
        return await self._single(message)

    async def _batch(self, messages: list[Any]) -> list[dict[str, Any]] | dict[str, Any] | None:
        if not messages:
            return failure(None, RpcError(INVALID_REQUEST, "Invalid request: empty batch"))
        answers: list[dict[str, Any] | None] = [None] * len(messages)

        async def answer(index: int, message: Any) -> None:
            answers[index] = await self._single(message)

        async with anyio.create_task_group() as group:
            for index, message in enumerate(messages):
                group.start_soon(answer, index, message)
        replies = [a for a in answers if a is not None]
        return replies or None

    async def _single(self, message: Any) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return failure(None, RpcError(INVALID_REQUEST, "Invalid request: not an object"))
        is_notification = "id" not in message
        request_id = message.get("id")
        try:
            method, params = self._check(message)
            result = await method.handler(params)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
            error = error_for(exc)
            if is_notification and error.code != INVALID_REQUEST:
                return None
            return failure(request_id if _valid_id(request_id) else None, error)
        return None if is_notification else success(request_id, result)

    def _check(self, message: dict[str, Any]) -> tuple[Method, Params]:
        name = message.get("method")
        if message.get("jsonrpc") != "2.0" or not isinstance(name, str):
            raise RpcError(INVALID_REQUEST, 'Invalid request: needs jsonrpc "2.0" and a method')
        if not _valid_id(message.get("id")):
            raise RpcError(INVALID_REQUEST, "Invalid request: id must be a string or a number")
        method = self.methods.get(name)
        if method is None:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {name}")
        values = message.get("params", {})
        if not isinstance(values, dict):
            raise RpcError(INVALID_PARAMS, f"{name}: params must be an object of named values")
        unknown = sorted(set(values) - method.params)
        if unknown:
            raise RpcError(INVALID_PARAMS, f"{name}: unknown parameter {unknown[0]!r}")
        return method, Params(name, values)


# -- transports --------------------------------------------------------------------------------


class Transport(Protocol):
    """A byte pipe in both directions (a socket, or stdin/stdout)."""

    async def read(self) -> bytes:
        """The next bytes; ``b""`` at the end."""
        ...

    async def write(self, data: bytes) -> None:
        """Write all of ``data``."""
        ...


class StreamTransport:
    """A transport over an anyio byte stream (a TCP connection)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream

    async def read(self) -> bytes:
        """The next bytes; ``b""`` when the peer closed."""
        try:
            return await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return b""

    async def write(self, data: bytes) -> None:
        """Send ``data``."""
        await self.stream.send(data)


class FdTransport:
    """A transport over two file descriptors (``0`` and ``1`` for ``--stdio``).

    I wait for readiness with anyio (so reading never blocks the event loop and stays
    cancellable) and fall back to plain calls for descriptors the OS cannot poll (regular
    files: ``serve --stdio < requests.jsonl``). Writes go in pipe-buffer-sized pieces, so a
    write after readiness never blocks.
    """

    CHUNK = 4096

    def __init__(self, fd_in: int = 0, fd_out: int = 1) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self._poll_in = True
        self._poll_out = True

    async def read(self) -> bytes:
        """The next bytes; ``b""`` at end of input."""
        if self._poll_in:
            try:
                await anyio.wait_readable(self.fd_in)
            except OSError:
                self._poll_in = False
        return os.read(self.fd_in, 65536)

    async def write(self, data: bytes) -> None:
        """Write all of ``data``."""
        view = memoryview(data)
        while view:
            if self._poll_out:
                try:
                    await anyio.wait_writable(self.fd_out)
                except OSError:
                    self._poll_out = False
            view = view[os.write(self.fd_out, view[: self.CHUNK]) :]


async def read_lines(
    transport: Transport, limit: int = MAX_LINE_BYTES
) -> AsyncIterator[bytes | None]:
    """The transport's lines without their newline; ``None`` stands for an over-long line."""
    buffer = bytearray()
    skipping = False
    while chunk := await transport.read():
        # Only the new chunk can hold a newline: the buffer before it had none.
        searched = len(buffer)
        buffer += chunk
        while (end := buffer.find(b"\n", searched)) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            searched = 0
            if skipping:
                skipping = False
            else:
                yield line if len(line) <= limit else None
        if len(buffer) > limit and not skipping:
            yield None
            skipping = True
        if skipping:
            buffer.clear()
    if buffer and not skipping:
        yield bytes(buffer)
