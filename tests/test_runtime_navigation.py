"""Tree navigation, branch summaries and forks through the runtime (pi's navigateTree and fork)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._core.errors import ConflictError, SessionError, SessionLockedError
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session
from orchestrator.testing import AgentHang, Hang, ScriptedModel, reply, summary_text
from tests.runtime_kit import Kit, summary, until

pytestmark = pytest.mark.anyio

BRANCH_SUMMARY = summary_text("Tried another approach.")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def conversation(kit: Kit) -> dict[str, str]:
    """u1 a1 u2 a2 (a2 is the leaf). Returns the ids by name."""
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


def nav_kit(summaries: list[Any] | None = None) -> Kit:
    return Kit(
        turns=[[reply("answer one")], [reply("answer two")], [reply("answer three")]],
        summaries=summaries or [summary(BRANCH_SUMMARY)],
    )


async def test_root_user_target_returns_editor_text_and_empties_the_leaf() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["u1"])
    assert result.editor_text == "first question"
    assert kit.session.leaf_id is None
    assert result.summary_entry is None
    assert len(kit.session.tree.entries) == 4  # no summarize: no new entries


async def test_assistant_target_becomes_the_leaf_without_editor_text() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["a1"])
    assert result.editor_text is None
    assert kit.session.leaf_id == ids["a1"]
    assert kit.session.context().entry_ids == (ids["u1"], ids["a1"])


async def test_same_position_is_a_no_op() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["a2"], summarize=True)
    assert result.new_leaf_id == ids["a2"]
    assert kit.model.requests == []
    assert len(kit.session.tree.entries) == 4


async def test_d17_summary_under_nested_user_target_names_the_abandoned_leaf() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["u2"], summarize=True, instructions="note the files")
    entry = result.summary_entry
    assert entry is not None
    assert entry["parentId"] == ids["a1"]  # sibling of the re-edited user message
    assert entry["fromId"] == ids["a2"]  # D17: the abandoned leaf
    assert "the user explored a different branch" in entry["summary"].split("\n")[0]
    assert BRANCH_SUMMARY in entry["summary"]
    assert result.editor_text == "second question"
    assert kit.session.leaf_id == entry["id"]
    assert len(kit.session.tree.children_of(ids["a1"])) == 2
    assert "Additional focus: note the files" in kit.model.requests[0].prompt


async def test_summary_at_the_root_has_no_parent() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["u1"], summarize=True)
    assert result.summary_entry is not None
    assert result.summary_entry["parentId"] is None
    assert kit.session.leaf_id == result.summary_entry["id"]


async def test_assistant_target_gets_the_summary_as_child() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert result.summary_entry is not None
    assert result.summary_entry["parentId"] == ids["a1"]
    roles = [m["role"] for m in kit.session.context().messages]
    assert roles == ["user", "assistant", "branchSummary"]


async def test_d22_abort_during_branch_summary_leaves_everything_unchanged() -> None:
    kit = nav_kit(summaries=[Hang()])
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    results = []

    async def go() -> None:
        results.append(await kit.runtime.navigate(ids["a1"], summarize=True))

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: len(kit.model.requests) == 1)
        kit.runtime.abort_branch_summary()
    assert results[0].cancelled is True
    assert results[0].aborted is True
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]


async def test_navigation_is_refused_while_a_turn_runs() -> None:
    kit = Kit(turns=[[reply("one")], [AgentHang()]])
    await kit.runtime.prompt("first")
    first_user = kit.session.tree.entries[0]["id"]
    errors = []

    async def navigate() -> None:
        await until(lambda: kit.runtime.state == "running")
        try:
            await kit.runtime.navigate(first_user)
        except SessionError as exc:
            errors.append(str(exc))
        kit.runtime.abort()

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "second")
        group.start_soon(navigate)
    assert errors
    assert "Cannot navigate while the agent is working" in errors[0]


async def test_unknown_target_errors() -> None:
    kit = nav_kit()
    await conversation(kit)
    with pytest.raises(SessionError, match="Entry nope not found"):
        await kit.runtime.navigate("nope")


async def test_before_tree_hook_can_cancel_or_supply_the_summary() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    remove = kit.runtime.hooks.on("session_before_tree", lambda p: {"cancel": True})
    result = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert result.cancelled is True
    assert kit.session.leaf_id == ids["a2"]
    remove()
    kit.runtime.hooks.on("session_before_tree", lambda p: {"summary": {"summary": "from hook"}})
    trees: list[dict[str, Any]] = []
    kit.runtime.hooks.on("session_tree", trees.append)
    result = await kit.runtime.navigate(ids["a1"], summarize=True)
    assert result.summary_entry is not None
    assert result.summary_entry["summary"] == "from hook"
    assert result.summary_entry["fromExtension"] is True
    assert kit.model.requests == []
    assert trees[0]["fromExtension"] is True
    assert trees[0]["oldLeafId"] == ids["a2"]


async def test_label_goes_on_the_summary_or_the_target() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.navigate(ids["a1"], label="checkpoint")
    assert kit.session.tree.labels == {ids["a1"]: "checkpoint"}
    result = await kit.runtime.navigate(ids["a2"], summarize=True, label="explored")
    assert result.summary_entry is not None
    assert kit.session.tree.labels[result.summary_entry["id"]] == "explored"


async def test_branch_switching_scenario_keeps_both_branches() -> None:
    kit = nav_kit(summaries=[summary(BRANCH_SUMMARY)])
    ids = await conversation(kit)
    await kit.runtime.navigate(ids["u2"], summarize=True)
    await kit.runtime.prompt("second question, rephrased")
    context = kit.session.context()
    assert [m["role"] for m in context.messages] == [
        "user",
        "assistant",
        "branchSummary",
        "user",
        "assistant",
    ]
    assert kit.session.tree.by_id[ids["a2"]]  # the old branch is still there


async def test_fork_from_the_middle_writes_a_new_file(tmp_path: Path) -> None:
    kit = nav_kit()
    kit.runtime.session = Session.open(tmp_path / "s.jsonl")
    kit.session = kit.runtime.session
    ids = await conversation(kit)
    result = await kit.runtime.fork(ids["u2"])
    assert result.session is not None
    assert result.editor_text == "second question"
    assert [e["id"] for e in result.session.tree.entries] == [ids["u1"], ids["a1"]]
    assert result.session.header["parentSession"] == str(tmp_path / "s.jsonl")
    assert (tmp_path / "s.fork1.jsonl").is_file()
    reopened = Session.open(tmp_path / "s.fork1.jsonl")
    assert [e["id"] for e in reopened.tree.entries] == [ids["u1"], ids["a1"]]
    assert kit.of("session_fork")[0]["entryId"] == ids["u2"]


async def test_fork_from_the_first_message_and_refusals() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    result = await kit.runtime.fork(ids["u1"])
    assert result.session is not None
    assert len(result.session.tree) == 0
    with pytest.raises(SessionError, match="Invalid entry ID for forking"):
        await kit.runtime.fork(ids["a1"])
    kit.runtime.hooks.on("session_before_fork", lambda p: {"cancel": True})
    assert (await kit.runtime.fork(ids["u2"])).cancelled is True


async def test_work_is_refused_while_a_branch_summary_is_written() -> None:
    kit = nav_kit(summaries=[Hang()])
    ids = await conversation(kit)
    refusals: list[str] = []

    async def interfere() -> None:
        await until(lambda: len(kit.model.requests) == 1)
        for attempt in (
            lambda: kit.runtime.prompt("hi"),
            kit.runtime.compact,
            lambda: kit.runtime.navigate(ids["a1"]),
        ):
            try:
                await attempt()
            except SessionError as exc:
                refusals.append(str(exc))
        kit.runtime.abort_branch_summary()

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: kit.runtime.navigate(ids["u1"], summarize=True))
        group.start_soon(interfere)
    assert refusals == [
        "Cannot prompt while a tree navigation is in progress",
        "Cannot compact while a tree navigation is in progress",
        "Cannot navigate while a tree navigation is in progress",
    ]
    assert kit.runtime.is_navigating is False


async def test_a_branch_summary_that_conflicts_is_a_conflict_not_a_model_failure() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    session = kit.session
    scripted = kit.model.complete

    async def answer_after_another_writer(request: Any) -> Any:
        response = await scripted(request)
        # Another program appends while the branch summary is being written (D27).
        session.store.append([session.new_entry("custom", {"customType": "pi", "data": None})])
        return response

    kit.model.complete = answer_after_another_writer  # type: ignore[method-assign]
    before = list(session.tree.entries)
    with pytest.raises(ConflictError, match="the session changed since it was read"):
        await kit.runtime.navigate(ids["u2"], summarize=True)
    # Nothing of ours was applied (no summary, no move); the other program's entry is read in,
    # and the leaf is where it left the file, so that asking again works from there (D27).
    [foreign] = [e for e in session.tree.entries if e["type"] == "custom"]
    assert [e["id"] for e in session.tree.entries] == [e["id"] for e in before] + [foreign["id"]]
    assert foreign["parentId"] == ids["a2"]
    assert session.leaf_id == foreign["id"]
    assert not any(e["type"] == "branch_summary" for e in session.tree.entries)


EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"
OTHER_BRANCH = "36fbeee7"  # an assistant message off the example's active path


def owned_example(tmp_path: Path, model: ScriptedModel) -> tuple[Path, AgentSession]:
    path = tmp_path / "example.jsonl"
    shutil.copy(EXAMPLE, path)
    routes = SummaryRoutes(candidates=(model,), sleep=anyio.sleep)
    return path, AgentSession.open(path, owner="test navigator", summarizer=routes)


async def test_close_during_a_navigation_is_refused_and_the_session_stays_owned(
    tmp_path: Path,
) -> None:
    # The turn machine is idle while the navigation machine runs: close must not release the
    # session under it (D22, D27). Aborting the navigation first makes close work.
    model = ScriptedModel([Hang()])
    path, runtime = owned_example(tmp_path, model)
    before = path.read_bytes()
    results = []

    async def go() -> None:
        results.append(await runtime.navigate(OTHER_BRANCH, summarize=True))

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await until(lambda: len(model.requests) == 1)
        with pytest.raises(SessionError, match="tree navigation is in progress; abort it first"):
            runtime.close()
        assert runtime.state == "idle"  # the turn machine did not take its close row
        with pytest.raises(SessionLockedError, match="test navigator"):
            Session.open(path, owner="someone else")
        runtime.abort_branch_summary()
    assert results[0].cancelled is True
    runtime.close()
    assert path.read_bytes() == before
    Session.open(path, owner="someone else").close()


async def test_a_navigation_cancelled_from_outside_settles_so_close_works(
    tmp_path: Path,
) -> None:
    # The task running navigate() is cancelled (a server shutting down, a TUI quitting): the
    # navigation settles through its table's cancel row, so the session can be closed after.
    model = ScriptedModel([Hang()])
    path, runtime = owned_example(tmp_path, model)
    before = path.read_bytes()
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: runtime.navigate(OTHER_BRANCH, summarize=True))
        await until(lambda: len(model.requests) == 1)
        group.cancel_scope.cancel()
    assert runtime.navigator.machine is not None
    assert runtime.navigator.machine.state == "cancelled"
    assert runtime.is_navigating is False
    runtime.close()
    assert path.read_bytes() == before
