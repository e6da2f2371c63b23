"""A context built from a path takes the usual messages on a short way: the same context.

``ContextBuilder(path)`` writes a message entry's push out in one loop, estimates the usual user
message and tool result without the general walk (``tokens.quick_estimate``) and takes an
assistant's estimate, model and file operations in one walk. These properties hold all of it to
the general steps, entry by entry, on paths of odd messages (content that is no list, blocks that
are no dicts, missing or mistyped fields, non-ASCII and astral text) among compactions, context
edits, nested calls and system messages.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.context import FILE_TOOLS, ContextBuilder
from orchestrator._core.entries import Message
from orchestrator._core.tokens import estimate_tokens, quick_estimate
from orchestrator._store.reports import context_report_of, short_summary_of
from tests.test_context_restart import fields
from tests.test_measured_serialization import ASSISTANTS, TEXT, messages, outcome

PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_PATHS = st.sampled_from(["a.py", "", "é/😀.py", 3, None])
_CALLS = st.builds(
    lambda name, path: {"type": "toolCall", "id": "c", "name": name, "arguments": {"path": path}},
    st.sampled_from([*FILE_TOOLS, "bash", 7, None]),
    _PATHS,
)
_USUAL = st.one_of(
    st.builds(
        lambda role, text: {"role": role, "content": [{"type": "text", "text": text}]},
        st.sampled_from(["user", "toolResult"]),
        TEXT | st.integers() | st.sampled_from(["x" * 41, "é😀"]),
    ),
    st.builds(
        lambda blocks, provider: {
            "role": "assistant",
            "content": blocks,
            "provider": provider,
            "model": "m",
        },
        st.lists(_CALLS | st.just({"type": "text", "text": "t"}), max_size=3),
        st.sampled_from(["p", "q", None]),
    ),
    st.builds(
        lambda calls: {"role": "toolResult", "content": "r", "nestedCalls": {"calls": calls}},
        st.lists(_CALLS, max_size=2),
    ),
    st.just({"role": "system", "content": "You are here."}),
    st.just({"role": "user"}),  # no content: read as empty
)
MESSAGES = messages() | ASSISTANTS | _USUAL


@PROPERTIES
@given(MESSAGES)
def test_the_quick_estimate_is_the_estimate(message: Message) -> None:
    assert outcome(quick_estimate, message, message.get("role")) == outcome(
        estimate_tokens, message
    )


_SHORT = st.fixed_dictionaries({}, optional={"shortSummary": st.sampled_from(["short", " ", 5])})


@st.composite
def paths(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A linear path of message entries among compactions, context edits and other entries."""
    path: list[dict[str, Any]] = []
    for k in range(draw(st.integers(min_value=0, max_value=14))):
        entry: dict[str, Any] = {"id": f"e{k}", "parentId": f"e{k - 1}" if k else None}
        kind = draw(st.sampled_from(["message"] * 6 + ["compaction", "edit", "other", "bad", "b"]))
        earlier = st.sampled_from([e["id"] for e in path] or ["none"])
        if kind == "message":
            entry.update(type="message", message=draw(MESSAGES))
        elif kind == "compaction":
            entry.update(type="compaction", summary="s", firstKeptEntryId=draw(earlier))
            entry.update(draw(_SHORT))
            if draw(st.booleans()):  # a system checkpoint: the head's first message
                entry["systemMessage"] = {"role": "system", "content": "checkpoint"}
        elif kind == "edit":
            replacement = draw(st.none() | st.just({"content": "edited"}))
            entry.update(type="context_edit", targetId=draw(earlier), replacement=replacement)
        elif kind == "b":
            entry.update(type="branch_summary", fromId=draw(earlier), summary="b", **draw(_SHORT))
        elif kind == "other":
            entry.update(type="model_change", provider="x", modelId="y")
        else:  # a message entry whose message is no dict
            entry.update(type="message", message=draw(st.none() | st.just("text")))
        path.append(entry)
    return path


@PROPERTIES
@given(paths())
def test_a_context_built_from_a_path_is_the_one_pushed_entry_by_entry(
    path: list[dict[str, Any]],
) -> None:
    pushed, measured = ContextBuilder(), ContextBuilder(measured=True)
    for entry in path:
        pushed.push(entry)
        measured.push(entry)
    built = fields(ContextBuilder(path).context())
    assert built == fields(pushed.context())
    assert built == fields(measured.context())
    assert built == fields(ContextBuilder(path, measured=True).context())


def _reference_events(messages: list[Message]) -> list[tuple[int, str, str]]:
    events = []
    for index, message in enumerate(messages):
        content = message.get("content")
        blocks = content if message.get("role") == "assistant" and isinstance(content, list) else []
        nested = message.get("nestedCalls") if message.get("role") == "toolResult" else None
        calls = nested.get("calls") if isinstance(nested, dict) else None
        blocks = [b for b in blocks if isinstance(b, dict) and b.get("type") == "toolCall"]
        for block in [*blocks, *(calls if isinstance(calls, list) else [])]:
            arguments = block.get("arguments") if isinstance(block, dict) else None
            path = arguments.get("path") if isinstance(arguments, dict) else None
            name = block.get("name") if isinstance(block, dict) else None
            if name in FILE_TOOLS and isinstance(path, str) and path:
                events.append((index, name, path))
    return events


@PROPERTIES
@given(st.lists(MESSAGES, max_size=8))
def test_file_operations_are_those_of_the_calls(batch: list[Message]) -> None:
    path = [
        {"type": "message", "id": f"e{k}", "parentId": f"e{k - 1}" if k else None, "message": m}
        for k, m in enumerate(batch)
    ]
    context = ContextBuilder(path).context()
    assert fields(context)["events"] == _reference_events(list(context.messages))


@PROPERTIES
@given(paths())
def test_short_summaries_are_those_of_each_message_entry(path: list[dict[str, Any]]) -> None:
    context = ContextBuilder(path).context()
    by_id = {entry["id"]: entry for entry in path}
    expected = [short_summary_of(by_id.get(entry_id) or {}) for entry_id in context.entry_ids]
    for view in (context, dataclasses.replace(context, index=None)):
        report = context_report_of(view, context.tokens(), by_id, None)
        assert report["messageShortSummaries"] == expected
