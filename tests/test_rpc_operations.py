"""Operation ids and ``session.operation`` on the one-process server (issue 36).

Every ``session.compress`` and ``session.tree.navigate`` has an id, the client's or the
server's, in its answer and in every error's ``data``; ``"wait": false`` answers with the id at
once, and ``session.operation`` returns the outcome later, as the original call would have.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from orchestrator._core.errors import ModelError
from orchestrator._rpc.errors import BUSY, CANCELLED, INVALID_PARAMS, MODEL_FAILED, RpcError
from orchestrator._rpc.operations import KEPT, UNKNOWN_OPERATION, OperationBook
from orchestrator.testing import Hang
from tests.runtime_kit import BIG, HubClient, summary, until
from tests.test_rpc import compactable_kit, conversation, kit_client, nav_kit

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def ready_to_compact(*summaries: Any) -> tuple[Any, HubClient[Any], str]:
    kit = compactable_kit(*summaries)
    client, sid = kit_client(kit)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    return kit, client, sid


def compacted(entry: dict[str, Any], operation_id: str) -> dict[str, Any]:
    """``session.operation``'s answer for a compaction that committed ``entry``."""
    return {
        "operationId": operation_id,
        "state": "done",
        "result": {
            "compacted": True,
            "entryId": entry["id"],
            "summary": entry["summary"],
            "tokensBefore": entry["tokensBefore"],
            "firstKeptEntryId": entry["firstKeptEntryId"],
            "shortSummary": None,
            "operationId": operation_id,
        },
    }


async def settled(client: HubClient[Any], sid: str, operation_id: str) -> dict[str, Any]:
    """``session.operation``'s answer once the operation no longer runs."""
    while True:
        answer: dict[str, Any] = await client.call(
            "session.operation", session_id=sid, operationId=operation_id
        )
        if answer["state"] != "running":
            return answer
        await anyio.sleep(0)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_compress_without_waiting_answers_the_id_and_the_outcome_comes_later() -> None:
    kit, client, sid = await ready_to_compact()
    started = await client.call("session.compress", session_id=sid, wait=False)
    operation_id = started["operationId"]
    assert started == {"operationId": operation_id, "state": "running"}
    assert len(operation_id) == 32
    done = await settled(client, sid, operation_id)
    entry = kit.session.tree.entries[-1]
    assert entry["type"] == "compaction"
    assert done == compacted(entry, operation_id)
    # Asked again, the same outcome: nothing ran twice.
    assert await settled(client, sid, operation_id) == done
    assert len(kit.model.requests) == 1


async def test_a_client_id_names_the_operation_and_asking_again_is_the_same_operation() -> None:
    kit, client, sid = await ready_to_compact()
    first = await client.call("session.compress", session_id=sid, operationId="mine-1")
    assert (first["compacted"], first["operationId"]) == (True, "mine-1")
    # The same request under the same id: the first's answer, not "Already compacted".
    assert await client.call("session.compress", session_id=sid, operationId="mine-1") == first
    later = await client.call("session.compress", session_id=sid, operationId="mine-1", wait=False)
    assert later == {"operationId": "mine-1", "state": "done", "result": first}
    assert len(kit.model.requests) == 1
    # Another request under that id is refused, and changes nothing.
    other = await client.error(
        "session.compress", session_id=sid, operationId="mine-1", focus="something else"
    )
    assert other == {
        "code": INVALID_PARAMS,
        "message": "session.compress: operationId mine-1 already names another request "
        f"(session.compress in session {sid}); use a new id",
        "data": {"operationId": "mine-1"},
    }
    navigation = await client.error(
        "session.tree.navigate", session_id=sid, target_id=first["entryId"], operationId="mine-1"
    )
    assert navigation["code"] == INVALID_PARAMS
    assert "already names another request" in navigation["message"]
    assert len(kit.model.requests) == 1


async def test_unknown_and_malformed_ids_are_refused_clearly() -> None:
    _, client, sid = await ready_to_compact()
    unknown = await client.error("session.operation", session_id=sid, operationId="nobody")
    assert unknown == {
        "code": UNKNOWN_OPERATION,
        "message": f"session.operation: no operation nobody in session {sid} (never asked for "
        "here, or forgotten: a server keeps the last 1000 for 1 h)",
        "data": {"operationId": "nobody"},
    }
    missing = await client.error("session.operation", session_id=sid)
    assert missing == {
        "code": INVALID_PARAMS,
        "message": "session.operation: missing parameter 'operationId'",
    }
    for bad, shown in (("a b", '"a b"'), ("x" * 65, '"' + "x" * 65 + '"'), (12, "12"), ("", '""')):
        for method in ("session.compress", "session.operation"):
            error = await client.error(method, session_id=sid, operationId=bad)
            assert error["code"] == INVALID_PARAMS
            assert error["message"] == (
                f"{method}: 'operationId' must be 1 to 64 letters, digits, '_', '.' or '-' "
                f"(got {shown})"
            )
    bad_wait = await client.error("session.compress", session_id=sid, wait="no")
    assert bad_wait["message"] == "session.compress: 'wait' must be a boolean"
    assert set(bad_wait["data"]) == {"operationId"}


async def test_every_error_carries_the_id_and_the_operation_records_it() -> None:
    _, client, sid = await ready_to_compact(ModelError("provider exploded", kind="fatal"))
    error = await client.error("session.compress", session_id=sid, operationId="fails")
    assert error["code"] == MODEL_FAILED
    assert error["data"] == {"kind": "fatal", "operationId": "fails"}
    assert await settled(client, sid, "fails") == {
        "operationId": "fails",
        "state": "failed",
        "error": error,
    }
    unknown_session = await client.error("session.compress", session_id="nope")
    assert unknown_session["message"] == "Unknown session: nope"
    assert set(unknown_session["data"]) == {"operationId"}


async def test_a_busy_refusal_leaves_the_id_free_and_an_abort_is_cancelled() -> None:
    kit, client, sid = await ready_to_compact(Hang(), summary())
    started = await client.call("session.compress", session_id=sid, operationId="a", wait=False)
    assert started["state"] == "running"
    await until(lambda: len(kit.model.requests) == 1)
    # Asked again while it runs: still running (without waiting), not a second compaction.
    again = await client.call("session.compress", session_id=sid, operationId="a", wait=False)
    assert again == {"operationId": "a", "state": "running"}
    busy = await client.error("session.compress", session_id=sid, operationId="b")
    assert (busy["code"], busy["data"]) == (BUSY, {"operationId": "b"})
    refused = await client.call("session.operation", session_id=sid, operationId="b")
    assert refused == {"operationId": "b", "state": "failed", "error": busy}
    assert await client.call("session.abort", session_id=sid) == {"aborted": True}
    cancelled = await settled(client, sid, "a")
    assert cancelled["state"] == "cancelled"
    assert cancelled["error"]["code"] == CANCELLED
    # "b" was refused before it started: the same request under it runs now.
    done = await client.call("session.compress", session_id=sid, operationId="b")
    assert (done["compacted"], done["operationId"]) == (True, "b")


async def test_a_second_caller_of_a_running_id_waits_for_its_outcome() -> None:
    kit, client, sid = await ready_to_compact()
    answers: list[Any] = []

    async def compress() -> None:
        answers.append(await client.call("session.compress", session_id=sid, operationId="x"))

    async with anyio.create_task_group() as group:
        for _ in range(3):  # the first runs it; the two others wait on one event
            group.start_soon(compress)
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["compacted"] is True
    assert len(kit.model.requests) == 1


async def test_waiting_for_an_operation_that_ended_returns_at_once() -> None:
    operation = OperationBook().begin("s", "x", "session.compress", "{}")
    operation.end({"ok": True})  # no one waited: no event was made, none is set
    await operation.wait()
    assert (operation.state, operation.result) == ("done", {"ok": True})


async def test_a_navigation_is_an_operation_too() -> None:
    kit = nav_kit()
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    started = await client.call(
        "session.tree.navigate", session_id=sid, target_id=ids["a1"], wait=False
    )
    done = await settled(client, sid, started["operationId"])
    assert done["state"] == "done"
    assert done["result"]["newLeafId"] == ids["a1"] == kit.session.leaf_id
    assert done["result"]["operationId"] == started["operationId"]
    error = await client.error("session.tree.navigate", session_id=sid, target_id="nope")
    assert error["message"] == "Entry nope not found"
    assert set(error["data"]) == {"operationId"}


def test_the_book_forgets_the_oldest_ended_operations_past_its_bounds() -> None:
    assert KEPT == 1000
    book = OperationBook(kept=2)
    for name in ("a", "b", "c"):
        operation = book.begin("s", name, "session.compress", "{}")
        operation.end({"ok": name})
        book.ended(operation)
    assert book.find("s", "a") is None
    assert [book.find("s", n).result for n in ("b", "c")] == [{"ok": "b"}, {"ok": "c"}]  # type: ignore[union-attr]
    assert len(book) == 2
    stale = OperationBook(kept_s=-1.0)
    operation = stale.begin("s", "old", "session.compress", "{}")
    assert stale.find("s", "old") is operation  # running: never forgotten
    operation.end(error=RpcError(BUSY, "busy"))
    stale.ended(operation)
    assert stale.find("s", "old") is None


async def test_an_operation_running_in_the_background_ends_with_the_server() -> None:
    kit, client, sid = await ready_to_compact(Hang())
    started = await client.call("session.compress", session_id=sid, wait=False)
    await until(lambda: len(kit.model.requests) == 1)
    client.hub.abort_all()  # the server stopping
    stopped = await settled(client, sid, started["operationId"])
    assert stopped["state"] == "cancelled"
    assert stopped["error"]["data"] == {
        "kind": "shutdown",
        "applied": False,
        "operationId": started["operationId"],
    }
    assert kit.session.tree.entries[-1]["type"] != "compaction"
