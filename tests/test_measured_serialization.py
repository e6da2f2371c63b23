"""Serializing newest first against the budget gives exactly what serializing everything gave.

A summary request used to serialize every summarized message and then elide the oldest part to
fit the summarizer's window. Now the context keeps each message's serialized length as it grows
(measured without writing the text where the shape allows) and the request serializes only the
newest messages that fit (issue 9). This module keeps the old serializer as the reference and
compares, over random messages and sessions: lengths, texts, elided conversations, whole
requests, and the running sums a live context keeps.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction
from orchestrator._core.context import FILE_TOOLS, ContextBuilder, ContextIndex
from orchestrator._core.entries import Message
from orchestrator._core.errors import ModelError
from orchestrator._core.js_json import js_json
from orchestrator._core.measured_messages import MeasuredMessages
from orchestrator._core.messages import to_llm_messages
from orchestrator._core.model import ModelRequest
from orchestrator._core.serialize import (
    LATE_ROLES,
    SHAPE_OTHER,
    SHAPE_SHORT_RESULT,
    SHAPE_TEXT_AND_CALL,
    SHAPE_USER_TEXT,
    measure,
    measure_shaped,
    serial_step,
    serialize_conversation,
    serialize_message,
    serialize_shaped,
    serialized_length,
    shaped_parts,
    truncate_for_summary,
)
from orchestrator._core.summary_request import (
    PromptBudget,
    _elide,
    elide_oldest,
    history_request,
    turn_prefix_request,
)
from orchestrator._core.tokens import CompactionSettings, estimate_tokens, json_length
from orchestrator._core.utf16 import escape_lone_surrogates, json_string_len, utf16_len
from tests.test_planning_properties import KEEP, sessions

# --- the reference: the serializer as it was, whole conversation at once ---------------------


def _reference_js_json(value: Any) -> str:
    if isinstance(value, str):
        return escape_lone_surrogates(json.dumps(value, ensure_ascii=False))
    if isinstance(value, bool) or value is None:
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return js_json(value)  # numbers: tested against JavaScript in test_serialize
    if isinstance(value, dict):
        items = (f"{_reference_js_json(str(k))}:{_reference_js_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_reference_js_json(item) for item in value) + "]"
    return _reference_js_json(str(value))


def _reference_call(name: str, arguments: object) -> str:
    pairs = arguments.items() if isinstance(arguments, dict) else ()
    return f"{name}({', '.join(f'{key}={_reference_js_json(value)}' for key, value in pairs)})"


def _reference_texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(block.get("text") or "")
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    ]


def _reference_assistant(message: Message) -> list[str]:
    # pi 1.2 and later leave thinking out of the summary request.
    texts: list[str] = []
    calls: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "toolCall":
            calls.append(_reference_call(str(block.get("name", "")), block.get("arguments")))
    parts = []
    if texts:
        parts.append("[Assistant]: " + "\n".join(texts))
    if calls:
        parts.append("[Assistant tool calls]: " + "; ".join(calls))
    return parts


def reference_serialize(messages: Sequence[Message]) -> str:
    parts: list[str] = []
    for message in to_llm_messages(messages):
        role = message.get("role")
        if role == "user":
            text = "".join(_reference_texts(message.get("content")))
            if text:
                parts.append(f"[User]: {text}")
        elif role == "assistant":
            parts.extend(_reference_assistant(message))
        else:
            text = "".join(_reference_texts(message.get("content")))
            if text:
                parts.append(f"[Tool result]: {truncate_for_summary(text)}")
    return "\n\n".join(parts)


def reference_json_len(value: object) -> int:
    # JSON.stringify's length: strings as json.dumps writes them, numbers as JavaScript does.
    return utf16_len(_reference_js_json(value))


def from_scratch_sums(messages: Sequence[Message]) -> list[int]:
    sums = [0]
    for message in messages:
        sums.append(sums[-1] + serial_step(utf16_len(reference_serialize([message]))))
    return sums


# --- random messages ---------------------------------------------------------------------------

# Plain ASCII, characters JSON escapes, non-ASCII, pairs and lone surrogates (D26).
CHARS = st.sampled_from(["a", "b", " ", "\n", "\t", '"', "\\", "\x01", "\x7f", "é", "😀", "\ud800"])
TEXT = st.lists(CHARS, max_size=12).map("".join) | st.text(max_size=12)
LONG = st.builds(
    lambda head, size, tail: head + "x" * size + tail,
    TEXT,
    st.integers(min_value=1980, max_value=2010),
    TEXT,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
ARGUMENTS = st.dictionaries(TEXT, JSON, max_size=3) | JSON


def _block(kind: str, text: object) -> dict[str, Any]:
    return {"type": kind, kind if kind == "thinking" else "text": text}


BLOCK = st.one_of(
    st.builds(_block, st.sampled_from(["text", "thinking"]), TEXT | LONG | st.none()),
    st.builds(
        lambda name, arguments: {"type": "toolCall", "id": "c", "name": name, **arguments},
        TEXT | st.none(),
        st.fixed_dictionaries({}, optional={"arguments": ARGUMENTS}),
    ),
    st.just({"type": "image", "data": "AAAA", "mimeType": "image/png"}),
    st.just("junk"),
    st.builds(_block, st.sampled_from(["text", "thinking"]), st.integers()),  # not a string
)
CONTENT = TEXT | LONG | st.none() | st.lists(BLOCK, max_size=4)
ROLE = st.sampled_from(
    ["user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary", "unknown"]
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(ROLE)
    message: Message = {"role": role, "content": draw(CONTENT), "timestamp": 1}
    if role == "toolResult" and draw(st.booleans()):
        message["prunedAt"] = 5
    if role == "bashExecution":
        message.update(command=draw(TEXT), output=draw(TEXT | LONG), exitCode=draw(JSON))
    if role == "branchSummary":
        message["summary"] = draw(TEXT)
    return message


def outcome(function: Any, *args: Any) -> Any:
    """What a call returns, or the type of what it raises: malformed shapes must fail alike."""
    try:
        return function(*args)
    except (TypeError, AttributeError) as error:
        return type(error)


PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(messages())
def test_a_measured_length_is_the_length_of_the_text(message: Message) -> None:
    text = outcome(serialize_message, message)
    assert text == outcome(reference_serialize, [message])
    if isinstance(text, str):
        assert serialized_length(message) == utf16_len(text)


TOOL_CALL = st.builds(
    lambda name, arguments: {"type": "toolCall", "id": "c", "name": name, "arguments": arguments},
    TEXT,
    st.dictionaries(TEXT, TEXT | JSON, max_size=3),
)


@PROPERTIES
@given(st.lists(TOOL_CALL | BLOCK, min_size=1, max_size=3))
def test_tool_calls_are_measured_as_written(blocks: list[Any]) -> None:
    message: Message = {"role": "assistant", "content": blocks}
    text = outcome(serialize_message, message)
    assert text == outcome(reference_serialize, [message])
    if isinstance(text, str):
        assert serialized_length(message) == utf16_len(text)


@pytest.mark.parametrize(
    "text",
    [
        "x" * 1999 + "😀" + "y" * 5,  # the cut would split the pair: it moves one unit earlier
        "x" * 1998 + "😀" + "y" * 5,
        "é" * 2001,
        "x" * 2001,
        "x" * 2000,
    ],
)
def test_long_tool_results_are_measured_as_cut(text: str) -> None:
    for content in (text, [{"type": "text", "text": text}]):
        message: Message = {"role": "toolResult", "toolCallId": "c", "content": content}
        assert serialized_length(message) == utf16_len(reference_serialize([message]))


@PROPERTIES
@given(st.lists(messages(), max_size=6))
def test_the_conversation_is_the_reference_serialization(batch: list[Message]) -> None:
    assert outcome(serialize_conversation, batch) == outcome(reference_serialize, batch)


ASSISTANTS = st.builds(
    lambda blocks: {"role": "assistant", "content": blocks}, st.lists(TOOL_CALL | BLOCK, max_size=3)
)


@PROPERTIES
@given(messages() | ASSISTANTS)
def test_one_pass_measures_what_the_estimate_and_the_serializer_measure(message: Message) -> None:
    assert outcome(measure, message) == outcome(
        lambda m: (estimate_tokens(m), serialized_length(m)), message
    )


@PROPERTIES
@given(st.lists(messages() | ASSISTANTS, max_size=6))
def test_messages_written_by_their_shape_are_what_the_reference_writes(
    batch: list[Message],
) -> None:
    """Issue 9: the shape the measure tells writes each message as the reference does."""
    shaped = [outcome(measure_shaped, message) for message in batch]
    if not all(isinstance(one, tuple) for one in shaped):
        return  # malformed: the measure fails (as the reference does, above)
    shapes = [one[2] for one in shaped]
    texts = serialize_shaped(batch, shapes)
    assert texts == [reference_serialize([message]) for message in batch]
    # The same from the parts the measure read (what the context keeps), which are what
    # shaped_parts reads again for a message no context measured.
    parts = [(one[3], one[4]) for one in shaped]
    assert parts == [shaped_parts(m, shape) for m, shape in zip(batch, shapes, strict=True)]
    flat = [item for pair in parts for item in pair]
    assert serialize_shaped(batch, shapes, flat) == texts


@PROPERTIES
@given(ARGUMENTS)
def test_the_estimate_measures_arguments_as_json_stringify_does(arguments: object) -> None:
    assert json_length(arguments) == reference_json_len(arguments)


@PROPERTIES
@given(TEXT | LONG)
def test_a_json_string_is_measured_as_written(text: str) -> None:
    assert json_string_len(text) == reference_json_len(text)


@PROPERTIES
@given(st.lists(messages(), max_size=8), st.integers(min_value=-50, max_value=6000))
def test_eliding_newest_first_gives_what_eliding_the_whole_text_gave(
    batch: list[Message], room: int
) -> None:
    if not isinstance(outcome(reference_serialize, batch), str):
        return  # malformed: fails alike (above)
    measured = MeasuredMessages(batch, from_scratch_sums(batch), 0)
    whole = reference_serialize(batch)
    assert measured == tuple(batch)
    assert measured.units() == utf16_len(whole)
    assert measured.text() == whole
    assert _elide(measured, None, measured.units(), room) == elide_oldest(whole, room)


@PROPERTIES
@given(st.lists(messages(), max_size=8), st.integers(min_value=0, max_value=6000), st.data())
def test_a_suffix_ends_the_text_and_is_long_enough(
    batch: list[Message], units: int, data: st.DataObject
) -> None:
    # Measured from an offset into longer running sums, as the context hands them out.
    before = data.draw(st.lists(messages(), max_size=3))
    if not isinstance(outcome(reference_serialize, [*before, *batch]), str):
        return  # malformed: fails alike (above)
    sums = from_scratch_sums([*before, *batch])
    measured = MeasuredMessages(batch, sums, len(before))
    whole = reference_serialize(batch)
    suffix = measured.suffix(units)
    assert whole.endswith(suffix)
    assert utf16_len(suffix) >= units or suffix == whole
    assert measured.suffix(units) == suffix  # the cached pieces give the same text


# Texts with runs of blank lines and the characters a cut must not misplace, in messages of the
# usual shapes (written as fragments) and others (written as paragraphs).
LINES = st.lists(st.sampled_from(["a", "b", "\n", "\n\n\n", "é", "😀", "x" * 700]), max_size=8).map(
    "".join
)


@st.composite
def usual_messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "result", "call", "other"]))
    text = draw(LINES | TEXT)
    if kind == "user":
        return {"role": "user", "content": [_block("text", text)], "timestamp": 1}
    if kind == "result":
        return {"role": "toolResult", "content": [_block("text", text)], "timestamp": 1}
    if kind == "call":
        call = _call({"path": draw(LINES | TEXT)})
        return {"role": "assistant", "content": [_block("text", text), call], "timestamp": 1}
    return draw(messages())


def shaped_window(batch: list[Message], before: int = 0) -> MeasuredMessages:
    """``batch[before:]`` as a live context hands it out: running sums, shapes and parts."""
    measured = [measure_shaped(message) for message in batch]
    parts = [part for one in measured for part in one[3:]]
    return MeasuredMessages.window(
        batch,
        before,
        len(batch),
        from_scratch_sums(batch),
        (),
        shapes=[one[2] for one in measured],
        parts=parts,
    )


@PROPERTIES
@given(
    st.lists(usual_messages(), max_size=10),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=-50, max_value=6000),
)
def test_a_conversation_written_as_fragments_is_cut_where_the_whole_text_is(
    batch: list[Message], before: int, room: int
) -> None:
    """Issue 9: the fragments' text and its cut are the reference's, to the character."""
    if not isinstance(outcome(reference_serialize, batch), str):
        return  # malformed: fails alike (above)
    before = min(before, len(batch))
    window = shaped_window(batch, before)
    whole = reference_serialize(batch[before:])
    for first in range(len(window)):
        made = window.fragments_from(first)
        assert made is not None
        fragments, ascii_only = made
        assert "".join(fragments) == reference_serialize(batch[before + first :])
        assert ascii_only == "".join(fragments).isascii()
        assert window.units_from(first) == utf16_len("".join(fragments))
    assert window.fragments_from(len(window)) is None
    assert "".join(_elide(window, None, window.units(), room)) == elide_oldest(whole, room)


@pytest.mark.parametrize("blank", [1, 2, 2500])
def test_a_cut_in_a_run_of_blank_lines_that_reaches_past_the_fragments_read_is_the_references(
    blank: int,
) -> None:
    """The fragments read around a cut end in blank lines: the cut goes on past them."""
    batch: list[Message] = [
        {"role": "user", "content": [_block("text", "x" * 3000 + "\n" * blank)]},
        {"role": "user", "content": [_block("text", "y" * 3000)]},
    ]
    window = shaped_window(batch)
    whole = reference_serialize(batch)
    for room in range(100, 9000, 23):
        assert "".join(_elide(window, None, window.units(), room)) == elide_oldest(whole, room)


def test_messages_without_shapes_are_not_written_as_fragments() -> None:
    batch: list[Message] = [{"role": "user", "content": [_block("text", "hi")]}]
    assert MeasuredMessages(batch, from_scratch_sums(batch)).fragments_from(0) is None


def test_messages_without_sums_are_serialized_whole() -> None:
    batch: list[Message] = [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]
    plain = MeasuredMessages(batch)
    assert plain.units() == len("[User]: hi\n\n[User]: yo")
    assert plain.suffix(1) == plain.text() == "[User]: hi\n\n[User]: yo"


# --- requests from plans, and the sums a live context keeps ------------------------------------


def _request_or_refusal(build: Any) -> ModelRequest | str:
    try:
        return build()  # type: ignore[no-any-return]
    except ModelError as error:
        return str(error)


WINDOWS = st.integers(min_value=1200, max_value=40_000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(branched=True), KEEP, WINDOWS, st.integers(min_value=0, max_value=3))
def test_requests_from_a_plan_equal_requests_from_its_plain_messages(
    session: Any, keep: int, window: int, halvings: int
) -> None:
    plan = plan_compaction(session.path(), CompactionSettings(keep_recent_tokens=keep))
    if not isinstance(plan, CompactionPlan):
        return
    budget = PromptBudget(context_window=window, halvings=halvings)
    for runs, request in (
        (plan.messages_to_summarize, history_request),
        (plan.turn_prefix_messages, turn_prefix_request),
    ):
        assert isinstance(runs, MeasuredMessages)
        assert runs.sums is not None

        def measured(runs: Sequence[Message] = runs, request: Any = request) -> Any:
            return request(runs, reserve_tokens=2000, budget=budget)

        def plain(runs: Sequence[Message] = runs, request: Any = request) -> Any:
            return request(tuple(runs), reserve_tokens=2000, budget=budget)

        assert _request_or_refusal(measured) == _request_or_refusal(plain)
        assert request(runs, reserve_tokens=2000) == request(tuple(runs), reserve_tokens=2000)


def _check_index(index: ContextIndex, context_messages: Sequence[Message]) -> None:
    # Summaries are measured late (when planned): they count 0 in the sums and are listed.
    late = [k for k, m in enumerate(context_messages) if m.get("role") in LATE_ROLES]
    assert [k for k in index.late if k < index.count] == late
    on_time = [{} if k in late else m for k, m in enumerate(context_messages)]
    serial = index.serial[: index.count + 1]
    assert [value - serial[0] for value in serial] == from_scratch_sums(on_time)
    for lo in range(index.count + 1):
        measured = index.measured(context_messages, range(lo, index.count))
        whole = reference_serialize(context_messages[lo:])
        assert measured.units() == utf16_len(whole)
        half = measured.suffix(utf16_len(whole) // 2)
        assert whole.endswith(half)
        assert utf16_len(half) >= utf16_len(whole) // 2
    # The file operations are the calls a scan of the assistant messages finds, in order.
    scanned = [
        (k, str(block.get("name")), block["arguments"]["path"])
        for k, message in enumerate(context_messages[: index.count])
        if message.get("role") == "assistant" and isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict)
        and block.get("type") == "toolCall"
        and str(block.get("name")) in FILE_TOOLS
        and isinstance(block.get("arguments"), dict)
        and isinstance(block["arguments"].get("path"), str)
        and block["arguments"]["path"]
    ]
    events = [
        (index.event_message[i], index.event_kind[i], index.event_path[i])
        for i in range(index.events)
    ]
    assert events == scanned
    for kind in FILE_TOOLS:
        first: dict[str, int] = {}
        for i in range(index.events):
            if index.event_kind[i] == kind:
                first.setdefault(index.event_path[i], index.event_message[i])
        seen = {p: at for p, at in index.first_seen[kind].items() if at < index.count}
        assert seen == first
        assert list(seen.values()) == sorted(seen.values())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(branched=False))
def test_a_live_context_keeps_the_sums_a_fresh_computation_gives(session: Any) -> None:
    live = ContextBuilder()
    views = []
    for entry in session.path():
        live.push(entry)
        context = live.context()
        assert context.index is not None
        views.append((context.index, tuple(context.messages)))
        _check_index(context.index, context.messages)
    for index, context_messages in views:  # earlier views still see what they saw
        _check_index(index, context_messages)


def test_file_operations_from_inside_the_context_are_found_by_scan() -> None:
    from tests.sessions import SessionBuilder

    s = SessionBuilder()
    s.assistant("a", calls=[("read", {"path": "x.py"})])
    s.tool_result("r")
    s.assistant("b", calls=[("edit", {"path": "y.py"}), ("read", {"path": "z.py"})])
    s.tool_result("r")
    s.tool_result("r")
    s.assistant("c", calls=[("read", {"path": "x.py"})])
    index = ContextBuilder(s.path()).context().index
    assert index is not None
    assert index.base == 0
    # From the start (what planning asks for): the first uses, up to the end asked for.
    assert index.file_operations(0, 6) == {
        "read": {"x.py", "z.py"},
        "write": set(),
        "edit": {"y.py"},
    }
    assert index.file_operations(0, 1) == {"read": {"x.py"}, "write": set(), "edit": set()}
    # From inside: only the calls in the range.
    assert index.file_operations(1, 5) == {"read": {"z.py"}, "write": set(), "edit": {"y.py"}}
    assert index.file_operations(3, 6) == {"read": {"x.py"}, "write": set(), "edit": set()}


def test_a_suffix_stops_at_the_first_message_boundary_that_is_enough() -> None:
    batch: list[Message] = [{"role": "user", "content": c} for c in "abc"]  # 9 units each
    measured = MeasuredMessages(batch, from_scratch_sums(batch), 0)
    assert measured.suffix(9) == "[User]: c"
    assert measured.suffix(10) == "[User]: b\n\n[User]: c"
    assert measured.suffix(20) == "[User]: b\n\n[User]: c"
    assert measured.suffix(21) == measured.text()


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": ["junk", {"type": "text", "text": "a"}, {"type": "image"}]},
        {
            "role": "toolResult",
            "content": ["junk", {"type": "image"}, {"type": "text", "text": "b"}],
        },
        {"role": "toolResult", "content": [{"type": "text", "text": "c"}], "prunedAt": 1},
        {"role": "assistant", "content": [{"type": "toolCall", "name": None, "arguments": {}}]},
        {"role": "assistant", "content": [{"type": "toolCall", "name": 5, "arguments": {"a": 1}}]},
        {"role": "assistant", "content": [{"type": "toolCall", "name": "f", "arguments": [1]}]},
        {
            "role": "assistant",
            "content": [{"type": "toolCall", "name": "f", "arguments": {"a": 1}}],
        },
        {"role": "assistant", "content": [{"type": "toolCall", "name": "f"}]},
        {"role": "assistant", "content": "plain"},
        {"role": "custom", "content": "note"},
    ],
)
def test_unusual_shapes_are_measured_alike(message: Message) -> None:
    assert outcome(measure, message) == outcome(
        lambda m: (estimate_tokens(m), serialized_length(m)), message
    )


def _call(arguments: object) -> dict[str, Any]:
    return {"type": "toolCall", "id": "c", "name": "read", "arguments": arguments}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": [_block("text", "t"), _call({"path": "a.py"})]},
        {"role": "assistant", "content": [_block("text", ""), _call({"path": "é😀\ud800"})]},
        {"role": "assistant", "content": [_block("text", "t"), _call({"path": 1})]},
        {"role": "assistant", "content": [_block("text", "t"), _call({1: "x"})]},
        {"role": "assistant", "content": [_block("text", "t"), _call({"a": "x", "b": "y"})]},
        {"role": "assistant", "content": [_block("text", "t"), _block("thinking", "x")]},
        {"role": "assistant", "content": [_block("text", "t")]},
        {"role": "assistant", "content": [_block("text", 5), _call({"path": "a"})]},
        {"role": "user", "content": [_block("text", "hi")]},
        {"role": "user", "content": [_block("text", "")]},
        {"role": "toolResult", "content": [_block("text", "ok")]},
        {"role": "toolResult", "content": [_block("text", "")]},
        {"role": "toolResult", "content": [_block("text", "é")]},
        {"role": "toolResult", "content": [_block("text", "x" * 2001)]},
        {"role": "toolResult", "content": [_block("text", "ok")], "prunedAt": 5},
        {"role": "custom", "content": [_block("text", "note")]},
        {"role": "user", "content": ["junk"]},
        {"role": "user", "content": []},
    ],
)
def test_the_usual_shapes_are_serialized_as_the_reference_does(message: Message) -> None:
    """Issue 9: the one-step path for the usual shapes writes what the general one writes."""
    assert serialize_message(message) == reference_serialize([message])


@pytest.mark.parametrize(
    ("message", "shape"),
    [
        ({"role": "user", "content": [_block("text", "hi")]}, SHAPE_USER_TEXT),
        ({"role": "user", "content": [_block("text", "")]}, SHAPE_OTHER),
        ({"role": "user", "content": "hi"}, SHAPE_OTHER),
        ({"role": "user", "content": [_block("text", "a"), _block("text", "b")]}, SHAPE_OTHER),
        ({"role": "toolResult", "content": [_block("text", "ok")]}, SHAPE_SHORT_RESULT),
        ({"role": "toolResult", "content": [_block("text", "x" * 2000)]}, SHAPE_SHORT_RESULT),
        ({"role": "toolResult", "content": [_block("text", "x" * 2001)]}, SHAPE_OTHER),
        ({"role": "toolResult", "content": [_block("text", "é")]}, SHAPE_OTHER),
        ({"role": "toolResult", "content": [_block("text", "ok")], "prunedAt": 5}, SHAPE_OTHER),
        (
            {"role": "assistant", "content": [_block("text", ""), _call({"path": "é😀\ud800"})]},
            SHAPE_TEXT_AND_CALL,
        ),
        (
            {"role": "assistant", "content": [_call({"path": "a"}), _block("text", "t")]},
            SHAPE_OTHER,
        ),
        ({"role": "assistant", "content": [_block("text", "t"), _call({"path": 1})]}, SHAPE_OTHER),
        (
            {"role": "assistant", "content": [_block("text", "t"), _call({"a": "x", "b": "y"})]},
            SHAPE_OTHER,
        ),
        ({"role": "assistant", "content": [_block("text", None), _call({"a": "x"})]}, SHAPE_OTHER),
        ({"role": "custom", "content": [_block("text", "note")]}, SHAPE_OTHER),
    ],
)
def test_the_usual_shapes_are_told_and_written_as_the_reference_does(
    message: Message, shape: int
) -> None:
    measured = measure_shaped(message)
    assert measured[2] == shape
    assert serialize_shaped([message], [shape]) == [reference_serialize([message])]
    assert measured[3:] == shaped_parts(message, shape)
    assert (measured[3] is None) == (shape == SHAPE_OTHER)
    assert (measured[4] is None) == (shape != SHAPE_TEXT_AND_CALL)
    written = serialize_shaped([message], [shape], measured[3:])
    assert written == [reference_serialize([message])]


@pytest.mark.anyio
async def test_the_context_keeps_each_messages_parts_through_appends_and_compactions(
    tmp_path: Path,
) -> None:
    """Issue 9: the parts the context read when it measured each message write every message
    as the reference does, on a loaded context, after an append, and after a compaction's
    restart, which keeps them for the kept messages."""
    from orchestrator._runtime.session import AgentSession

    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    runtime = AgentSession.open(path, owner="test")

    def check() -> int:
        context = runtime.session.context()
        index = context.index
        assert index is not None
        messages = list(context.messages)
        assert len(index.parts) == 2 * len(messages) == 2 * len(index.shapes)
        texts = serialize_shaped(messages, list(index.shapes), list(index.parts))
        assert texts == [reference_serialize([message]) for message in messages]
        pairs = list(zip(index.parts[::2], index.parts[1::2], strict=True))
        for message, shape, (text, call) in zip(messages, index.shapes, pairs, strict=True):
            if shape in (SHAPE_USER_TEXT, SHAPE_SHORT_RESULT, SHAPE_TEXT_AND_CALL):
                assert text is message["content"][0]["text"]  # read, not copied
            if shape == SHAPE_TEXT_AND_CALL:  # the call as written, made once when measured
                block = message["content"][1]
                assert call == _reference_call(block["name"], block["arguments"])
        return sum(1 for part in index.parts if part is not None)

    try:
        assert check() > 0
        runtime.session.append_message(
            {"role": "user", "content": [{"type": "text", "text": "one more"}], "timestamp": 1}
        )
        check()
        assert (await runtime.compact()).status == "committed"
        check()
    finally:
        runtime.close()


EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"

# Loading measures every message, planning lists the summaries to measure; neither reads the
# prompt templates (nor imports importlib.resources to find them): only a request does. Only what
# the command loads counts: a site's .pth file may import importlib.resources at startup (CI's
# interpreter does, through certifi), before the command runs.
TEMPLATES_PROBE = """
import sys
before = set(sys.modules)
import contextlib, io, json
from orchestrator._cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
names = ("orchestrator._core.prompts", "importlib.resources")
print(json.dumps({"code": code, "loaded": [n for n in names if n in set(sys.modules) - before]}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["context", "plan"])
def test_inspecting_a_session_with_summaries_reads_no_template(command: str) -> None:
    import subprocess
    import sys

    from tests.cli_kit import EXAMPLE

    kinds = {json.loads(line).get("type") for line in EXAMPLE.read_text().splitlines()}
    assert {"compaction", "branch_summary"} <= kinds
    out = subprocess.run(
        [sys.executable, "-c", TEMPLATES_PROBE, command, str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0, "loaded": []}
