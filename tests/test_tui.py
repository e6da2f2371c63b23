"""The tree navigator TUI, driven through Textual's pilot (docs/server.md, "Tree navigator")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList, Static

from orchestrator._cli.tui import build_runtime, keep_position, register
from orchestrator._core.errors import FatalModelError, ModelError, SessionError
from orchestrator._store.session import Session
from orchestrator._tui.app import TreeApp
from orchestrator._tui.picker import UNAVAILABLE, PickerState, TreePicker, entry_text
from orchestrator.testing import AgentHang, Hang, reply, summary_text
from tests.runtime_kit import Kit, summary

pytestmark = pytest.mark.anyio

BRANCH_SUMMARY = summary_text("Tried another approach.")
SIZE = (120, 36)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def nav_kit(
    summaries: list[Any] | None = None,
    extra_turns: list[Any] | None = None,
    session: Session | None = None,
) -> Kit:
    turns = [[reply("answer one")], [reply("answer two")], *(extra_turns or [])]
    return Kit(turns=turns, summaries=summaries or [summary(BRANCH_SUMMARY)], session=session)


async def conversation(kit: Kit) -> dict[str, str]:
    """u1 a1 u2 a2 (a2 is the leaf). Returns the ids by name."""
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


def picker(app: TreeApp) -> TreePicker:
    assert isinstance(app.screen, TreePicker), f"the picker is not open ({app.screen!r})"
    return app.screen


async def settle(pilot: Pilot[None]) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def run_keys(app: TreeApp, *keys: str) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*keys)
        await settle(pilot)


async def wait_for(pilot: Pilot[None], predicate: Callable[[], bool]) -> None:
    for _ in range(200):
        if predicate():
            return
        await pilot.pause()
    raise AssertionError("condition never became true")


# -- navigating without a summary ------------------------------------------------------------------


async def test_picker_opens_on_the_leaf_and_marks_the_active_path() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    await kit.runtime.navigate(ids["u2"])  # leaf a1; u2 a2 become another branch
    kit.session.append_label(ids["u1"], "start")
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        screen = picker(app)
        rows = screen.query_one("#rows", OptionList)
        lines = [str(rows.get_option_at_index(i).prompt) for i in range(rows.option_count)]
        assert lines[0].startswith("│ [start] user: first question")
        assert lines[1].startswith("● assistant: answer one")  # the leaf
        assert lines[2].strip() == "user: second question"  # off the active path, unmarked
        assert len(lines) == 4  # the label entry (the real leaf) is hidden
        assert rows.highlighted == 1
        assert "Summarize: OFF" in screen.status_text
        await pilot.press("a")
        lines = [str(rows.get_option_at_index(i).prompt) for i in range(rows.option_count)]
        assert lines[-1].startswith("●")
        assert "label " in lines[-1]
        assert rows.highlighted == 4
        await pilot.press("home")
        preview = str(screen.query_one("#preview", Static).render())
        assert preview.startswith(f"{ids['u1']} · message · on the active path\nlabel: start\n")


async def test_enter_on_an_assistant_entry_moves_the_leaf_there() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    turns_before = kit.turn_path()
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up", "up", "enter")
        await settle(pilot)
        assert not isinstance(app.screen, TreePicker)
        assert kit.session.leaf_id == ids["a1"]
        assert len(kit.session.tree.entries) == 4  # navigating alone appends nothing
        assert app.editor.value == ""
        assert kit.turn_path() == turns_before  # navigating starts no reply
        assert "Moved to " + ids["a1"] in app.status_text
        transcript = str(app.query_one("#transcript", Static).render())
        assert "answer one" in transcript
        assert "second question" not in transcript


async def test_user_message_goes_before_it_and_fills_an_empty_editor() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up")
        preview = str(picker(app).query_one("#preview", Static).render())
        assert "second question" in preview
        assert "Enter: go back to just before" in preview
        await pilot.press("enter")
        await settle(pilot)
        assert kit.session.leaf_id == ids["a1"]
        assert app.editor.value == "second question"
        assert "back in the editor" in app.status_text


async def test_a_draft_in_the_editor_is_never_overwritten() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press(*"draft", "ctrl+t")
        picker(app)
        await pilot.press("up", "enter")
        await settle(pilot)
        assert kit.session.leaf_id == ids["a1"]
        assert app.editor.value == "draft"
        assert "held a draft" in app.status_text


async def test_slash_tree_in_the_editor_opens_the_picker() -> None:
    kit = nav_kit()
    await conversation(kit)
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press(*"/tree", "enter")
        assert picker(app).state is PickerState.CHOOSING
        assert app.editor.value == ""


async def test_enter_on_the_leaf_changes_nothing() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "enter")
        await settle(pilot)
        assert kit.session.leaf_id == ids["a2"]
        assert kit.model.requests == []
        assert app.status_text == "Already there; nothing changed"


async def test_esc_cancels_the_picker_without_changes() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up", "up", "s", "escape")
        await pilot.pause()
        assert not isinstance(app.screen, TreePicker)
        assert kit.session.leaf_id == ids["a2"]
        assert kit.session.tree.entries == before
        assert app.status_text == "Navigation cancelled; nothing changed"


# -- summaries -------------------------------------------------------------------------------------


async def test_s_toggles_the_summary_and_enter_attaches_it() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        assert "Summarize: ON" in picker(app).status_text
        await pilot.press("s")
        assert "Summarize: OFF" in picker(app).status_text
        await pilot.press("s", "up", "up", "enter")
        await settle(pilot)
        entry = kit.session.tree.by_id[kit.session.leaf_id or ""]
        assert entry["type"] == "branch_summary"
        assert entry["parentId"] == ids["a1"]
        assert entry["fromId"] == ids["a2"]
        assert BRANCH_SUMMARY in entry["summary"]
        assert len(kit.model.requests) == 1
        assert f"Branch summary {entry['id']} attached as the new leaf" in app.status_text


async def test_c_summarizes_with_custom_instructions() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up", "c")
        assert picker(app).state is PickerState.INSTRUCTING
        await pilot.press("escape")  # back to the list, nothing sent
        assert picker(app).state is PickerState.CHOOSING
        await pilot.press("c", *"files", "enter")
        await settle(pilot)
        assert "Additional focus: files" in kit.model.requests[0].prompt
        assert app.editor.value == "second question"
        assert kit.session.tree.by_id[kit.session.leaf_id or ""]["parentId"] == ids["a1"]


async def test_esc_during_the_summary_aborts_it_and_leaves_the_session_unchanged() -> None:
    kit = nav_kit(summaries=[Hang()])
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "up", "up", "enter")
        await wait_for(pilot, lambda: len(kit.model.requests) == 1)
        screen = picker(app)
        assert screen.state is PickerState.NAVIGATING
        assert "Summarizing the branch you leave [summarizing] (Esc: abort)" in screen.status_text
        await pilot.press("s", "c", "a", "enter")  # ignored while navigating
        await pilot.press("escape")
        await settle(pilot)
        assert picker(app) is screen
        assert picker(app).state is PickerState.CHOOSING
        assert "Summary aborted" in screen.status_text
        assert "Summarize: ON" in screen.status_text
        assert kit.session.tree.entries == before
        assert kit.session.leaf_id == ids["a2"]
        assert kit.runtime.branch_operation is None or kit.model.remaining == 0


async def test_quitting_during_the_summary_settles_it_and_the_session_closes() -> None:
    # Ctrl+Q cancels the navigation's worker: the navigation settles through its table's cancel
    # row, so nothing is attached and closing the session afterwards is not refused.
    kit = nav_kit(summaries=[Hang()])
    ids = await conversation(kit)
    before = list(kit.session.tree.entries)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "up", "up", "enter")
        await wait_for(pilot, lambda: len(kit.model.requests) == 1)
        await pilot.press("ctrl+q")
    assert kit.runtime.is_navigating is False
    kit.runtime.close()
    assert kit.runtime.state == "closed"
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == ids["a2"]


async def test_a_failed_summary_is_reported_and_nothing_changes() -> None:
    kit = nav_kit(summaries=[FatalModelError("bad key")])
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "up", "enter")
        await settle(pilot)
        assert "Branch summary failed" in picker(app).status_text
        assert kit.session.leaf_id == ids["a2"]
        assert len(kit.session.tree.entries) == 4


async def test_a_hook_cancelling_navigation_keeps_the_picker_open() -> None:
    kit = nav_kit()
    ids = await conversation(kit)
    kit.runtime.hooks.on("session_before_tree", lambda p: {"cancel": True})
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up", "enter")
        await settle(pilot)
        assert "cancelled by an extension" in picker(app).status_text
        assert kit.session.leaf_id == ids["a2"]


# -- busy, agent, empty ----------------------------------------------------------------------------


async def test_tree_is_refused_while_the_agent_works() -> None:
    kit = nav_kit(extra_turns=[[AgentHang()], [reply("answer four")]])
    ids = await conversation(kit)
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press(*"third", "enter")
        await wait_for(pilot, lambda: kit.runtime.state == "running")
        await pilot.press("ctrl+t")
        assert not isinstance(app.screen, TreePicker)
        assert app.status_text == UNAVAILABLE
        await pilot.press(*"fourth", "enter")
        await wait_for(pilot, lambda: "Queued" in app.status_text)
        await pilot.press("escape")  # aborts the turn; the queued prompt then runs
        await settle(pilot)
        assert app.status_text == "Ready"
        assert [m["role"] for m in kit.session.context().messages][-2:] == ["user", "assistant"]
        await pilot.press("ctrl+t")
        assert picker(app).state is PickerState.CHOOSING
        assert kit.session.tree.by_id[ids["a2"]]


async def test_enter_in_the_picker_is_refused_when_a_turn_started_meanwhile() -> None:
    kit = nav_kit(extra_turns=[[AgentHang()]])
    ids = await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        app.run_worker(kit.runtime.prompt("elsewhere"))
        await wait_for(pilot, lambda: kit.runtime.state == "running")
        await pilot.press("up", "enter")
        await pilot.pause()
        assert "Cannot navigate while the agent is working" in picker(app).status_text
        assert kit.session.tree.by_id[kit.session.leaf_id or ""]["parentId"] == ids["a2"]
        kit.runtime.abort()
        await settle(pilot)


async def test_without_an_agent_the_editor_keeps_the_text() -> None:
    kit = nav_kit()
    await conversation(kit)
    kit.runtime.agent = None
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press(*"hello", "enter", "escape")
        assert app.editor.value == "hello"
        assert "No agent" in app.status_text


async def test_an_empty_line_sends_nothing() -> None:
    kit = nav_kit()
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press("space", "enter")
        await settle(pilot)
        assert kit.turn_path() == []
        assert kit.agent.remaining == 2


async def test_a_bug_in_the_runtime_is_not_swallowed() -> None:
    kit = nav_kit()
    ids = await conversation(kit)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    kit.runtime.navigate = broken  # type: ignore[method-assign]
    kit.runtime.prompt = broken  # type: ignore[method-assign]
    for keys in (("up", "enter"), ("escape", "x", "enter")):  # Esc gives the editor focus
        with pytest.raises(RuntimeError, match="bug"):
            await run_keys(TreeApp(kit.runtime), *keys)
    assert kit.session.leaf_id == ids["a2"]


async def test_a_failed_turn_is_reported() -> None:
    kit = nav_kit()

    async def failing(text: str) -> Any:
        raise ModelError("provider down")

    kit.runtime.prompt = failing  # type: ignore[method-assign]
    app = TreeApp(kit.runtime, open_tree=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#editor")
        await pilot.press(*"hi", "enter")
        await settle(pilot)
        assert app.status_text == "The turn failed: provider down"


async def test_an_empty_session_shows_an_empty_picker() -> None:
    kit = nav_kit()
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c", "enter")
        screen = picker(app)
        assert screen.state is PickerState.CHOOSING
        assert "no entries yet" in str(screen.query_one("#preview", Static).render())
        assert "new root" in str(app.query_one("#transcript", Static).render())


def test_entry_text_shows_whole_entries() -> None:
    assistant = {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {"type": "toolCall", "name": "read", "arguments": {"path": "a.py"}},
                {"type": "thinking", "thinking": "hidden"},
            ],
        },
    }
    assert entry_text(assistant) == "reading\n→ read({'path': 'a.py'})"
    bash = {
        "type": "message",
        "message": {"role": "bashExecution", "command": "ls", "output": "a.py"},
    }
    assert entry_text(bash) == "$ ls\na.py"
    summary_message = {"type": "message", "message": {"role": "branchSummary", "summary": "S"}}
    assert entry_text(summary_message) == "S"
    assert entry_text({"type": "compaction", "summary": "C" * 200}) == "C" * 200
    level = {"type": "thinking_level_change", "thinkingLevel": "high"}
    assert entry_text(level) == "thinking → high"


# -- the command -----------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["tui", *argv])


async def file_conversation(path: Path) -> dict[str, str]:
    kit = nav_kit(session=Session.open(path))
    ids = await conversation(kit)
    kit.session.close()
    return ids


async def test_the_command_navigates_a_file_with_the_offline_summarizer(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    ids = await file_conversation(path)
    runtime = build_runtime(parse(str(path)))
    assert runtime.agent is None
    app = TreeApp(runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "up", "up", "enter")
        await settle(pilot)
    keep_position(runtime)  # the summary is the last entry: nothing more to record
    runtime.close()
    reopened = Session.open(path)
    entry = reopened.tree.by_id[reopened.leaf_id or ""]
    assert entry["type"] == "branch_summary"
    assert entry["parentId"] == ids["a1"]
    assert "the user explored a different branch" in entry["summary"]
    assert len(reopened.tree.entries) == 5


async def test_leaving_without_a_summary_keeps_the_position_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    ids = await file_conversation(path)
    runtime = build_runtime(parse(str(path)))
    await runtime.navigate(ids["u2"])
    keep_position(runtime)
    runtime.close()
    reopened = Session.open(path)
    assert reopened.context().entry_ids == (ids["u1"], ids["a1"])
    assert reopened.tree.entries[-1]["customType"] == "orchestrator/leaf"
    reopened.close()


async def test_the_same_position_twice_is_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    ids = await file_conversation(path)
    for _ in range(2):
        runtime = build_runtime(parse(str(path)))
        await runtime.navigate(ids["u2"])
        keep_position(runtime)
        runtime.close()
    reopened = Session.open(path)
    markers = [e for e in reopened.tree.entries if e.get("customType") == "orchestrator/leaf"]
    assert [m["parentId"] for m in markers] == [ids["a1"]]
    assert reopened.context().entry_ids == (ids["u1"], ids["a1"])
    reopened.close()


async def test_the_command_handler_runs_the_app_and_releases_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    ids = await file_conversation(path)
    ran: list[TreeApp] = []

    def fake_run(self: TreeApp) -> None:
        ran.append(self)
        self.runtime.session.branch(ids["a1"])

    monkeypatch.setattr(TreeApp, "run", fake_run)
    monkeypatch.setattr("orchestrator._cli.tui.has_terminal", lambda: True)
    args = parse(str(path), "--model", "openai/gpt-4o-mini", "--chat", "--context-window", "8000")
    assert args.handler(args) == 0
    assert ran
    assert ran[0].runtime.agent is not None
    reopened = Session.open(path)  # the lock was released
    assert reopened.context().entry_ids == (ids["u1"], ids["a1"])


def test_the_command_refuses_missing_files_and_chat_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="no such session file"):
        build_runtime(parse(str(tmp_path / "missing.jsonl")))
    (tmp_path / "s.jsonl").write_text("")
    with pytest.raises(SessionError, match="--chat needs a --model"):
        build_runtime(parse(str(tmp_path / "s.jsonl"), "--chat"))


async def test_the_transcript_follows_the_new_position_after_enter() -> None:
    long = "\n".join(f"line {i} of a long answer" for i in range(12))
    kit = Kit(
        turns=[[reply(f"answer {n}\n{long}")] for n in range(6)],
        summaries=[summary(BRANCH_SUMMARY)],
    )
    for n in range(6):
        await kit.runtime.prompt(f"question {n}")
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        box = app.query_one("#transcript-box")
        box.scroll_home(animate=False)
        await pilot.press("s", "up", "up", "enter")
        await settle(pilot)
        assert kit.session.tree.by_id[kit.session.leaf_id or ""]["type"] == "branch_summary"
        assert not isinstance(app.screen, TreePicker)
        await wait_for(pilot, lambda: box.max_scroll_y > 0 and box.scroll_y == box.max_scroll_y)
        # The summary, the transcript's last line, is inside the visible region.
        transcript = app.query_one("#transcript", Static)
        bottom = transcript.virtual_region.bottom
        assert box.scroll_y <= bottom <= box.scroll_y + box.scrollable_content_region.height


# -- first-hour surprises (issue "nothing that surprises a new user", item 9) ---------------------


async def test_after_esc_closes_the_picker_typed_text_goes_to_the_editor() -> None:
    # The picker opens at start, before anything has focus: after Esc the keys went nowhere.
    kit = nav_kit()
    await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        picker(app)
        await pilot.press("escape", *"hello")
        assert app.editor.has_focus
        assert app.editor.value == "hello"


async def test_the_summary_choice_is_kept_when_the_picker_reopens() -> None:
    kit = nav_kit()
    await conversation(kit)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s", "escape", "ctrl+t")
        assert picker(app).summarize
        assert "Summarize: ON" in picker(app).status_text
        await pilot.press("s", "escape", "ctrl+t")
        assert "Summarize: OFF" in picker(app).status_text


async def test_rows_draw_branches_and_a_long_row_never_wraps() -> None:
    kit = nav_kit(extra_turns=[[reply("answer three")]])
    ids = await conversation(kit)
    await kit.runtime.navigate(ids["u2"])  # back to a1, then a second branch from it
    await kit.runtime.prompt("third question " + "with many words " * 12)
    app = TreeApp(kit.runtime)
    async with app.run_test(size=(70, 30)) as pilot:
        await pilot.pause()
        rows = picker(app).query_one("#rows", OptionList)
        lines = [str(rows.get_option_at_index(i).prompt) for i in range(rows.option_count)]
        assert lines[:4] == [
            "│ user: first question",
            "│ assistant: answer one",
            "  ├─ user: second question",
            "  │  assistant: answer two",
        ]
        assert lines[4].startswith("│ └─ user: third question with many words")
        assert lines[5] == "●    assistant: answer three"
        # One screen row per entry: a wrapped row continued without its │ marker.
        assert rows.virtual_size.height == rows.option_count
        shown = [rows.render_line(y).text for y in range(rows.option_count)]
        assert shown[4].rstrip().endswith("…")
        assert all(line[0] in "│● " for line in shown)


async def test_a_row_under_a_hidden_entry_hangs_from_the_nearest_shown_one() -> None:
    kit = nav_kit(extra_turns=[[reply("answer three")]])
    ids = await conversation(kit)
    kit.session.append_label(ids["u1"], "start")  # a hidden entry under a2
    await kit.runtime.prompt("third question")  # under the label
    app = TreeApp(kit.runtime)
    async with app.run_test(size=SIZE):
        rows = picker(app).query_one("#rows", OptionList)
        lines = [str(rows.get_option_at_index(i).prompt) for i in range(rows.option_count)]
        # A chain: the label's child continues a2's line, with no connector.
        assert lines[-2:] == ["│ user: third question", "● assistant: answer three"]
