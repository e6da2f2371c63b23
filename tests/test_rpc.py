"""The JSON-RPC dispatcher and the session methods, without a transport."""

from __future__ import annotations

import errno
import json
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import (
    Cancelled,
    ConflictError,
    DefinitionError,
    FatalModelError,
    ModelError,
    OrchestratorError,
    SessionError,
    SessionLockedError,
    TransientModelError,
    TransitionError,
)
from orchestrator._rpc.errors import (
    BUSY,
    CANCELLED,
    CONFLICT,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT,
    METHOD_NOT_FOUND,
    MODEL_FAILED,
    PARSE_ERROR,
    SESSION_LOCKED,
    STORAGE,
    RpcError,
    error_for,
    one_line,
)
from orchestrator._rpc.hub import NO_AGENT, RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Dispatcher, Method, Params
from orchestrator._runtime.navigation.driver import BUSY as NAVIGATION_BUSY
from orchestrator._store.reports import context_report, tree_rows
from orchestrator.testing import AgentHang, Hang, reply, summary_text
from tests.runtime_kit import BIG, HubClient, Kit, summary, until
from tests.runtime_kit import settings as runtime_settings

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def kit_client(kit: Kit) -> tuple[HubClient[SessionHub], str]:
    hub = SessionHub(
        RuntimeOptions(
            summarizer=kit.summarizer,
            settings=runtime_settings(),
            runtime_kwargs={"sleep": kit.clock.sleep},
        )
    )
    return HubClient(hub), hub.add(kit.runtime)


def file_client(tmp_path: Path, **options: Any) -> HubClient[SessionHub]:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    return HubClient(SessionHub(RuntimeOptions(root=tmp_path, **options)))


def compactable_kit(*summaries: Any, hang: bool = False) -> Kit:
    turns: list[list[Any]] = [[reply("first", tokens=2000)], [reply("second", tokens=100)]]
    if hang:
        turns[1] = [AgentHang()]
    return Kit(
        turns=turns,
        summaries=list(summaries) or [summary()],
        runtime_settings=runtime_settings(adaptive_keep=False),
    )


# -- protocol ----------------------------------------------------------------------------------


def echo_dispatcher() -> Dispatcher:
    async def echo(p: Params) -> Any:
        return {"text": p.optional_text("text"), "flag": p.flag("flag")}

    async def broken(p: Params) -> Any:
        raise ValueError("boom\nsecond line")

    return Dispatcher(
        {
            "echo": Method(handler=echo, params=frozenset({"text", "flag"})),
            "broken": Method(handler=broken),
        }
    )


async def test_parse_errors_answer_with_a_null_id() -> None:
    dispatcher = echo_dispatcher()
    for line in ("{", b"\xff\xfe", "[1,"):
        answer = json.loads(await dispatcher.handle_text(line) or "")
        assert answer["id"] is None
        assert answer["error"]["code"] == PARSE_ERROR
        assert answer["error"]["message"].startswith("Parse error: ")
    assert await dispatcher.handle_text("  \t") is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (5, "not an object"),
        ({"id": 1, "method": "echo"}, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 1, "method": "echo"}, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1, "method": 7}, "method"),
        ({"jsonrpc": "2.0", "id": [1], "method": "echo"}, "id must be"),
        ({"jsonrpc": "2.0", "id": True, "method": "echo"}, "id must be"),
        ([], "empty batch"),
    ],
)
async def test_invalid_requests(message: Any, expected: str) -> None:
    answer = await echo_dispatcher().handle(message)
    # A usable id is echoed so that the client can match the error; an unusable one is null.
    usable = isinstance(message, dict) and message["id"] == 1 and message["id"] is not True
    assert answer["id"] == (1 if usable else None)
    assert answer["error"]["code"] == INVALID_REQUEST
    assert expected in answer["error"]["message"]


async def test_method_not_found_and_parameter_checks() -> None:
    dispatcher = echo_dispatcher()

    async def error(params: Any) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": "a", "method": "echo", "params": params}
        answer = await dispatcher.handle(message)
        assert answer["id"] == "a"
        return dict(answer["error"])

    missing = await dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": "nope"})
    assert missing["error"] == {"code": METHOD_NOT_FOUND, "message": "Method not found: nope"}
    assert (await error(["x"]))["code"] == INVALID_PARAMS
    assert (await error({"other": 1}))["message"] == "echo: unknown parameter 'other'"
    assert (await error({"text": True}))["message"] == "echo: 'text' must be a string"
    assert (await error({"text": 5}))["message"] == "echo: 'text' must be a string"
    assert (await error({"flag": 1}))["message"] == "echo: 'flag' must be a boolean"
    ok = await dispatcher.handle(
        {"jsonrpc": "2.0", "id": 2.5, "method": "echo", "params": {"text": None, "flag": True}}
    )
    assert ok == {"jsonrpc": "2.0", "id": 2.5, "result": {"text": None, "flag": True}}


async def test_required_text_parameters() -> None:
    p = Params("m", {"a": "", "b": "x"})
    with pytest.raises(RpcError, match="'a' must be a non-empty string"):
        p.text("a")
    with pytest.raises(RpcError, match="m: missing parameter 'c'"):
        p.text("c")
    assert p.text("b") == "x"


async def test_a_bug_in_a_handler_is_an_internal_error_on_one_line() -> None:
    answer = await echo_dispatcher().handle({"jsonrpc": "2.0", "id": 1, "method": "broken"})
    assert answer["error"] == {
        "code": INTERNAL_ERROR,
        "message": "Internal error: ValueError: boom second line",
    }


async def test_notifications_get_no_answer_even_when_they_fail() -> None:
    dispatcher = echo_dispatcher()
    assert await dispatcher.handle({"jsonrpc": "2.0", "method": "echo"}) is None
    assert await dispatcher.handle({"jsonrpc": "2.0", "method": "nope"}) is None
    assert await dispatcher.handle({"jsonrpc": "2.0", "method": "broken"}) is None
    # A malformed notification is not a notification: it is answered.
    assert (await dispatcher.handle({"method": "echo"}))["error"]["code"] == INVALID_REQUEST


async def test_batches_answer_in_order_and_omit_notifications() -> None:
    dispatcher = echo_dispatcher()
    answers = await dispatcher.handle(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "a"}},
            {"jsonrpc": "2.0", "method": "echo"},
            {"jsonrpc": "2.0", "id": 2, "method": "nope"},
            3,
        ]
    )
    assert [a["id"] for a in answers] == [1, 2, None]
    assert answers[0]["result"]["text"] == "a"
    assert [a.get("error", {}).get("code") for a in answers] == [
        None,
        METHOD_NOT_FOUND,
        INVALID_REQUEST,
    ]
    assert await dispatcher.handle([{"jsonrpc": "2.0", "method": "echo"}]) is None
    text = await dispatcher.handle_text('[{"jsonrpc":"2.0","id":9,"method":"echo"}]')
    assert json.loads(text or "")[0]["id"] == 9


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (Cancelled("Compaction cancelled"), CANCELLED),
        (TransientModelError("rate\nlimited"), MODEL_FAILED),
        (SessionLockedError("held"), SESSION_LOCKED),
        (ConflictError("changed since it was read"), CONFLICT),
        (SessionError("Entry x not found"), INVALID_PARAMS),
        (TransitionError("turn", "running", "navigate"), BUSY),
        (OrchestratorError("odd"), INTERNAL_ERROR),
        (KeyError("k"), INTERNAL_ERROR),
        (RpcError(BUSY, "as is"), BUSY),
    ],
)
def test_error_codes(error: Exception, code: int) -> None:
    mapped = error_for(error)
    assert mapped.code == code
    assert "\n" not in str(mapped)
    if isinstance(error, ModelError):
        assert (str(mapped), mapped.data) == ("rate limited", {"kind": "transient"})
    if isinstance(error, (ConflictError, SessionLockedError)):
        assert mapped.data["applied"] is False
    assert str(error_for(Cancelled())) == "Cancelled"


def _raised(make: Any) -> BaseException:
    try:
        make()
    except BaseException as error:  # noqa: BLE001 - the test looks at what was raised
        return error
    raise AssertionError("nothing raised")


def _wrapped_in_a_table(number: int) -> None:
    try:
        raise OSError(number, os.strerror(number), "navigation.toml")
    except OSError as exc:
        raise DefinitionError(f"navigation.toml: cannot read: {exc}") from exc


def _raised_while_handling(number: int) -> None:
    try:
        raise OSError(number, os.strerror(number))
    except OSError:
        raise KeyError("while handling it")  # noqa: B904 - the implicit context is the point


def _hidden_while_handling(number: int) -> None:
    try:
        raise OSError(number, os.strerror(number))
    except OSError:
        raise KeyError("while handling it") from None


def _model_error_from(number: int) -> None:
    raise FatalModelError("[Errno] commit failed") from OSError(number, os.strerror(number))


@pytest.mark.parametrize("number", [errno.EMFILE, errno.ENFILE])
@pytest.mark.parametrize("make", [_wrapped_in_a_table, _raised_while_handling, _model_error_from])
def test_a_descriptor_shortage_anywhere_in_the_chain_is_the_servers_limit(
    make: Any, number: int
) -> None:
    # A lazily read table, an exception raised while handling the OSError, a commit's failure
    # carried by a ModelError: each was -32603 (or -32002, "model failed") before.
    mapped = error_for(_raised(partial(make, number)), "session.compress")
    assert mapped.code == LIMIT
    assert str(mapped) == (
        f"session.compress: the server has too many files open ({os.strerror(number)}); "
        "close sessions, or raise its limit (ulimit -n)"
    )


def test_other_system_errors_keep_their_codes() -> None:
    assert error_for(_raised(partial(_wrapped_in_a_table, errno.EACCES))).code == INTERNAL_ERROR
    # A disk that refused a write is the server's storage, named as such (it was -32002,
    # "model failed", for a commit, and -32603 for a journal's record).
    assert error_for(_raised(partial(_model_error_from, errno.ENOSPC))).code == STORAGE
    assert error_for(_raised(partial(_wrapped_in_a_table, errno.EIO))).data == {"kind": "storage"}
    # A context the code chose to hide (raise ... from None) is not followed.
    hidden = _raised(partial(_hidden_while_handling, errno.EMFILE))
    assert error_for(hidden).code == INTERNAL_ERROR


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["jsonrpc", "id", "method", "params", "x"]) | st.text(max_size=4),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    message=json_values
    | st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.sampled_from(["echo", "broken", "nope"])},
        optional={"id": st.integers() | st.text(max_size=3) | st.none(), "params": json_values},
    )
)
def test_any_json_gets_a_well_formed_answer_or_none(message: Any) -> None:
    async def run() -> Any:
        return await echo_dispatcher().handle_text(json.dumps(message))

    text = anyio.run(run)
    if text is None:
        return
    answers = json.loads(text)
    for answer in answers if isinstance(answers, list) else [answers]:
        assert answer["jsonrpc"] == "2.0"
        assert "id" in answer
        assert ("result" in answer) != ("error" in answer)
        if "error" in answer:
            assert isinstance(answer["error"]["code"], int)
            assert answer["error"]["message"] == one_line(answer["error"]["message"])


# -- sessions: open, list, close ---------------------------------------------------------------


async def test_open_list_and_reopen_return_the_same_session(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    opened = await client.call("session.open", path="example.jsonl")
    assert opened["path"] == str(tmp_path / "example.jsonl")
    assert (opened["entries"], opened["leafId"]) == (43, "935170bb")
    assert opened["problems"] == []
    assert opened["settled"] == []
    again = await client.call("session.open", path=str(tmp_path / "example.jsonl"))
    assert again["session_id"] == opened["session_id"]
    listed = await client.call("session.list")
    assert [s["session_id"] for s in listed["sessions"]] == [opened["session_id"]]
    assert listed["sessions"][0]["state"] == "idle"
    assert listed["sessions"][0]["busy"] is False
    assert await client.call("session.close", session_id=opened["session_id"]) == {"closed": True}
    assert (await client.call("session.list")) == {"sessions": []}
    error = await client.error("session.tree", session_id=opened["session_id"])
    assert error == {"code": INVALID_PARAMS, "message": f"Unknown session: {opened['session_id']}"}


async def test_open_refusals(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    (tmp_path / "notes.jsonl").write_text("hello\n")
    shutil.copy(EXAMPLE, tmp_path / "copy.jsonl")
    await client.call("session.open", path="example.jsonl")
    cases = {
        "missing.jsonl": "missing.jsonl: no such session file",
        "../outside.jsonl": "../outside.jsonl: outside the served directory",
        "copy.jsonl": "is already open from",
        "notes.jsonl": "not a session file",
    }
    for path, message in cases.items():
        error = await client.error("session.open", path=path)
        assert error["code"] == INVALID_PARAMS, error
        assert message in error["message"], error
    created = await client.call("session.open", path="new.jsonl", create=True)
    assert (created["entries"], created["leafId"]) == (0, None)


async def test_relative_paths_without_a_root_resolve_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(EXAMPLE, tmp_path / "example.jsonl")
    monkeypatch.chdir(tmp_path)
    client = HubClient(SessionHub())
    opened = await client.call("session.open", path="example.jsonl")
    assert opened["path"] == str(tmp_path / "example.jsonl")


# -- session.compress --------------------------------------------------------------------------


async def test_compress_commits_and_reports_the_summary() -> None:
    kit = compactable_kit()
    client, sid = kit_client(kit)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    result = await client.call(
        "session.compress", session_id=sid, focus="Preserve decisions and unresolved constraints"
    )
    entry = kit.session.tree.entries[-1]
    assert result == {
        "compacted": True,
        "entryId": entry["id"],
        "summary": entry["summary"],
        "tokensBefore": entry["tokensBefore"],
        "firstKeptEntryId": entry["firstKeptEntryId"],
        "shortSummary": None,  # not asked for (RuntimeSettings.short_summary)
        "operationId": ANY,  # the server's (tests/test_rpc_operations.py)
    }
    assert "Preserve decisions and unresolved constraints" in kit.model.requests[0].prompt
    statuses = [
        m["params"]["event"].get("status")
        for m in client.events
        if m["params"]["event"]["type"] == "compaction_update"
    ]
    assert statuses == ["in_progress", "completed"]
    assert "transition" not in client.event_types()
    assert {m["params"]["session_id"] for m in client.events} == {sid}
    again = await client.call("session.compress", session_id=sid)
    assert again == {"compacted": False, "reason": "Already compacted", "operationId": ANY}


async def test_d12_nothing_to_compact_is_a_result_not_an_error() -> None:
    kit = Kit(turns=[[reply("hi", tokens=10)]])
    client, sid = kit_client(kit)
    await kit.runtime.prompt("short")
    result = await client.call("session.compress", session_id=sid)
    assert result == {
        "compacted": False,
        "reason": "Nothing to compact (session too small)",
        "operationId": ANY,
    }
    assert kit.model.requests == []


async def test_compress_model_failure_is_32002_and_changes_nothing() -> None:
    kit = compactable_kit(FatalModelError("provider exploded"))
    client, sid = kit_client(kit)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    before = list(kit.session.tree.entries)
    error = await client.error("session.compress", session_id=sid)
    assert error["code"] == MODEL_FAILED
    assert "provider exploded" in error["message"]
    assert kit.session.tree.entries == before


async def test_compress_cancelled_by_abort_is_32003_and_changes_nothing() -> None:
    kit = compactable_kit(Hang())
    client, sid = kit_client(kit)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    before, leaf = list(kit.session.tree.entries), kit.session.leaf_id
    answers: list[dict[str, Any]] = []

    async def compress() -> None:
        answers.append(await client.error("session.compress", session_id=sid))

    async with anyio.create_task_group() as group:
        group.start_soon(compress)
        await until(lambda: len(kit.model.requests) == 1)
        second = await client.error("session.compress", session_id=sid)
        assert second == {
            "code": BUSY,
            "message": "A compaction is already running in this session",
            "data": {"operationId": ANY},
        }
        closing = await client.error("session.close", session_id=sid)
        assert closing["code"] == BUSY
        assert await client.call("session.abort", session_id=sid) == {"aborted": True}
    assert answers == [
        {"code": CANCELLED, "message": "Compaction cancelled", "data": {"operationId": ANY}}
    ]
    assert (kit.session.tree.entries, kit.session.leaf_id) == (before, leaf)


async def test_d22_compress_while_a_prompt_hangs_stops_the_turn_and_does_not_resume_it() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [AgentHang()], [reply("not used")]],
        summaries=[summary()],
        runtime_settings=runtime_settings(adaptive_keep=False),
    )
    client, sid = kit_client(kit)
    await client.call("session.prompt", session_id=sid, text=BIG)
    prompts: list[dict[str, Any]] = []

    async def prompt() -> None:
        prompts.append(await client.call("session.prompt", session_id=sid, text=BIG))

    async with anyio.create_task_group() as group:
        group.start_soon(prompt)
        await until(lambda: kit.runtime.state == "running")
        listed = await client.call("session.list")
        assert listed["sessions"][0]["busy"] is True
        compressed = await client.call("session.compress", session_id=sid, focus="keep it")
    assert compressed["compacted"] is True
    assert [(p["state"], p["queued"]) for p in prompts] == [("idle", False)]
    assert kit.agent.remaining == 1  # the interrupted turn was not resumed
    assert kit.entry_types()[-1] == "compaction"
    assert kit.runtime.state == "idle"


# -- session.tree, session.context -------------------------------------------------------------


async def test_tree_and_context_match_the_inspection_commands(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    runtime = client.hub.runtime(sid)
    tree = await client.call("session.tree", session_id=sid)
    assert tree == {
        "sessionId": sid,
        "name": runtime.session.tree.session_name(),
        "leafId": "935170bb",
        "nodes": tree_rows(runtime.session),
    }
    context = await client.call("session.context", session_id=sid)
    assert context == json.loads(json.dumps(context_report(runtime.session, "935170bb")))


# -- session.tree.navigate ---------------------------------------------------------------------


async def conversation(kit: Kit) -> dict[str, str]:
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


def nav_kit(*summaries: Any) -> Kit:
    return Kit(
        turns=[[reply("answer one")], [reply("answer two")], [AgentHang()]],
        summaries=list(summaries) or [summary(summary_text("Tried another way."))],
    )


async def test_navigate_to_a_user_message_with_a_summary_and_a_label() -> None:
    kit = nav_kit()
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    result = await client.call(
        "session.tree.navigate",
        session_id=sid,
        target_id=ids["u2"],
        summarize=True,
        focus="note the files",
        label="retry",
    )
    assert result["editorText"] == "second question"
    assert (result["oldLeafId"], result["cancelled"], result["aborted"]) == (
        ids["a2"],
        False,
        False,
    )
    summary_entry = kit.session.tree.by_id[result["summaryEntryId"]]
    assert summary_entry["fromId"] == ids["a2"]
    assert "Additional focus: note the files" in kit.model.requests[0].prompt
    assert kit.session.tree.labels[result["summaryEntryId"]] == "retry"
    assert "session_tree" in client.event_types()


async def test_navigate_refusals() -> None:
    kit = nav_kit()
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    error = await client.error("session.tree.navigate", session_id=sid, target_id="nope")
    assert error == {
        "code": INVALID_PARAMS,
        "message": "Entry nope not found",
        "data": {"operationId": ANY},
    }
    error = await client.error(
        "session.tree.navigate", session_id=sid, target_id=ids["a1"], summarize="yes"
    )
    assert error["message"] == "session.tree.navigate: 'summarize' must be a boolean"
    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "third")
        await until(lambda: kit.runtime.state == "running")
        error = await client.error("session.tree.navigate", session_id=sid, target_id=ids["a1"])
        assert error == {
            "code": BUSY,
            "message": NAVIGATION_BUSY,
            "data": {"operationId": ANY},
        }
        await client.call("session.abort", session_id=sid)
    assert (await client.call("session.abort", session_id=sid)) == {"aborted": False}


async def test_navigate_refuses_instructions_without_a_summary() -> None:
    # As the command line refuses --focus without --summarize: a focus would be dropped unheard.
    kit = nav_kit()
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    error = await client.error(
        "session.tree.navigate", session_id=sid, target_id=ids["u2"], focus="note the files"
    )
    assert error["code"] == INVALID_PARAMS
    assert "'focus'" in error["message"]
    assert 'add "summarize": true' in error["message"]
    error = await client.error(
        "session.tree.navigate",
        session_id=sid,
        target_id=ids["u2"],
        summarize=False,
        replace_instructions=True,
    )
    assert error["code"] == INVALID_PARAMS
    error = await client.error(
        "session.tree.navigate",
        session_id=sid,
        target_id=ids["u2"],
        summarize=True,
        replace_instructions=True,
    )
    assert error["code"] == INVALID_PARAMS
    assert "'replace_instructions' needs 'focus'" in error["message"]
    # Nothing moved, nothing was written, no model was asked.
    assert kit.session.leaf_id == ids["a2"]
    assert list(kit.session.tree.entries) == before
    assert kit.model.requests == []


async def test_navigation_in_progress_blocks_other_work_and_abort_cancels_it() -> None:
    kit = nav_kit(Hang())
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    results: list[dict[str, Any]] = []

    async def navigate() -> None:
        results.append(
            await client.call(
                "session.tree.navigate", session_id=sid, target_id=ids["a1"], summarize=True
            )
        )

    async with anyio.create_task_group() as group:
        group.start_soon(navigate)
        await until(lambda: len(kit.model.requests) == 1)
        for method, params in [
            ("session.tree.navigate", {"target_id": ids["u1"]}),
            ("session.compress", {}),
            ("session.prompt", {"text": "hi"}),
            ("session.close", {}),
        ]:
            error = await client.error(method, session_id=sid, **params)
            assert error["code"] == BUSY, (method, error)
        assert await client.call("session.abort", session_id=sid) == {"aborted": True}
    assert results[0]["cancelled"] is True
    assert results[0]["aborted"] is True
    assert kit.session.leaf_id == ids["a2"]


async def test_navigate_summary_failure_is_32002() -> None:
    kit = nav_kit(FatalModelError("no summary today"))
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    error = await client.error(
        "session.tree.navigate", session_id=sid, target_id=ids["a1"], summarize=True
    )
    assert error["code"] == MODEL_FAILED
    assert "no summary today" in error["message"]
    assert kit.session.leaf_id == ids["a2"]


# -- session.fork ------------------------------------------------------------------------------


async def test_fork_opens_and_registers_the_new_session(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    forked = await client.call(
        "session.fork", session_id=sid, entry_id="ec48c90d", path="fork.jsonl"
    )
    assert forked["cancelled"] is False
    assert forked["session_id"] != sid
    assert forked["path"] == str(tmp_path / "fork.jsonl")
    assert forked["editorText"].startswith("Keep Decimal.")
    assert (tmp_path / "fork.jsonl").is_file()
    tree = await client.call("session.tree", session_id=forked["session_id"])
    ids = [node["id"] for node in tree["nodes"]]
    assert "4e114f5c" in ids
    assert "ec48c90d" not in ids
    listed = [s["session_id"] for s in (await client.call("session.list"))["sessions"]]
    assert listed == [sid, forked["session_id"]]
    # The fork is a session like the others (its path is small: nothing to compact).
    compressed = await client.call("session.compress", session_id=forked["session_id"])
    assert compressed == {
        "compacted": False,
        "reason": "Nothing to compact (session too small)",
        "operationId": ANY,
    }


async def test_a_fork_at_the_first_user_message_is_written_at_once(tmp_path: Path) -> None:
    # Its path holds no assistant message (pi would defer writing it): the file named is there
    # all the same, and a second fork to it is "already exists", not this server's own lock.
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    forked = await client.call(
        "session.fork", session_id=sid, entry_id="daa66d13", path="first.jsonl"
    )
    assert forked["cancelled"] is False
    written = (tmp_path / "first.jsonl").read_bytes().splitlines()
    assert json.loads(written[0])["type"] == "session"
    error = await client.error(
        "session.fork", session_id=sid, entry_id="daa66d13", path="first.jsonl"
    )
    assert error["code"] == INVALID_PARAMS
    assert "first.jsonl: already exists" in error["message"]
    beside = await client.call("session.fork", session_id=sid, entry_id="daa66d13")
    assert beside["path"] == str(tmp_path / "example.fork1.jsonl")
    assert (tmp_path / "example.fork1.jsonl").is_file()


async def test_fork_refusals_and_hook_cancel() -> None:
    kit = nav_kit()
    client, sid = kit_client(kit)
    ids = await conversation(kit)
    error = await client.error("session.fork", session_id=sid, entry_id=ids["a1"])
    assert error == {
        "code": INVALID_PARAMS,
        "message": f"Invalid entry ID for forking: {ids['a1']} is an assistant message; "
        "a fork starts before a user message",
    }
    in_memory = await client.call("session.fork", session_id=sid, entry_id=ids["u2"])
    assert in_memory["path"].startswith("<memory")
    kit.runtime.hooks.on("session_before_fork", lambda p: {"cancel": True})
    cancelled = await client.call("session.fork", session_id=sid, entry_id=ids["u2"])
    assert cancelled == {
        "session_id": None,
        "path": None,
        "editorText": "second question",
        "cancelled": True,
    }


async def test_fork_onto_an_existing_file_or_outside_the_root(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    error = await client.error(
        "session.fork", session_id=sid, entry_id="ec48c90d", path="example.jsonl"
    )
    assert error["code"] == INVALID_PARAMS
    assert "already exists" in error["message"]
    error = await client.error(
        "session.fork", session_id=sid, entry_id="ec48c90d", path="/elsewhere/f.jsonl"
    )
    assert error["code"] == INVALID_PARAMS
    assert "outside the served directory" in error["message"]


# -- session.prompt, session.abort -------------------------------------------------------------


async def test_prompt_returns_the_reply_and_queues_behind_a_running_turn() -> None:
    kit = Kit(turns=[[reply("hello there")], [AgentHang()], [reply("after")]])
    client, sid = kit_client(kit)
    result = await client.call("session.prompt", session_id=sid, text="hi")
    assert result["state"] == "idle"
    assert result["queued"] is False
    assert result["reply"]["content"][0]["text"] == "hello there"
    async with anyio.create_task_group() as group:
        group.start_soon(partial(client.call, "session.prompt", session_id=sid, text="hang"))
        await until(lambda: kit.runtime.state == "running")
        queued = await client.call("session.prompt", session_id=sid, text="later")
        assert queued["queued"] is True
        await client.call("session.abort", session_id=sid)
    assert "message" in client.event_types()


async def test_prompt_without_an_agent_is_refused(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    error = await client.error("session.prompt", session_id=sid, text="hi")
    assert error == {"code": METHOD_NOT_FOUND, "message": NO_AGENT}


async def test_sessions_opened_by_the_hub_get_an_agent_from_the_factory(tmp_path: Path) -> None:
    from orchestrator.testing import ScriptedAgent

    agent = ScriptedAgent([[reply("from the factory")]])
    client = file_client(tmp_path, agent_factory=lambda: agent)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    result = await client.call("session.prompt", session_id=sid, text="hi")
    assert result["reply"]["content"][0]["text"] == "from the factory"


async def test_close_all_releases_everything(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    await client.call("session.open", path="example.jsonl")
    client.hub.abort_all()
    client.hub.close_all()
    assert await client.call("session.list") == {"sessions": []}


# -- hostile input (a hardened server) ---------------------------------------------------------


def refuse_constant(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


async def test_nan_infinity_and_overflowing_ids_are_never_echoed() -> None:
    dispatcher = echo_dispatcher()
    for line, code in [
        ('{"jsonrpc":"2.0","id":NaN,"method":"echo"}', PARSE_ERROR),
        ('{"jsonrpc":"2.0","id":-Infinity,"method":"echo"}', PARSE_ERROR),
        ('{"jsonrpc":"2.0","id":1e400,"method":"echo"}', INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":' + "9" * 5000 + ',"method":"echo"}', PARSE_ERROR),
    ]:
        text = await dispatcher.handle_text(line) or ""
        answer = json.loads(text, parse_constant=refuse_constant)
        assert (answer["id"], answer["error"]["code"]) == (None, code), line


async def test_deep_nesting_is_refused_before_any_handler() -> None:
    dispatcher = echo_dispatcher()
    for depth in (33, 1200, 100_000):
        text = await dispatcher.handle_text("[" * depth + "]" * depth)
        error = json.loads(text or "")["error"]
        assert error["code"] in (PARSE_ERROR, INVALID_REQUEST)
        assert "nested deeper than 32" in error["message"]
    deep_params = {"text": "x", "flag": False}
    for _ in range(40):
        deep_params = {"x": deep_params}
    answer = await dispatcher.handle(
        {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": deep_params}
    )
    assert answer["error"]["code"] == INVALID_REQUEST


async def test_a_batch_over_the_bound_is_refused_whole() -> None:
    calls = [{"jsonrpc": "2.0", "id": n, "method": "broken"} for n in range(65)]
    answer = await echo_dispatcher().handle(calls)
    assert answer == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": INVALID_REQUEST,
            "message": "Invalid request: a batch of 65 requests; at most 64 are accepted",
        },
    }
    assert len(await echo_dispatcher().handle(calls[:64])) == 64


async def test_a_result_json_cannot_hold_is_an_internal_error_for_that_request() -> None:
    async def nan(p: Params) -> Any:
        return {"value": float("nan")}

    dispatcher = Dispatcher({"nan": Method(handler=nan), **echo_dispatcher().methods})
    text = await dispatcher.handle_text(
        '[{"jsonrpc":"2.0","id":1,"method":"nan"},{"jsonrpc":"2.0","id":2,"method":"echo"}]'
    )
    first, second = json.loads(text or "")
    assert first["id"] == 1
    assert first["error"]["code"] == INTERNAL_ERROR
    assert "not encodable" in first["error"]["message"]
    assert second["result"] == {"text": None, "flag": False}


async def test_bad_paths_are_invalid_params_not_internal_errors(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    (tmp_path / "folder").mkdir()
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("session.open", {"path": "a\x00b"}, "a path cannot hold a NUL character"),
        ("session.open", {"path": "folder", "create": True}, "folder: not a regular file"),
        ("session.open", {"path": "folder"}, "folder: is a directory, not a session file"),
        (
            "session.fork",
            {"session_id": sid, "entry_id": "ec48c90d", "path": "missing/f.jsonl"},
            "missing",  # the folder is named, whichever layer notices
        ),
        (
            "session.fork",
            {"session_id": sid, "entry_id": "ec48c90d", "path": "f\x00.jsonl"},
            "a path cannot hold a NUL character",
        ),
    ]
    for method, params, message in cases:
        error = await client.error(method, **params)
        assert error["code"] == INVALID_PARAMS, (method, params, error)
        assert message in error["message"], error


async def test_a_name_over_255_bytes_is_invalid_params_not_an_internal_error(
    tmp_path: Path,
) -> None:
    # session.open of such a name was -32603 (OSError: File name too long), a server bug.
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    long = "a" * 256
    cases: list[tuple[str, dict[str, Any]]] = [
        ("session.open", {"path": f"{long}.jsonl"}),
        ("session.open", {"path": f"{long}/s.jsonl"}),
        ("session.open", {"path": f"{long}.jsonl", "create": True}),
        ("session.fork", {"session_id": sid, "entry_id": "ec48c90d", "path": f"{long}.jsonl"}),
    ]
    for method, params in cases:
        error = await client.error(method, **params)
        assert error["code"] == INVALID_PARAMS, (method, params, error)
        assert error["message"].endswith("File name too long"), error
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("a")]  # nothing written


async def test_a_skipped_compress_reports_skipped_not_completed(tmp_path: Path) -> None:
    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    assert (await client.call("session.compress", session_id=sid))["compacted"] is True
    client.events.clear()
    again = await client.call("session.compress", session_id=sid)
    assert again == {"compacted": False, "reason": "Already compacted", "operationId": ANY}
    statuses = [
        m["params"]["event"]["status"]
        for m in client.events
        if m["params"]["event"]["type"] == "compaction_update"
    ]
    assert statuses == ["in_progress", "skipped"]
    client.hub.close_all()
    journal = (tmp_path / "example.jsonl.journal").read_text().splitlines()
    last = [json.loads(line) for line in journal if '"machine":"operation"' in line][-1]
    assert (last["to"], last["data"]["reason"]) == ("skipped", "Already compacted")


async def test_a_listener_that_raises_does_not_break_the_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = file_client(tmp_path)

    def broken(message: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    client.hub.listen(broken)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    assert (await client.call("session.compress", session_id=sid))["compacted"] is True
    assert "compaction_update" in client.event_types()  # later listeners still got them
    assert "event listener failed: RuntimeError('listener bug')" in capsys.readouterr().err


async def test_line_listeners_get_each_event_encoded_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 9: one encoding per event, however many connections receive it."""
    from orchestrator._rpc.protocol import Peer, encode

    client = file_client(tmp_path)
    sid = (await client.call("session.open", path="example.jsonl"))["session_id"]
    peers = [Peer(), Peer(), Peer()]
    peers[0].topics.add(sid)
    peers[1].topics.add(sid)  # peers[2] did not open the session: it hears nothing
    lines: list[list[str]] = [[], [], []]

    def broken(line: str) -> None:
        raise RuntimeError("line listener bug")

    client.hub.listen_lines(broken, peers[0])
    stops = [client.hub.listen_lines(lines[i].append, peers[i]) for i in range(3)]
    client.hub.runtime(sid).events.emit("message", n=1, text="é\ud800")
    (first,), (second,), third = lines
    assert first is second  # the same string: encoded once
    assert third == []
    assert first == encode(client.events[-1])
    assert "\\ud800" in first  # a lone surrogate escaped, as every line the server sends
    assert "event listener failed: RuntimeError('line listener bug')" in capsys.readouterr().err
    stops[0]()
    client.hub.runtime(sid).events.emit("message", n=2, text="x")
    assert (len(lines[0]), len(lines[1])) == (1, 2)


async def test_an_open_path_finds_its_session_until_the_last_holding_it_closes(
    tmp_path: Path,
) -> None:
    from orchestrator._runtime.session import AgentSession

    client = file_client(tmp_path)
    first = (await client.call("session.open", path="example.jsonl"))["session_id"]
    copies = {}
    for name in ("b", "c", "d"):
        lines = EXAMPLE.read_text().splitlines()
        header = json.loads(lines[0])
        header["id"] = f"session-{name}"
        copies[name] = tmp_path / f"{name}.jsonl"
        copies[name].write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    await client.call("session.open", path="d.jsonl")  # another path, open meanwhile
    # More open sessions under the same path (the hub's add() takes any path it is given).
    b, c = (
        client.hub.add(
            AgentSession.open(copies[name], owner="test"), str(tmp_path / "example.jsonl")
        )
        for name in ("b", "c")
    )

    async def opened() -> str:
        answer = await client.call("session.open", path="example.jsonl")
        return str(answer["session_id"])

    assert await opened() == first  # the first one opened from it
    await client.call("session.close", session_id=b)
    assert await opened() == first
    await client.call("session.close", session_id=first)
    assert await opened() == c  # then the next still holding the path
    await client.call("session.close", session_id=c)
    assert await opened() == first  # then the file itself, opened anew
    client.hub.close_all()
