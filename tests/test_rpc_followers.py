"""Several connections following one session: closing it tells every one of them."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio

TOKEN = "test-token"
LIMIT = 4 * 1024 * 1024  # a bound on every read, far above any line here


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Client:
    """One connection: sends requests, keeps the notifications read on the way to an answer."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffered = BufferedByteReceiveStream(stream)
        self.notifications: list[dict[str, Any]] = []

    async def call(self, request_id: int, method: str, **params: Any) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self.stream.send((json.dumps(message) + "\n").encode())
        while True:
            answer: dict[str, Any] = json.loads(await self.buffered.receive_until(b"\n", LIMIT))
            if "id" in answer:
                assert answer["id"] == request_id, answer
                return answer
            self.notifications.append(answer)

    def events(self) -> list[dict[str, Any]]:
        return [n["params"] for n in self.notifications]


async def test_closing_a_session_tells_every_connection_that_followed_it(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "s.jsonl")
    hub = SessionHub(RuntimeOptions(root=tmp_path))
    server = RpcServer(hub)
    async with anyio.create_task_group() as group:
        port = await group.start(partial(server.serve_tcp, 0, token=TOKEN))
        async with (
            await anyio.connect_tcp("127.0.0.1", port) as one,
            await anyio.connect_tcp("127.0.0.1", port) as two,
        ):
            owner, follower = Client(one), Client(two)
            await owner.call(0, "auth", token=TOKEN)
            await follower.call(0, "auth", token=TOKEN)
            sid = (await owner.call(1, "session.open", path="s.jsonl"))["result"]["session_id"]
            again = await follower.call(1, "session.open", path="s.jsonl")
            assert again["result"]["session_id"] == sid  # the same session, followed by both
            closed = await owner.call(2, "session.close", session_id=sid)
            after = await follower.call(2, "session.tree", session_id=sid)
        group.cancel_scope.cancel()
    hub.close_all()
    assert closed["result"] == {"closed": True}
    ended = {"session_id": sid, "event": {"type": "session_closed"}}
    assert follower.events() == [ended]  # before its next answer
    assert owner.events() == [ended]  # before the answer to its session.close
    assert after["error"] == {"code": -32602, "message": f"Unknown session: {sid}"}
