"""Hooks around compaction, navigation and forks (decision D25)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator._core.errors import Cancelled, FatalModelError, ModelError, OrchestratorError
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.turn.replies import OVERFLOW_FAILED
from orchestrator.testing import error_reply, reply
from tests.runtime_kit import BIG, Kit, settings, summary

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def two_turns(kit: Kit) -> None:
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)


def make_kit(summaries: list[Any] | None = None) -> Kit:
    return Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=summaries or [summary()],
        runtime_settings=settings(adaptive_keep=False),
    )


async def test_before_compact_cancel_stops_with_compaction_cancelled() -> None:
    kit = make_kit()
    kit.runtime.hooks.on("session_before_compact", lambda payload: {"cancel": True})
    await two_turns(kit)
    with pytest.raises(Cancelled, match="Compaction cancelled"):
        await kit.runtime.compact()
    assert "compaction" not in kit.entry_types()
    assert kit.model.requests == []


async def test_before_compact_is_handed_the_active_path_as_a_list() -> None:
    # The job plans from a window on the live path (issue 9); the hook still gets a list.
    kit = make_kit()
    seen: list[Any] = []
    kit.runtime.hooks.on("session_before_compact", seen.append)
    await two_turns(kit)
    path = kit.session.path()
    await kit.runtime.compact()
    assert isinstance(seen[0]["branchEntries"], list)
    assert seen[0]["branchEntries"] == path


async def test_hook_supplied_compaction_is_used_verbatim_from_extension() -> None:
    kit = make_kit()
    kit.runtime.hooks.on(
        "session_before_compact",
        lambda payload: {
            "compaction": {
                "summary": "HOOK SUMMARY",
                "firstKeptEntryId": payload["preparation"]["firstKeptEntryId"],
                "tokensBefore": 999,
            }
        },
    )
    seen: list[dict[str, Any]] = []
    kit.runtime.hooks.on("session_compact", seen.append)
    await two_turns(kit)
    outcome = await kit.runtime.compact()
    assert outcome.from_extension is True
    entry = kit.session.tree.entries[-1]
    assert entry["summary"] == "HOOK SUMMARY"
    assert entry["tokensBefore"] == 999
    assert entry["fromExtension"] is True
    assert kit.model.requests == []
    # The entry is already persisted when session_compact fires.
    assert seen[0]["compactionEntry"]["id"] == entry["id"]
    assert seen[0]["fromExtension"] is True


async def test_throwing_handler_is_reported_and_default_compaction_continues() -> None:
    kit = make_kit()

    def broken(payload: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    kit.runtime.hooks.on("session_before_compact", broken)
    await two_turns(kit)
    outcome = await kit.runtime.compact()
    assert outcome.status == "committed"
    assert kit.session.tree.entries[-1].get("fromExtension") is None
    assert kit.of("hook_error") == [
        {"hook": "session_before_compact", "error": "RuntimeError: handler bug"}
    ]


async def test_handlers_run_in_order_last_truthy_wins_and_cancel_short_circuits() -> None:
    hooks = Hooks()
    calls: list[str] = []

    def first(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append("first")
        return {"summary": {"summary": "one"}}

    async def second(payload: dict[str, Any]) -> None:
        calls.append("second")

    def third(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append("third")
        return {"cancel": True}

    def fourth(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append("fourth")
        return {}

    for handler in (first, second):
        hooks.on("session_before_tree", handler)
    result = await hooks.run("session_before_tree", {}, lambda name, exc: None)
    assert result == {"summary": {"summary": "one"}}
    hooks.on("session_before_tree", third)
    hooks.on("session_before_tree", fourth)
    calls.clear()
    result = await hooks.run("session_before_tree", {}, lambda name, exc: None)
    assert result == {"cancel": True}
    assert calls == ["first", "second", "third"]


def test_unknown_hook_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown hook"):
        Hooks().on("session_before_everything", lambda payload: None)


async def test_compacting_hook_adds_context_prompt_and_preserve_data() -> None:
    kit = make_kit()
    kit.runtime.hooks.on(
        "session.compacting",
        lambda payload: {
            "context": ["ticket ABC-123 is the source of truth"],
            "prompt": "Summarize tersely.",
            "preserveData": {"plan": "v2"},
        },
    )
    await two_turns(kit)
    await kit.runtime.compact()
    prompt = kit.model.requests[0].prompt
    assert (
        "<additional-context>\n- ticket ABC-123 is the source of truth\n</additional-context>"
        in prompt
    )
    assert prompt.endswith("Summarize tersely.")
    assert kit.session.tree.entries[-1]["preserveData"] == {"plan": "v2"}


async def test_preserve_data_is_inherited_across_compactions() -> None:
    kit = Kit(
        turns=[
            [reply("a", tokens=2000)],
            [reply("b", tokens=100)],
            [reply("c", tokens=100)],
            [reply("d", tokens=100)],
        ],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    kit.runtime.hooks.on("session.compacting", lambda payload: {"preserveData": {"n": 1}})
    await two_turns(kit)
    await kit.runtime.compact()
    kit.runtime.hooks = Hooks()
    await two_turns(kit)
    await kit.runtime.compact()
    assert kit.session.tree.entries[-1]["preserveData"] == {"n": 1}


async def test_d21_manual_compaction_uses_the_current_route_automatic_walks_the_candidates() -> (
    None
):
    from orchestrator._runtime.operation.summarize import SummaryRoutes
    from orchestrator.testing import ScriptedModel

    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [reply("second", tokens=100)],
            [reply("third", tokens=9500)],
            [reply("continued", tokens=500)],
        ],
        runtime_settings=settings(adaptive_keep=False),
    )
    current = ScriptedModel(
        [FatalModelError("bad request"), FatalModelError("bad request")],
        name="current",
    )
    fallback = ScriptedModel([summary()], name="fallback")
    kit.runtime.summarizer = SummaryRoutes(
        candidates=(current, fallback), reserve_tokens=1000, sleep=kit.clock.sleep
    )
    await two_turns(kit)
    from orchestrator._core.errors import ModelError as Failed

    with pytest.raises(Failed, match="bad request"):
        await kit.runtime.compact()
    assert fallback.requests == []
    await kit.runtime.prompt(BIG)  # over the threshold: automatic, so the fallback is tried
    assert len(fallback.requests) == 1
    assert kit.entry_types().count("compaction") == 1


# -- pi's reason, willRetry and session_compact_failed ----------------------------------------


def overflow_kit(summaries: list[Any]) -> Kit:
    return Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("prompt is too long: 210000 tokens > 200000 maximum")],
            [reply("recovered", tokens=1000)],
        ],
        summaries=summaries,
        runtime_settings=settings(adaptive_keep=False),
    )


def listen(kit: Kit, *names: str) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for name in names:
        kit.runtime.hooks.on(name, seen[name].append)
    return seen


async def test_manual_compaction_hooks_say_manual_and_no_retry() -> None:
    kit = make_kit()
    seen = listen(kit, "session_before_compact", "session_compact", "session_compact_failed")
    await two_turns(kit)
    await kit.runtime.compact()
    [before] = seen["session_before_compact"]
    [after] = seen["session_compact"]
    assert (before["reason"], before["willRetry"]) == ("manual", False)
    assert (after["reason"], after["willRetry"]) == ("manual", False)
    assert seen["session_compact_failed"] == []
    [event] = kit.of("session_compact")
    assert (event["reason"], event["willRetry"]) == ("manual", False)


async def test_threshold_compaction_hooks_say_threshold_and_no_retry() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=9500)], [reply("more")]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    seen = listen(kit, "session_before_compact", "session_compact")
    await two_turns(kit)
    assert [(p["reason"], p["willRetry"]) for p in seen["session_before_compact"]] == [
        ("threshold", False)
    ]
    assert [(p["reason"], p["willRetry"]) for p in seen["session_compact"]] == [
        ("threshold", False)
    ]


async def test_overflow_recovery_hooks_say_overflow_and_will_retry() -> None:
    kit = overflow_kit([summary(), summary()])
    seen = listen(kit, "session_before_compact", "session_compact")
    await two_turns(kit)
    [before] = seen["session_before_compact"]
    [after] = seen["session_compact"]
    assert (before["reason"], before["willRetry"]) == ("overflow", True)
    assert (after["reason"], after["willRetry"]) == ("overflow", True)
    # The omission is written before the hooks hear of the compaction (pi's order).
    assert after["compactionEntry"]["parentId"] == kit.session.tree.entries[4]["id"]
    assert kit.session.tree.entries[4]["type"] == "context_edit"


async def test_a_failed_overflow_compaction_tells_session_compact_failed() -> None:
    kit = overflow_kit([FatalModelError("boom")])
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)
    expected = {
        "type": "session_compact_failed",
        "reason": "overflow",
        "errorMessage": "Context overflow recovery failed: boom",
        "aborted": False,
        "willRetry": False,  # pi's code passes false on every failure
        "fromExtension": False,
    }
    assert seen["session_compact_failed"] == [expected]
    assert kit.of("session_compact_failed") == [{k: v for k, v in expected.items() if k != "type"}]


async def test_a_failed_threshold_compaction_says_auto_compaction_failed() -> None:
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=9500)]],
        summaries=[FatalModelError("boom")],
        runtime_settings=settings(adaptive_keep=False),
    )
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)
    [failed] = seen["session_compact_failed"]
    assert (failed["reason"], failed["errorMessage"]) == (
        "threshold",
        "Auto-compaction failed: boom",
    )
    assert failed["aborted"] is False


async def test_a_cancelled_compaction_is_aborted_without_an_error_message() -> None:
    kit = make_kit()
    kit.runtime.hooks.on("session_before_compact", lambda payload: {"cancel": True})
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)
    with pytest.raises(Cancelled):
        await kit.runtime.compact()
    assert seen["session_compact_failed"] == [
        {
            "type": "session_compact_failed",
            "reason": "manual",
            "aborted": True,
            "willRetry": False,
            "fromExtension": False,
        }
    ]


async def test_a_failed_manual_compaction_says_compaction_failed() -> None:
    kit = make_kit([FatalModelError("boom")])
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)
    with pytest.raises(ModelError):
        await kit.runtime.compact()
    [failed] = seen["session_compact_failed"]
    assert (failed["reason"], failed["errorMessage"], failed["aborted"]) == (
        "manual",
        "Compaction failed: boom",
        False,
    )


async def test_a_manual_compaction_with_nothing_to_compact_is_a_failure_to_pi() -> None:
    # Pi throws "Nothing to compact ..." after compaction_start, and reports it as a failure;
    # an automatic one with nothing to compact is never started, so it tells nobody.
    kit = Kit(turns=[[reply("tiny", tokens=10)]], runtime_settings=settings(adaptive_keep=False))
    seen = listen(kit, "session_compact_failed")
    await kit.runtime.prompt("hi")
    outcome = await kit.runtime.compact()
    assert outcome.status == "skipped"
    [failed] = seen["session_compact_failed"]
    assert failed["reason"] == "manual"
    assert failed["errorMessage"] == f"Compaction failed: {outcome.reason}"
    assert failed["aborted"] is False


async def test_a_hook_supplied_compaction_that_cannot_commit_says_from_extension() -> None:
    kit = make_kit()
    kit.runtime.hooks.on(
        "session_before_compact",
        lambda payload: {
            "compaction": {
                "summary": "HOOK SUMMARY",
                "firstKeptEntryId": payload["preparation"]["firstKeptEntryId"],
                "tokensBefore": 999,
            }
        },
    )
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")

    kit.session.store.append = refuse  # type: ignore[method-assign]
    with pytest.raises(OrchestratorError):
        await kit.runtime.compact()
    [failed] = seen["session_compact_failed"]
    assert failed["fromExtension"] is True
    assert failed["errorMessage"].startswith("Compaction failed: ")


async def test_overflow_recovery_giving_up_tells_session_compact_failed() -> None:
    kit = Kit(
        turns=[
            [reply("first", tokens=2000)],
            [error_reply("context_length_exceeded")],
            [error_reply("context_length_exceeded")],
        ],
        summaries=[summary(), summary()],
        runtime_settings=settings(adaptive_keep=False),
    )
    seen = listen(kit, "session_compact_failed")
    await two_turns(kit)
    assert seen["session_compact_failed"] == [
        {
            "type": "session_compact_failed",
            "reason": "overflow",
            "errorMessage": OVERFLOW_FAILED,
            "aborted": False,
            "willRetry": False,
            "fromExtension": False,
        }
    ]
