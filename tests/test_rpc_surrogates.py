"""A lone surrogate in a session, a path or an id reaches the client escaped, as JSON.stringify
writes it (D26), and never ends the connection.

pi writes lone surrogates into session files (tests/data/pi/non-bmp.jsonl holds some), and JSON
lets a client send one as ``\\udc80``. Encoded raw, such a string is not UTF-8: the server used
to drop the whole connection (on stdio, the whole server) on the first answer holding one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio

from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import encode
from orchestrator._rpc.server import RpcServer
from orchestrator._rpc.transport import FdTransport

NON_BMP = Path(__file__).parent / "data" / "pi" / "non-bmp.jsonl"


def line(request_id: Any, method: str, **params: Any) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return (json.dumps(message) + "\n").encode()  # ensure_ascii: a surrogate goes as \\udXXX


def serve(folder: Path, data: bytes) -> tuple[bytes, list[str]]:
    hub = SessionHub(RuntimeOptions(root=folder))
    logs: list[str] = []
    (folder / "in").write_bytes(data)

    async def run() -> None:
        server = RpcServer(hub, log=logs.append)
        with open(folder / "in", "rb") as source, open(folder / "out", "wb") as sink:
            await server.serve_connection(FdTransport(source.fileno(), sink.fileno()))

    try:
        anyio.run(run)
    finally:
        hub.abort_all()
        hub.close_all()
    return (folder / "out").read_bytes(), logs


def test_encode_escapes_lone_surrogates_and_keeps_pairs() -> None:
    text = encode({"a": "x\udc80y", "b": "\U0001f600"})
    assert text == '{"a":"x\\udc80y","b":"\U0001f600"}'
    assert json.loads(text) == {"a": "x\udc80y", "b": "\U0001f600"}
    text.encode("utf-8")  # what the transport sends: it must not raise


def test_a_session_holding_lone_surrogates_is_served_whole(tmp_path: Path) -> None:
    shutil.copy(NON_BMP, tmp_path / "s.jsonl")
    session_id = json.loads(NON_BMP.read_text().splitlines()[0])["id"]
    requests = [
        line(1, "session.open", path="s.jsonl"),
        line(2, "session.context", session_id=session_id),
        line(3, "session.tree", session_id=session_id),
        line(4, "session.open", path="a\udc80.jsonl"),
        line(5, "session.tree.navigate", session_id=session_id, target_id="\udc80"),
        line("\ud800", "session.list"),
        line(6, "session.list"),
    ]
    out, logs = serve(tmp_path, b"".join(requests))
    assert logs == []  # no connection ended after an internal error
    out.decode("utf-8")  # every byte written is UTF-8
    answers = {m.get("id"): m for m in map(json.loads, out.splitlines()) if "id" in m}
    assert set(answers) == {1, 2, 3, 4, 5, "\ud800", 6}
    context = json.dumps(answers[2]["result"], ensure_ascii=False)
    assert any(0xD800 <= ord(c) <= 0xDFFF for c in context)  # the session's own surrogates
    assert answers[4]["error"]["code"] == -32602
    assert "a\udc80.jsonl" in answers[4]["error"]["message"]
    assert answers[5]["error"]["code"] == -32602
    assert "sessions" in answers[6]["result"]


def test_a_path_with_a_surrogate_no_file_name_can_hold_is_invalid_params(
    tmp_path: Path,
) -> None:
    # \udc80-\udcff stand for undecodable bytes of a file name; \ud800 stands for nothing.
    shutil.copy(NON_BMP, tmp_path / "s.jsonl")
    session_id = json.loads(NON_BMP.read_text().splitlines()[0])["id"]
    requests = [
        line(1, "session.open", path="\ud800x.jsonl"),
        line(2, "session.open", path="\ud800x.jsonl", create=True),
        line(3, "session.open", path="s.jsonl"),
        line(4, "session.fork", session_id=session_id, entry_id="x", path="\ud800f.jsonl"),
    ]
    out, logs = serve(tmp_path, b"".join(requests))
    assert logs == []
    answers = {m["id"]: m for m in map(json.loads, out.splitlines())}
    for request_id in (1, 2, 4):
        error = answers[request_id]["error"]
        assert error["code"] == -32602, error
        assert "not a file name (it holds a lone surrogate)" in error["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", "s.jsonl"]
