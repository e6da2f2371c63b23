"""Hooks around compaction, navigation and forks (decision D25)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator._core.errors import Cancelled
from orchestrator._runtime.hooks import Hooks
from orchestrator.testing import reply
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
    from orchestrator._core.errors import ModelError
    from orchestrator._runtime.summarize import SummaryRoutes
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
        [ModelError("bad request", kind="fatal"), ModelError("bad request", kind="fatal")],
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
