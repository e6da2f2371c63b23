"""A handler's malformed result is reported and its default applies (D25, hook_results.py).

Before, ``{"context": 5}`` from ``session.compacting`` was a ``TypeError`` out of ``compact()``,
``tokensBefore: "many"`` a ``ValueError``, and a supplied compaction with an empty summary or an
id the branch does not have was written into the session as it came.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.testing import reply
from tests.runtime_kit import BIG, SUMMARY, Kit, settings, summary

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def compaction_kit() -> Kit:
    return Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[summary()],
        runtime_settings=settings(adaptive_keep=False),
    )


async def compacted_with(kit: Kit, hook: str, handler: Any) -> dict[str, Any]:
    kit.runtime.hooks.on(hook, handler)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    await kit.runtime.compact()
    entry = kit.session.tree.entries[-1]
    assert entry["type"] == "compaction"
    return entry


def hook_errors(kit: Kit) -> list[str]:
    return [str(event["error"]) for event in kit.of("hook_error")]


@pytest.mark.parametrize(
    ("result", "complaint"),
    [
        ({"summary": "from the hook", "tokensBefore": "many"}, "tokensBefore must be a whole"),
        ({"summary": "from the hook", "tokensBefore": -3}, "tokensBefore must be a whole"),
        ({"summary": "from the hook", "tokensBefore": True}, "tokensBefore must be a whole"),
        ({"summary": "   "}, "summary must be a non-empty string"),
        ({"summary": 12}, "summary must be a non-empty string"),
        ({"summary": "x", "firstKeptEntryId": "nope0000"}, "'nope0000' is not an entry"),
        ({"summary": "x", "firstKeptEntryId": 7}, "firstKeptEntryId must be an entry id"),
        ({"summary": "x", "details": ["a.py"]}, "details must be an object"),
        ({"summary": "x", "preserveData": "keep"}, "preserveData must be an object"),
        ({"summary": "x", "shortSummary": 1}, "shortSummary must be a string"),
        ("just a string", "compaction must be an object"),
    ],
)
async def test_a_malformed_supplied_compaction_is_reported_and_the_model_summarizes(
    result: Any, complaint: str
) -> None:
    kit = compaction_kit()
    entry = await compacted_with(
        kit, "session_before_compact", lambda payload: {"compaction": result}
    )
    assert entry["summary"].startswith(SUMMARY)
    assert entry.get("fromExtension") is not True
    assert len(kit.model.requests) == 1
    errors = hook_errors(kit)
    assert any(complaint in error for error in errors), errors
    assert all(e.startswith("invalid result: session_before_compact") for e in errors)
    assert errors[-1].endswith("summarized as without a hook")


async def test_a_supplied_compaction_may_keep_from_any_entry_of_the_branch() -> None:
    kit = compaction_kit()
    kept: list[str] = []

    def supply(payload: dict[str, Any]) -> dict[str, Any]:
        kept.append(payload["branchEntries"][1]["id"])
        return {"compaction": {"summary": "hook", "firstKeptEntryId": kept[0]}}

    committed = await compacted_with(kit, "session_before_compact", supply)
    assert committed["firstKeptEntryId"] == kept[0]
    assert committed["summary"] == "hook"
    assert committed["fromExtension"] is True
    assert hook_errors(kit) == []
    assert kit.model.requests == []


@pytest.mark.parametrize(
    ("result", "complaint", "in_prompt"),
    [
        ({"context": 5}, "context must be a list of strings", None),
        ({"context": "one line"}, "context must be a list of strings", None),
        ({"context": ["fine", 3]}, "context must be a list of strings", None),
        ({"prompt": 7}, "prompt must be a non-empty string", None),
        ({"prompt": ""}, "prompt must be a non-empty string", None),
        ({"preserveData": [1]}, "preserveData must be an object", None),
        # The sound fields are used, the malformed one is left out.
        ({"context": ["ticket ABC-1"], "prompt": 7}, "prompt must be", "ticket ABC-1"),
    ],
)
async def test_a_malformed_compacting_field_is_reported_and_ignored(
    result: dict[str, Any], complaint: str, in_prompt: str | None
) -> None:
    kit = compaction_kit()
    entry = await compacted_with(kit, "session.compacting", lambda payload: result)
    assert entry["summary"].startswith(SUMMARY)
    assert "preserveData" not in entry
    errors = hook_errors(kit)
    assert len(errors) == 1, errors
    assert complaint in errors[0]
    assert errors[0].startswith("invalid result: session.compacting")
    prompt = kit.model.requests[0].prompt
    if in_prompt is None:
        assert "<additional-context>" not in prompt
    else:
        assert in_prompt in prompt


async def conversation(kit: Kit) -> dict[str, str]:
    await kit.runtime.prompt("first question")
    await kit.runtime.prompt("second question")
    ids = [e["id"] for e in kit.session.tree.entries]
    return dict(zip(["u1", "a1", "u2", "a2"], ids, strict=True))


def navigation_kit() -> Kit:
    return Kit(turns=[[reply("one")], [reply("two")]], summaries=[summary()])


@pytest.mark.parametrize(
    ("result", "complaint"),
    [
        ({"customInstructions": 5}, "customInstructions must be a string or null"),
        ({"label": ["x"]}, "label must be a string or null"),
        ({"replaceInstructions": "yes"}, "replaceInstructions must be true or false"),
        ({"summary": "plain text"}, "summary must be an object with a non-empty summary"),
        ({"summary": {"summary": ""}}, "summary must be an object with a non-empty summary"),
        ({"summary": {"summary": "ok", "details": 3}}, "summary.details must be an object"),
    ],
)
async def test_a_malformed_before_tree_field_is_reported_and_the_navigation_goes_on(
    result: dict[str, Any], complaint: str
) -> None:
    kit = navigation_kit()
    ids = await conversation(kit)
    kit.runtime.hooks.on("session_before_tree", lambda payload: result)
    outcome = await kit.runtime.navigate(ids["a1"], summarize=True, label="mine")
    entry = outcome.summary_entry
    assert entry is not None
    assert SUMMARY in entry["summary"]  # the model's, not the hook's
    assert entry.get("fromHook") is not True
    assert len(kit.model.requests) == 1
    labels = [e for e in kit.session.tree.entries if e["type"] == "label"]
    assert [e["label"] for e in labels] == ["mine"]
    errors = hook_errors(kit)
    assert len(errors) == 1, errors
    assert complaint in errors[0]


async def test_before_tree_null_clears_the_instructions_and_the_label() -> None:
    kit = navigation_kit()
    ids = await conversation(kit)
    kit.runtime.hooks.on(
        "session_before_tree", lambda payload: {"customInstructions": None, "label": None}
    )
    outcome = await kit.runtime.navigate(
        ids["a1"], summarize=True, instructions="FOCUS-ON-THIS", label="mine"
    )
    assert outcome.summary_entry is not None
    assert "FOCUS-ON-THIS" not in kit.model.requests[0].prompt
    assert [e for e in kit.session.tree.entries if e["type"] == "label"] == []
    assert hook_errors(kit) == []
