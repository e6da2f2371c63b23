"""The turn lifecycle through the runtime (decisions D18-D22)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._core.errors import (
    Cancelled,
    ConflictError,
    FatalModelError,
    SessionError,
    TransientModelError,
)
from orchestrator._runtime.turn.replies import OVERFLOW_FAILED, failed_attempt
from orchestrator._store.session import Session
from orchestrator.testing import AgentHang, Hang, error_reply, reply
from tests.runtime_kit import BIG, HangingSleep, Kit, settings, summary, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_threshold_compaction_then_auto_continue_d20() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [reply("second", tokens=9500)],
            [reply("continued", tokens=1500)],
        ],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    result = await kit.runtime.prompt(BIG)
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "continued"
    assert kit.entry_types() == [
        "message:user",
        "message:assistant",
        "message:user",
        "message:assistant",
        "compaction",
        "custom_message",
        "message:assistant",
    ]
    continue_entry = kit.session.tree.entries[5]
    assert continue_entry["customType"] == "auto-continue"
    assert continue_entry["content"] == "Continue if you have next steps."
    assert kit.of("auto_compaction_start") == [{"reason": "threshold"}]
    [end] = kit.of("auto_compaction_end")
    assert end["willRetry"] is False
    assert end["aborted"] is False
    assert end["result"]["summary"].startswith("## Goal")
    third_input = kit.agent.inputs[2].messages
    assert third_input[0]["role"] == "compactionSummary"
    assert third_input[-1]["role"] == "custom"
    assert ("pruning", "pruned", "compacting") in kit.turn_path()
    assert ("continuing", "resume", "running") in kit.turn_path()


async def test_d19_at_most_one_automatic_compaction_per_turn() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [reply("second", tokens=9500)],
            [reply("still big", tokens=9800)],
        ],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert kit.entry_types().count("compaction") == 1
    assert kit.turn_path()[-1] == ("running", "agent_done", "idle")
    assert kit.model.remaining == 0


async def test_auto_continue_off_ends_the_turn_after_compaction() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=9500)]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False, auto_continue=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert kit.entry_types()[-1] == "compaction"
    assert kit.turn_path()[-1] == ("compacting", "compaction_done", "idle")


async def test_disabled_compaction_never_compacts_d5() -> None:
    kit = Kit(turns=[[reply("big", tokens=9999)]], runtime_settings=settings(enabled=False))
    await kit.runtime.prompt(BIG)
    assert "compaction" not in kit.entry_types()
    assert kit.of("auto_compaction_start") == []


async def test_d18_overflow_compacts_once_and_retries_without_the_failed_reply() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("prompt is too long: 210000 tokens > 200000 maximum")],
            [reply("recovered", tokens=1000)],
        ],
        summaries=[summary(), summary()],  # history, and the prompt as a split turn's prefix
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    result = await kit.runtime.prompt(BIG)
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "recovered"
    assert kit.of("auto_compaction_start") == [{"reason": "overflow"}]
    [end] = kit.of("auto_compaction_end")
    assert end["willRetry"] is True
    # The failed reply stays in the file but is not sent again.
    failed = [
        e for e in kit.session.tree.entries if e.get("message", {}).get("stopReason") == "error"
    ]
    assert len(failed) == 1
    retry_input = kit.agent.inputs[2].messages
    assert all(m.get("stopReason") != "error" for m in retry_input)
    assert "custom_message" not in kit.entry_types()
    assert ("running", "overflow", "compacting") in kit.turn_path()


def overflow_session(path: Path) -> Session:
    counter = itertools.count(1)
    ms = itertools.count(1_767_225_600_000, 1000)
    return Session.open(
        path,
        owner="test",
        clock=lambda: next(ms),
        random_hex=lambda: f"{next(counter):08x}" + "0" * 24,
    )


async def test_d18_overflow_recovery_writes_what_it_hides(tmp_path: Path) -> None:
    # Pi 1.x's order: the failed reply stays in the file, a context_edit omits it, then the
    # compaction, then the retry. Reopened, the file builds the context the runtime went on with.
    path = tmp_path / "s.jsonl"
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("prompt is too long: 210000 tokens > 200000 maximum")],
            [reply("recovered", tokens=1000)],
        ],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
        session=overflow_session(path),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert kit.entry_types()[3:] == [
        "message:assistant",
        "context_edit",
        "compaction",
        "message:assistant",
    ]
    failed, edit, compaction = kit.session.tree.entries[3:6]
    assert failed["message"]["stopReason"] == "error"
    assert list(edit) == ["type", "id", "parentId", "timestamp", "targetId", "replacement"]
    assert (edit["parentId"], edit["targetId"], edit["replacement"]) == (
        failed["id"],
        failed["id"],
        None,
    )
    assert compaction["parentId"] == edit["id"]
    # The cut passes the omitted attempt (cut_point._omitted_attempt_follows): the prompt is
    # summarized as the turn's prefix rather than kept with nothing answering it.
    assert compaction["firstKeptEntryId"] == failed["id"]
    assert len(kit.model.requests) == 2
    retry_input = kit.agent.inputs[2].messages
    assert [m["role"] for m in retry_input] == ["compactionSummary"]

    live = kit.session.context()
    kit.runtime.close()
    reopened = Session.open(path)
    assert any(e["id"] == failed["id"] for e in reopened.tree.entries)
    context = reopened.context()
    assert context.messages == live.messages
    assert context.entry_ids == live.entry_ids
    assert failed["id"] not in context.entry_ids


async def test_d18_a_failed_attempt_is_omitted_with_its_tool_results() -> None:
    # A reply cut off by the length limit with the context full, after calling a tool: the
    # reply and the result answering its call are omitted, in that order (an unpaired result
    # would fail the next request).
    call = {"type": "toolCall", "id": "call_1", "name": "read", "arguments": {"path": "a"}}
    cut_off = reply("partial", tokens=9900)
    cut_off["content"] = [*cut_off["content"], call]
    cut_off["stopReason"] = "length"
    result = {
        "role": "toolResult",
        "toolCallId": "call_1",
        "toolName": "read",
        "content": [{"type": "text", "text": "contents"}],
        "isError": False,
        "timestamp": 1,
    }
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [cut_off, result], [reply("done", tokens=500)]],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert ("running", "reply_truncated", "compacting") in kit.turn_path()
    entries = kit.session.tree.entries
    reply_entry, result_entry, *edits = entries[3:7]
    assert [e["type"] for e in edits] == ["context_edit", "context_edit"]
    assert [e["targetId"] for e in edits] == [reply_entry["id"], result_entry["id"]]
    assert entries[7]["type"] == "compaction"
    ids = kit.session.context().entry_ids
    assert reply_entry["id"] not in ids
    assert result_entry["id"] not in ids


async def test_d18_second_overflow_in_the_same_turn_fails_with_guidance() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("context_length_exceeded")],
            [error_reply("context_length_exceeded")],
        ],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    ends = kit.of("auto_compaction_end")
    assert ends[-1]["errorMessage"] == OVERFLOW_FAILED
    assert kit.entry_types().count("compaction") == 1
    # The second failure is not omitted: no recovery follows it (pi omits only to compact).
    assert kit.entry_types().count("context_edit") == 1
    assert kit.runtime.state == "idle"


async def test_overflow_recovery_failure_is_reported_and_nothing_applied() -> None:

    kit = Kit(
        turns=[[reply("first", tokens=2000)], [error_reply("request_too_large")]],
        summaries=[FatalModelError("boom")],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    [end] = kit.of("auto_compaction_end")
    assert end["errorMessage"] == "Context overflow recovery failed: boom"
    assert "compaction" not in kit.entry_types()
    assert kit.of("compaction_update")[-1]["status"] == "failed"


async def test_threshold_failure_says_auto_compaction_failed() -> None:

    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=9500)]],
        summaries=[FatalModelError("nope")],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    [end] = kit.of("auto_compaction_end")
    assert end["errorMessage"] == "Auto-compaction failed: nope"


async def test_transient_errors_retry_with_backoff_and_retry_after() -> None:
    kit = Kit(
        turns=[
            [error_reply("429 rate limit exceeded")],
            [error_reply("overloaded, retry-after: 7")],
            [reply("finally", tokens=100)],
        ]
    )
    result = await kit.runtime.prompt("hi")
    assert result.reply is not None
    assert result.reply["content"][0]["text"] == "finally"
    starts = kit.of("auto_retry_start")
    assert [(s["attempt"], s["delayMs"]) for s in starts] == [(1, 2000), (2, 7000)]
    assert kit.clock.sleeps == [2.0, 7.0]
    assert kit.of("auto_retry_end") == [{"success": True, "attempt": 2}]
    # Each retry sends the context without the failed replies.
    assert all(m.get("stopReason") != "error" for m in kit.agent.inputs[2].messages)


async def test_retries_exhausted_end_with_the_final_error() -> None:
    kit = Kit(turns=[[error_reply("503 service unavailable")]] * 4)
    await kit.runtime.prompt("hi")
    assert len(kit.of("auto_retry_start")) == 3
    [end] = kit.of("auto_retry_end")
    assert end["success"] is False
    assert end["finalError"] == "503 service unavailable"
    assert kit.runtime.state == "idle"


async def test_fatal_error_ends_the_turn_without_retry() -> None:
    kit = Kit(turns=[[error_reply("invalid api key")]])
    await kit.runtime.prompt("hi")
    assert kit.of("auto_retry_start") == []
    assert kit.turn_path()[-1] == ("running", "fatal_error", "idle")


async def test_d22_abort_during_retry_wait_cancels_only_the_wait() -> None:
    sleeper = HangingSleep()
    kit = Kit(turns=[[error_reply("502 bad gateway")], [reply("never")]], sleep=sleeper)
    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "hi")
        await until(lambda: kit.runtime.state == "retrying")
        kit.runtime.abort()
    assert kit.runtime.state == "idle"
    assert sleeper.delays == [2.0]
    assert kit.of("auto_retry_end")[-1]["success"] is False
    assert kit.agent.remaining == 1  # the retry never ran
    assert ("retrying", "abort", "idle") in kit.turn_path()


async def test_abort_stops_a_running_agent() -> None:
    kit = Kit(turns=[[AgentHang()]])
    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "hi")
        await until(lambda: kit.runtime.state == "running")
        kit.runtime.abort()
    assert kit.runtime.state == "idle"
    assert ("running", "abort", "idle") in kit.turn_path()
    assert kit.entry_types() == ["message:user"]


async def test_d22_manual_compaction_stops_work_and_does_not_resume() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [AgentHang()], [reply("not used")]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    outcomes = []

    async def compact_when_running() -> None:
        await until(lambda: kit.runtime.state == "running")
        outcomes.append(await kit.runtime.compact("keep the decisions"))

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, BIG)
        group.start_soon(compact_when_running)
    [outcome] = outcomes
    assert outcome.status == "committed"
    assert kit.runtime.state == "idle"
    assert kit.agent.remaining == 1
    assert ("running", "manual_compact", "manual_compacting") in kit.turn_path()
    assert kit.entry_types()[-1] == "compaction"
    assert "Additional focus: keep the decisions" in kit.model.requests[0].prompt
    assert kit.of("auto_compaction_start") == []  # manual compaction emits no auto events


async def test_manual_compaction_when_idle_and_nothing_to_compact_d12() -> None:
    kit = Kit(turns=[[reply("hi", tokens=10)]])
    await kit.runtime.prompt("short")
    outcome = await kit.runtime.compact()
    assert outcome.status == "skipped"
    assert outcome.reason == "Nothing to compact (session too small)"
    assert kit.model.requests == []


async def test_manual_compaction_twice_says_already_compacted() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert (await kit.runtime.compact()).status == "committed"
    again = await kit.runtime.compact()
    assert (again.status, again.reason) == ("skipped", "Already compacted")


async def test_d22_abort_compaction_applies_nothing() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[Hang()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    before = list(kit.session.tree.entries)
    leaf = kit.session.leaf_id
    errors: list[BaseException] = []

    async def compact() -> None:
        try:
            await kit.runtime.compact()
        except Cancelled as exc:
            errors.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(compact)
        await until(lambda: len(kit.model.requests) == 1)
        kit.runtime.abort_compaction()
    assert len(errors) == 1
    assert kit.session.tree.entries == before
    assert kit.session.leaf_id == leaf
    assert kit.of("compaction_update")[-1]["status"] == "cancelled"


async def test_prompt_while_busy_is_queued_and_runs_next() -> None:
    kit = Kit(turns=[[AgentHang()], [reply("second")]])
    results = []

    async def second() -> None:
        await until(lambda: kit.runtime.state == "running")
        results.append(await kit.runtime.prompt("queued"))
        kit.runtime.abort()

    async with anyio.create_task_group() as group:
        group.start_soon(kit.runtime.prompt, "first")
        group.start_soon(second)
    assert results[0].queued is True
    texts = [
        e["message"]["content"][0]["text"]
        for e in kit.session.tree.entries
        if e.get("message", {}).get("role") == "user"
    ]
    assert texts == ["first", "queued"]


async def test_prompt_without_agent_is_an_error() -> None:
    kit = Kit()
    kit.runtime.agent = None
    with pytest.raises(SessionError, match="no agent"):
        await kit.runtime.prompt("hi")


async def test_d19_overflow_after_this_turns_threshold_compaction_does_not_compact_again() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [reply("second", tokens=9500)],
            [error_reply("context_length_exceeded")],
        ],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    assert kit.entry_types().count("compaction") == 1
    assert kit.of("auto_compaction_end")[-1]["errorMessage"] == OVERFLOW_FAILED
    assert kit.turn_path()[-1] == ("running", "overflow", "idle")


async def test_a_second_manual_compaction_is_refused_while_one_runs() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[Hang()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    errors: list[str] = []

    async def second() -> None:
        await until(lambda: len(kit.model.requests) == 1)
        try:
            await kit.runtime.compact()
        except SessionError as exc:
            errors.append(str(exc))
        kit.runtime.abort_compaction()

    async def first() -> None:
        with pytest.raises(Cancelled):
            await kit.runtime.compact()

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        group.start_soon(second)
    assert errors == ["A manual compaction is already running"]


async def test_the_providers_retry_after_header_sets_the_turns_wait() -> None:
    # The route read "retry-after: 7" from the header, but the error reply kept only the words,
    # so the turn waited its 2 s backoff and asked again too soon.
    from orchestrator._core.model import ModelResponse
    from orchestrator._runtime.agent import ChatAgent
    from orchestrator.testing import ScriptedModel

    kit = Kit()
    limited = TransientModelError("429 Too Many Requests", retry_after=7.0)
    kit.runtime.agent = ChatAgent(model=ScriptedModel([limited, ModelResponse(text="ok")]))
    await kit.runtime.prompt("hi")
    [start] = kit.of("auto_retry_start")
    assert start["delayMs"] == 7000
    assert kit.clock.sleeps == [7.0]
    entries = kit.session.tree.entries
    failed = [e for e in entries if e.get("message", {}).get("stopReason") == "error"]
    assert failed[0]["message"]["retryAfterMs"] == 7000


async def test_every_retry_streak_ends_with_its_auto_retry_end() -> None:
    # A streak that ended by an overflow, a manual compaction during the wait, or an abort of
    # the retried call sent auto_retry_start and never its auto_retry_end.
    overflow = Kit(
        turns=[
            [reply("x", tokens=2000)],
            [error_reply("503 service unavailable")],
            [error_reply("prompt is too long: context length exceeded")],
            [error_reply("prompt is too long: context length exceeded")],
        ],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await overflow.runtime.prompt(BIG)
    await overflow.runtime.prompt(BIG)
    assert overflow.of("auto_retry_end") == [
        {
            "success": False,
            "attempt": 1,
            "finalError": "prompt is too long: context length exceeded",
        }
    ]

    waiting = Kit(
        turns=[[reply("x", tokens=2000)], [error_reply("502 bad gateway")], [reply("never")]],
        # The failed reply's omission is written before the wait (D21): the cut passes it, and
        # the prompt is a split turn's prefix, summarized apart from the history.
        summaries=[summary(), summary()],
        sleep=HangingSleep(),
        runtime_settings=settings(adaptive_keep=False),
    )
    await waiting.runtime.prompt(BIG)
    async with anyio.create_task_group() as group:
        group.start_soon(waiting.runtime.prompt, BIG)
        await until(lambda: waiting.runtime.state == "retrying")
        await waiting.runtime.compact()
    assert [e["success"] for e in waiting.of("auto_retry_end")] == [False]

    stopped = Kit(turns=[[error_reply("503 service unavailable")], [AgentHang()]])
    async with anyio.create_task_group() as group:
        group.start_soon(stopped.runtime.prompt, "hi")
        await until(lambda: stopped.runtime.state == "running" and stopped.agent.remaining == 0)
        stopped.runtime.abort()
    assert len(stopped.of("auto_retry_start")) == 1
    assert [e["success"] for e in stopped.of("auto_retry_end")] == [False]

    # No streak, no end: a plain abort of a first call reports none.
    plain = Kit(turns=[[AgentHang()]])
    async with anyio.create_task_group() as group:
        group.start_soon(plain.runtime.prompt, "hi")
        await until(lambda: plain.runtime.state == "running")
        plain.runtime.abort()
    assert plain.of("auto_retry_end") == []


def test_failed_attempt_is_the_reply_then_its_own_tool_results() -> None:
    call = {"type": "toolCall", "id": "c1", "name": "read", "arguments": {}}
    messages: list[tuple[str, Any]] = [
        ("u", {"role": "user", "content": "hi"}),
        ("r", {"role": "assistant", "content": [{"type": "text", "text": "x"}, call]}),
        ("t1", {"role": "toolResult", "toolCallId": "c1"}),
        ("t2", {"role": "toolResult", "toolCallId": "other"}),
        ("a", {"role": "assistant", "content": []}),
        ("t3", {"role": "toolResult", "toolCallId": "c1"}),
    ]
    assert failed_attempt(messages, "r") == ["r", "t1"]
    assert failed_attempt(messages, "missing") == []
    assert failed_attempt([("r", {"role": "assistant", "content": "text"})], "r") == ["r"]


async def test_d18_an_omission_refused_by_another_writer_writes_nothing_and_says_so() -> None:
    # Another program appended after the failed reply: the edits are conditional on the tail
    # (D27), so none is written, no compaction runs, and the caller hears of the conflict.
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [error_reply("context_length_exceeded")]],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    await kit.runtime.prompt(BIG)
    append = kit.session.store.append

    def another_writer_first(entries: Any, **options: Any) -> Any:
        if entries[0]["type"] == "context_edit":
            raise ConflictError("the session changed since it was read")
        return append(entries, **options)

    kit.session.store.append = another_writer_first  # type: ignore[method-assign]
    with pytest.raises(ConflictError):
        await kit.runtime.prompt(BIG)
    assert "context_edit" not in kit.entry_types()
    assert "compaction" not in kit.entry_types()
    assert kit.runtime.state == "idle"


async def test_omitting_without_a_failed_reply_writes_nothing() -> None:
    kit = Kit()
    await kit.runtime.turn.effects["omit_failed_attempt"]()
    assert kit.session.tree.entries == []
