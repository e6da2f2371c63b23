"""build_context conformance (pi's build-context.test.ts cases)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator._core.context import ContextBuilder, ModelRef, build_context
from orchestrator._core.tree import SessionTree

HEADER = {
    "type": "session",
    "version": 3,
    "id": "s",
    "timestamp": "2026-01-01T00:00:00.000Z",
    "cwd": "/w",
}


def ts(n: int) -> str:
    return f"2026-01-01T00:00:{n:02d}.000Z"


def msg(eid: str, parent: str | None, role: str, n: int, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "timestamp": 1767225600000 + n * 1000}
    if role == "user":
        message["content"] = extra.pop("content", f"user {eid}")
    elif role == "assistant":
        message.update(
            content=[{"type": "text", "text": f"reply {eid}"}],
            provider=extra.pop("provider", "anthropic"),
            model=extra.pop("model", "claude"),
            usage={"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15},
            stopReason="stop",
        )
    message.update(extra)
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": ts(n),
        "message": message,
    }


def linear() -> list[dict[str, Any]]:
    return [
        msg("u1", None, "user", 1),
        msg("a1", "u1", "assistant", 2),
        msg("u2", "a1", "user", 3),
        msg("a2", "u2", "assistant", 4),
    ]


def test_empty_path_gives_empty_context() -> None:
    context = build_context([])
    assert context.messages == ()
    assert context.thinking_level == "off"
    assert context.model is None


def test_conversation_without_compaction() -> None:
    context = build_context(linear())
    assert [m["role"] for m in context.messages] == ["user", "assistant", "user", "assistant"]
    assert context.model == ModelRef(provider="anthropic", model_id="claude")
    assert context.entry_ids == ("u1", "a1", "u2", "a2")


def test_thinking_and_model_changes_tracked_and_assistant_overrides_model_change() -> None:
    path = [
        msg("u1", None, "user", 1),
        {
            "type": "thinking_level_change",
            "id": "t1",
            "parentId": "u1",
            "timestamp": ts(2),
            "thinkingLevel": "high",
        },
        {
            "type": "model_change",
            "id": "m1",
            "parentId": "t1",
            "timestamp": ts(3),
            "provider": "openai",
            "modelId": "gpt",
        },
        msg("a1", "m1", "assistant", 4),
    ]
    context = build_context(path)
    assert context.thinking_level == "high"
    assert context.model == ModelRef(provider="anthropic", model_id="claude")
    assert build_context(path[:3]).model == ModelRef(provider="openai", model_id="gpt")


def test_d1_model_change_in_omp_shape() -> None:
    path: list[dict[str, Any]] = [
        {
            "type": "model_change",
            "id": "m1",
            "parentId": None,
            "timestamp": ts(1),
            "model": "openai/gpt-5",
        },
        {
            "type": "model_change",
            "id": "m2",
            "parentId": "m1",
            "timestamp": ts(2),
            "model": "x/small",
            "role": "smol",
        },
    ]
    assert build_context(path).model == ModelRef(provider="openai", model_id="gpt-5")


def compaction(
    eid: str, parent: str, first_kept: str, n: int, summary: str = "SUMMARY"
) -> dict[str, Any]:
    return {
        "type": "compaction",
        "id": eid,
        "parentId": parent,
        "timestamp": ts(n),
        "summary": summary,
        "firstKeptEntryId": first_kept,
        "tokensBefore": 1234,
    }


def test_single_compaction_gives_summary_kept_and_after() -> None:
    path = linear() + [
        compaction("c1", "a2", "u2", 5),
        msg("u3", "c1", "user", 6),
        msg("a3", "u3", "assistant", 7),
    ]
    context = build_context(path)
    roles = [m["role"] for m in context.messages]
    assert roles == ["compactionSummary", "user", "assistant", "user", "assistant"]
    first = context.messages[0]
    assert first == {
        "role": "compactionSummary",
        "summary": "SUMMARY",
        "tokensBefore": 1234,
        "timestamp": 1767225605000,
    }
    assert context.entry_ids == ("c1", "u2", "a2", "u3", "a3")


def test_multiple_compactions_only_latest_counts() -> None:
    path = linear() + [
        compaction("c1", "a2", "u2", 5, "FIRST"),
        msg("u3", "c1", "user", 6),
        msg("a3", "u3", "assistant", 7),
        compaction("c2", "a3", "u3", 8, "SECOND"),
    ]
    context = build_context(path)
    assert [m.get("summary") for m in context.messages if m["role"] == "compactionSummary"] == [
        "SECOND"
    ]
    assert context.entry_ids == ("c2", "u3", "a3")


def test_first_kept_is_first_entry_keeps_all() -> None:
    path = linear() + [compaction("c1", "a2", "u1", 5)]
    assert build_context(path).entry_ids == ("c1", "u1", "a1", "u2", "a2")


def test_unknown_first_kept_keeps_nothing_before_compaction() -> None:
    path = linear() + [compaction("c1", "a2", "zzzzzzzz", 5), msg("u3", "c1", "user", 6)]
    assert build_context(path).entry_ids == ("c1", "u3")


def test_custom_message_and_branch_summary_become_messages_custom_entries_do_not() -> None:
    path = [
        msg("u1", None, "user", 1),
        {
            "type": "custom",
            "id": "x1",
            "parentId": "u1",
            "timestamp": ts(2),
            "customType": "state",
            "data": {"a": 1},
        },
        {
            "type": "custom_message",
            "id": "x2",
            "parentId": "x1",
            "timestamp": ts(3),
            "customType": "note",
            "content": "hello",
            "display": True,
        },
        {
            "type": "branch_summary",
            "id": "b1",
            "parentId": "x2",
            "timestamp": ts(4),
            "fromId": "zz",
            "summary": "went elsewhere",
        },
        {
            "type": "branch_summary",
            "id": "b2",
            "parentId": "b1",
            "timestamp": ts(5),
            "fromId": "zz",
            "summary": "",
        },
        {
            "type": "label",
            "id": "l1",
            "parentId": "b2",
            "timestamp": ts(6),
            "targetId": "u1",
            "label": "start",
        },
        {
            "type": "mystery_future_type",
            "id": "f1",
            "parentId": "l1",
            "timestamp": ts(7),
            "payload": [1, 2],
        },
    ]
    context = build_context(path)
    assert [m["role"] for m in context.messages] == ["user", "custom", "branchSummary"]
    assert context.messages[1] == {
        "role": "custom",
        "customType": "note",
        "content": "hello",
        "display": True,
        "timestamp": 1767225603000,
    }
    assert context.messages[2] == {
        "role": "branchSummary",
        "summary": "went elsewhere",
        "fromId": "zz",
        "timestamp": 1767225604000,
    }


def test_branches_context_follows_leaf_and_unknown_leaf_falls_back() -> None:
    entries = linear() + [
        msg("u2b", "a1", "user", 5, content="other"),
        msg("a2b", "u2b", "assistant", 6),
    ]
    tree = SessionTree(HEADER, entries)
    assert [e["id"] for e in tree.path()] == ["u1", "a1", "u2b", "a2b"]
    assert build_context(tree.path("a2")).entry_ids == ("u1", "a1", "u2", "a2")


def test_complex_tree_with_compaction_on_one_branch_and_summary_on_another() -> None:
    entries = linear() + [
        compaction("c1", "a2", "u2", 5),
        msg("u3", "c1", "user", 6),
        {
            "type": "branch_summary",
            "id": "b1",
            "parentId": "a1",
            "timestamp": ts(7),
            "fromId": "u3",
            "summary": "tried compaction branch",
        },
        msg("u4", "b1", "user", 8),
    ]
    tree = SessionTree(HEADER, entries)
    assert build_context(tree.path("u3")).entry_ids == ("c1", "u2", "a2", "u3")
    assert build_context(tree.path("u4")).entry_ids == ("u1", "a1", "b1", "u4")


def test_orphan_gives_only_the_orphan_chain() -> None:
    entries = [msg("u1", None, "user", 1), msg("o1", "missing!", "user", 2)]
    tree = SessionTree(HEADER, entries)
    assert [e["id"] for e in tree.path()] == ["o1"]


def test_incremental_builder_matches_batch_build() -> None:
    path = linear() + [
        compaction("c1", "a2", "u2", 5),
        msg("u3", "c1", "user", 6),
        msg("a3", "u3", "assistant", 7),
    ]
    builder = ContextBuilder()
    for i, entry in enumerate(path):
        builder.push(entry)
        assert builder.context() == build_context(path[: i + 1])


def test_tokens_of_context_use_usage_anchor() -> None:
    context = build_context(linear() + [msg("u3", "a2", "user", 5, content="x" * 40)])
    tokens = context.tokens()
    assert tokens.usage_tokens == 15
    assert tokens.trailing_tokens == 10
    assert tokens.last_usage_index == 3


def test_snapshot_is_immutable_while_builder_grows() -> None:
    builder = ContextBuilder(linear())
    before = builder.context()
    builder.push(msg("u3", "a2", "user", 5))
    after = builder.context()
    assert len(before.messages) == 4
    assert len(after.messages) == 5
    assert list(before.entry_ids) == ["u1", "a1", "u2", "a2"]
    assert before.entry_ids[-1] == "a2"
    assert before.entry_ids[1:3] == ("a1", "u2")
    with pytest.raises(IndexError):
        before.entry_ids[4]
    builder.push(compaction("c1", "u3", "u2", 6))
    assert list(before.entry_ids) == ["u1", "a1", "u2", "a2"]
    assert list(after.entry_ids) == ["u1", "a1", "u2", "a2", "u3"]


def test_the_context_is_built_once_per_moment_and_again_after_a_push() -> None:
    # A commit asks for the live context several times over; each push makes a new moment.
    from tests.sessions import SessionBuilder, usage

    s = SessionBuilder()
    s.user("first")
    s.assistant("answer", usage=usage(100))
    path = s.path()
    builder = ContextBuilder(path[:-1])
    before = builder.context()
    assert builder.context() is before
    builder.push(path[-1])
    after = builder.context()
    assert after is not before
    assert builder.context() is after
    assert len(before.messages) == 1  # the earlier moment's view is unchanged
    assert len(after.messages) == 2
