"""The ``operation`` command: how an operation a server was asked for stands, or its outcome.

``orchestrator operation SESSION ID (--socket PATH | --temporal HOST:PORT) [--json]`` asks what
``session.operation`` answers (docs/server.md): ``running``, or ``done`` with the answer the
original ``session.compress`` or ``session.tree.navigate`` was (or would have been) given, or
``failed`` / ``cancelled`` with its error.

Where the outcome lives decides where it is asked: a one-process server keeps it in memory, so
``--socket`` asks that server (``orchestrator serve --socket PATH``), which must have the
session open (SESSION: its path as opened, or its id; the command opens nothing); on the
cluster, the session's workflow keeps it, so ``--temporal`` asks the Temporal server directly
(SESSION: the session id, or ``<id>.jsonl``), whichever server asked for the operation and
even when that server is gone.

Exit status: 0 when the operation is known (whatever its state), 1 when it is not (or the
server cannot be reached), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

from orchestrator._cli.common import UsageError, print_json, require_cluster
from orchestrator._core.errors import SessionError

UNKNOWN = "operation {id} is not known in session {session}"
"""The refusal when no operation has the id (the server's message follows, when it gave one)."""


def register(commands: Any) -> None:
    """Add the ``operation`` command to the parser."""
    command = commands.add_parser(
        "operation",
        help="show how a server's operation (compress, navigate) stands, or its outcome",
    )
    command.add_argument(
        "session", help="the session: its path or id on the server (--socket), its id (--temporal)"
    )
    command.add_argument("id", help="the operation id (operationId)")
    where = command.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--socket", type=Path, metavar="PATH", help="ask the one-process server on this socket"
    )
    where.add_argument(
        "--temporal", metavar="HOST:PORT", help="ask the cluster's Temporal server directly"
    )
    command.add_argument("--json", action="store_true", help="print the answer as JSON")
    command.set_defaults(handler=_operation)


def _operation(args: argparse.Namespace) -> int:
    if not args.id:
        raise UsageError("the operation id is empty")
    answer = _from_server(args) if args.socket is not None else _from_cluster(args)
    if args.json:
        print_json(answer)
    else:
        for line in describe(answer):
            print(line)
    return 0


def describe(answer: dict[str, Any]) -> list[str]:
    """``session.operation``'s answer as lines of text."""
    state = answer["state"]
    lines = [f"operation {answer['operationId']}: {state}"]
    if state == "done":
        result = answer["result"]
        if "compacted" in result:
            lines.append(
                f"compacted: entry {result['entryId']} (tokens before: {result['tokensBefore']})"
                if result["compacted"]
                else f"not compacted: {result['reason']}"
            )
        else:
            lines.append(
                f"navigated: leaf {result['oldLeafId']} -> {result['newLeafId']}"
                + (" (cancelled)" if result["cancelled"] else "")
            )
    elif "error" in answer:
        error = answer["error"]
        lines.append(f"error {error['code']}: {error['message']}")
    return lines


def _from_cluster(args: argparse.Namespace) -> dict[str, Any]:
    """Ask the Temporal server for the update named by the id (any server's)."""
    require_cluster()
    import anyio

    from orchestrator._rpc.cluster_hub import session_id_of
    from orchestrator._rpc.errors import RpcError

    try:
        session_id = session_id_of(args.session)
    except RpcError as error:
        raise UsageError(str(error)) from None
    answer: dict[str, Any] = anyio.run(ask_cluster, args.temporal, session_id, args.id)
    return answer


async def ask_cluster(temporal: str, session_id: str, operation_id: str) -> dict[str, Any]:
    """``session.operation``'s answer, asked of the Temporal server at ``temporal``.

    Raises:
        SessionError: No run of the session's workflow knows the id.
        UnavailableError: The Temporal server cannot be reached.
    """
    from orchestrator._cluster.client import ClusterClient
    from orchestrator._rpc.cluster_hub import recall_operation

    client = await ClusterClient.connect(temporal)
    answer = await recall_operation(client, session_id, operation_id)
    if answer is None:
        raise SessionError(UNKNOWN.format(id=operation_id, session=session_id))
    return answer


def _from_server(args: argparse.Namespace) -> dict[str, Any]:
    """Ask the one-process server on ``args.socket``, which has the session open."""
    with _Connection(args.socket) as server:
        sessions = server.call("session.list", {})["sessions"]
        wanted = {args.session, os.path.abspath(args.session)}
        matches = [s for s in sessions if s["session_id"] in wanted or s["path"] in wanted]
        if not matches:
            raise SessionError(
                f"{args.session}: not open on the server at {args.socket} (its outcome is kept "
                "only by the server that ran it)"
            )
        session_id = matches[0]["session_id"]
        try:
            answer: dict[str, Any] = server.call(
                "session.operation", {"session_id": session_id, "operationId": args.id}
            )
        except _Refused as refused:
            raise SessionError(
                f"{UNKNOWN.format(id=args.id, session=session_id)}: {refused}"
            ) from None
        return answer


class _Refused(SessionError):
    """The server answered a request with an error (its message)."""


class _Connection:
    """A blocking JSON-RPC connection to a server's Unix socket, one request at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._pending = b""
        self._ids = 0

    def __enter__(self) -> _Connection:
        try:
            self._socket.connect(str(self.path))
        except OSError as error:
            self._socket.close()
            raise SessionError(
                f"{self.path}: no server answers there ({error.strerror or error}); start one "
                "with orchestrator serve --socket PATH"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """The result of ``method``.

        Raises:
            _Refused: The server answered with an error.
            SessionError: The server closed the connection first.
        """
        self._ids += 1
        request = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        self._socket.sendall(json.dumps(request).encode("utf-8") + b"\n")
        while True:
            message = json.loads(self._line())
            if message.get("id") != self._ids:
                continue  # a notification
            if "error" in message:
                raise _Refused(message["error"]["message"])
            return message["result"]

    def _line(self) -> bytes:
        while b"\n" not in self._pending:
            data = self._socket.recv(65536)
            if not data:
                raise SessionError(f"{self.path}: the server closed the connection")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return line
