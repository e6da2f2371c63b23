"""JSON-RPC 2.0 envelopes and the dispatcher.

Nothing here knows about sessions (that is :mod:`orchestrator._rpc.hub`) or about the wire (that
is :mod:`orchestrator._rpc.transport` and :mod:`orchestrator._rpc.server`).

Theory of operation. A connection hands :meth:`Dispatcher.handle_text` one line of text and
writes back whatever string it returns (``None``: nothing to write, the line was a
notification or blank). The dispatcher parses the envelope, finds the method in its table,
checks the parameter names the table declares, awaits the handler, and turns the outcome into
a response. Handlers raise; they never build error responses themselves. One function
(:func:`~orchestrator._rpc.errors.error_for`, with the table of codes in
:mod:`orchestrator._rpc.errors`) maps our error hierarchy onto codes.

Messages are one line (whitespace collapsed), so a client can show them as they are.

Batches (a JSON array of requests) are answered as the specification says: every request of
the batch runs concurrently, the responses come back in one array, and a batch made only of
notifications gets no answer. A batch longer than ``max_batch`` is refused as a whole.

Nothing a client sends can make the dispatcher raise: parsing refuses what the standard library
would accept but JSON does not allow (``NaN``, ``Infinity``, numbers that overflow to infinity as
an id), nesting deeper than :data:`MAX_DEPTH` is refused before any handler sees it, and a result
that cannot be encoded becomes an internal error for that one request.

Stopping (:meth:`Dispatcher.stop`) cancels every handler still running and answers its request
with the error given, so a client is told what became of each request before the server closes
its connection; a request that comes after is answered with the same error at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from orchestrator._rpc.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
    error_for,
    one_line,
)
from orchestrator._rpc.json_text import encoded
from orchestrator._rpc.work import Encoded, Stop, Streamed

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects a request may have (a batch counts as one level)."""
MAX_BATCH = 64
"""Most requests one batch may hold."""

_UNSET = object()


# -- parameters --------------------------------------------------------------------------------


async def _no_wait() -> None:
    """The room of a peer with no output queue (called in process): always some."""


class Peer:
    """One connection, as the handlers see it.

    Attributes:
        topics: What the connection subscribed to (the hub keeps session ids here: a connection
            receives the events of the sessions it opened, and no others).
        room: Waits until the client has taken its earlier answers (the connection sets it;
            heavy work waits for it before it starts, see :mod:`orchestrator._rpc.fair`).
        left: The client is gone: nothing more can be sent to it.
        waiting: The cancel scopes of its heavy requests not started yet.
        stops: The stop flags of its heavy requests running now.
        takes_encoded: Its answers are written as they are (a connection): a result a handler
            encoded itself (:class:`Encoded`) or encodes as it is written (:class:`Streamed`)
            reaches it so; anyone else gets the JSON value.
    """

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.room: Callable[[], Awaitable[None]] = _no_wait
        self.left = False
        self.waiting: set[anyio.CancelScope] = set()
        self.stops: set[Stop] = set()
        self.takes_encoded = False
        self._turn: anyio.Lock | None = None

    @property
    def turn(self) -> anyio.Lock:
        """Held by the connection's heavy request running now (one at a time)."""
        if self._turn is None:
            self._turn = anyio.Lock()
        return self._turn

    async def behind_heavy(self) -> None:
        """Wait until the heavy requests the connection sent before this one are done.

        A client that sends ``session.open`` and, without waiting, ``session.list`` sees the
        session listed, as when the opening ran on the event loop. Nothing waits when no heavy
        request of the connection is running.
        """
        if self._turn is not None and self._turn.locked():
            async with self._turn:
                pass

    def leave(self) -> None:
        """The client is gone: its heavy requests not started never start, the running stop."""
        self.left = True
        for scope in self.waiting:
            scope.cancel()
        for stop in self.stops:
            stop.stopped = True


class Params:
    """Typed access to a request's named parameters; a wrong one is ``-32602``.

    Attributes:
        method: The method called.
        values: The parameters as sent.
        peer: The connection the request came on (``None``: called in process).
    """

    def __init__(self, method: str, values: Mapping[str, Any], peer: Peer | None = None) -> None:
        self.method = method
        self.values = values
        self.peer = peer

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

    def flag(self, name: str, default: bool = False) -> bool:
        """An optional boolean (absent or ``null``: ``default``)."""
        value: bool = self._get(name, (bool,), "a boolean", default)
        return value

    def obj(self, name: str) -> dict[str, Any]:
        """A required JSON object."""
        value: dict[str, Any] = self._get(name, (dict,), "an object", _UNSET)
        return value


Handler = Callable[[Params], Awaitable[Any]]
"""A method: takes its parameters, returns the JSON result or raises."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Method:
    """One row of the method table.

    Attributes:
        handler: The coroutine that runs it.
        params: Every parameter name it accepts; any other name is ``-32602``.
        heavy: Its work grows with a session and runs through
            :class:`~orchestrator._rpc.fair.Fairness`, which keeps it in the connection's
            order; any other method first waits for the connection's earlier heavy requests.
    """

    handler: Handler
    params: frozenset[str] = frozenset()
    heavy: bool = False


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
    r"""One line of JSON (no newline); values JSON cannot hold are sent as their text.

    A lone surrogate (a session may hold one, D26; a client may send one as ``\udXXX``) is
    written as a ``\udXXX`` escape, as ``JSON.stringify`` does: left raw, the line would not
    be UTF-8 and could not be sent at all. The text is the standard library's, written by
    msgspec when that is the same (:mod:`~orchestrator._rpc.json_text`).

    Raises:
        ValueError: the message holds ``NaN`` or an infinity (JSON has neither).
        RecursionError: the message is nested too deeply to encode.
    """
    return encoded(message).decode("utf-8")


Part = bytes | Streamed
"""A piece of an answer's line: its bytes, or a result encoded as it is written."""


def answer_parts(answer: dict[str, Any]) -> list[Part]:
    """``answer`` encoded as pieces of one line (no newline); see :func:`encode_answer`.

    A result encoded already (:class:`Encoded`) is its pieces; one encoded as it is written
    (:class:`Streamed`) is one part, which the connection's writer expands.
    """
    result = answer.get("result")
    if not isinstance(result, Encoded | Streamed):
        return [encode_answer(answer)]
    head = encode({key: value for key, value in answer.items() if key != "result"})
    opening = head[:-1].encode("utf-8") + b',"result":'
    if isinstance(result, Streamed):
        # The envelope goes with the stream: the writer sends it with the first piece, or an
        # error answer instead when there is no first piece (connection.py).
        result.request_id, result.head, result.tail = answer.get("id"), opening, b"}"
        return [result]
    return [opening, *result.pieces, b"}"]


async def _value(result: Any) -> Any:
    """``result`` as a JSON value when a handler encoded it (for a caller in process)."""
    if isinstance(result, Encoded):
        return result.value()
    if isinstance(result, Streamed):
        return await result.value()
    return result


def error_line(code: int, message: str, request_id: Any = None) -> bytes:
    """One error answer as a whole line, in UTF-8 (for a connection about to close)."""
    return (encode(failure(request_id, RpcError(code, message))) + "\n").encode("utf-8")


def encode_answer(answer: dict[str, Any]) -> bytes:
    """``answer`` encoded in UTF-8; an answer that cannot be encoded becomes an internal error."""
    try:
        return encoded(answer)
    except (ValueError, TypeError, RecursionError) as exc:
        error = RpcError(INTERNAL_ERROR, f"Internal error: result not encodable: {exc}")
        return encoded(failure(answer.get("id"), error))


def decode(text: str | bytes) -> Any:
    """Parse one line of JSON as the specification defines it.

    Raises:
        RpcError: ``-32700`` for anything that is not JSON: bad UTF-8, bad syntax, ``NaN`` or
            ``Infinity``, a number too long to convert, or nesting too deep to parse.
    """
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if text.startswith("\ufeff"):
            return json.loads(text)  # refused, in json.loads's words (the decoder takes it)
        return _DECODER.decode(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RpcError(PARSE_ERROR, f"Parse error: {one_line(str(exc))}") from None
    except RecursionError:
        raise RpcError(PARSE_ERROR, f"Parse error: nested deeper than {MAX_DEPTH} levels") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
"""What ``json.loads(text, parse_constant=...)`` makes for each call, made once (2 µs a request)."""


def depth(value: Any) -> int:
    """How deeply ``value`` nests arrays and objects (a scalar is 0); iterative, never recurses."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        # Only the arrays and objects are stacked: a request's scalars cost one check each.
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                stack.append((child, level + 1))
    return deepest


def valid_id(value: Any) -> bool:
    """Whether a request id may be echoed: a string, an integer, a finite number or null."""
    # A float id that is not finite has no JSON spelling: echoing it would break the stream.
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and math.isfinite(value))
    )


class Dispatcher:
    """Answers JSON-RPC 2.0 requests from a method table.

    Args:
        methods: Method name to :class:`Method`.
        max_batch: Most requests a batch may hold; a longer one is refused whole.
    """

    def __init__(self, methods: Mapping[str, Method], *, max_batch: int = MAX_BATCH) -> None:
        self.methods = dict(methods)
        self.max_batch = max_batch
        self._running: set[anyio.CancelScope] = set()  # one per handler running now
        self._stopped: RpcError | None = None

    def stop(self, error: RpcError) -> None:
        """Cancel every running handler; their requests, and all later ones, get ``error``.

        A cancelled handler settles as a cancel from outside does (nothing partial is
        applied), then its request is answered with ``error``.
        """
        self._stopped = error
        for scope in self._running:
            scope.cancel()

    async def handle_text(self, text: str | bytes, peer: Peer | None = None) -> str | None:
        """Answer one line; returns the response line, or ``None`` when none is due.

        Args:
            text: The line, without its newline.
            peer: The connection it came from (handlers see it as :attr:`Params.peer`).
        """
        if not text.strip():
            return None
        try:
            message = decode(text)
        except RpcError as error:
            return encode(failure(None, error))
        return self.encode(await self.handle(message, peer))

    @staticmethod
    def encode(answer: Any) -> str | None:
        """The line for what :meth:`handle` returned (each answer of a batch on its own).

        Raises:
            TypeError: the answer holds a :class:`Streamed` result (only a connection, whose
                peer takes them, writes those).
        """
        parts = Dispatcher.encode_parts(answer)
        if parts is None:
            return None
        if not all(isinstance(part, bytes) for part in parts):
            raise TypeError("a streamed result is written by a connection, not joined")
        return b"".join(part for part in parts if isinstance(part, bytes)).decode("utf-8")

    @staticmethod
    def encode_parts(answer: Any) -> list[Part] | None:
        """:meth:`encode`'s line in pieces (an encoded result is not copied)."""
        if answer is None:
            return None
        if not isinstance(answer, list):
            return answer_parts(answer)
        parts: list[Part] = [b"["]
        for index, one in enumerate(answer):
            parts += ([b","] if index else []) + answer_parts(one)
        return [*parts, b"]"]

    async def handle(self, message: Any, peer: Peer | None = None) -> Any:
        """Answer a decoded message: a request, a notification or a batch."""
        if depth(message) > MAX_DEPTH:
            error = RpcError(INVALID_REQUEST, f"Invalid request: nested deeper than {MAX_DEPTH}")
            return failure(None, error)
        if isinstance(message, list):
            return await self._batch(message, peer)
        return await self._single(message, peer)

    async def _batch(
        self, messages: list[Any], peer: Peer | None
    ) -> list[dict[str, Any]] | dict[str, Any] | None:
        if not messages:
            return failure(None, RpcError(INVALID_REQUEST, "Invalid request: empty batch"))
        if len(messages) > self.max_batch:
            error = RpcError(
                INVALID_REQUEST,
                f"Invalid request: a batch of {len(messages)} requests; "
                f"at most {self.max_batch} are accepted",
            )
            return failure(None, error)
        answers: list[dict[str, Any] | None] = [None] * len(messages)

        async def answer(index: int, message: Any) -> None:
            answers[index] = await self._single(message, peer)

        async with anyio.create_task_group() as group:
            for index, message in enumerate(messages):
                group.start_soon(answer, index, message)
        replies = [a for a in answers if a is not None]
        return replies or None

    async def _single(self, message: Any, peer: Peer | None) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return failure(None, RpcError(INVALID_REQUEST, "Invalid request: not an object"))
        is_notification = "id" not in message
        request_id = message.get("id")
        try:
            method, params = self._check(message, peer)
            result = await self._call(method, params)
            if peer is None or not peer.takes_encoded:
                # In process: the JSON value (a streamed result is whole then, as asked).
                result = await _value(result)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
            name = message.get("method")
            error = error_for(exc, name if isinstance(name, str) else "")
            if is_notification and error.code != INVALID_REQUEST:
                return None
            return failure(request_id if valid_id(request_id) else None, error)
        return None if is_notification else success(request_id, result)

    async def _call(self, method: Method, params: Params) -> Any:
        if self._stopped is None:
            with anyio.CancelScope() as scope:
                self._running.add(scope)
                try:
                    if params.peer is not None and not method.heavy:
                        await params.peer.behind_heavy()
                    return await method.handler(params)
                finally:
                    self._running.discard(scope)
        # Stopped before it began, or cancelled by stop(): a fresh error each time (one
        # instance raised in many tasks would collect all their tracebacks).
        stopped = self._stopped
        assert stopped is not None
        raise RpcError(stopped.code, str(stopped), stopped.data)

    def _check(self, message: dict[str, Any], peer: Peer | None) -> tuple[Method, Params]:
        name = message.get("method")
        if message.get("jsonrpc") != "2.0" or not isinstance(name, str):
            raise RpcError(INVALID_REQUEST, 'Invalid request: needs jsonrpc "2.0" and a method')
        if not valid_id(message.get("id")):
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
        return method, Params(name, values, peer)
