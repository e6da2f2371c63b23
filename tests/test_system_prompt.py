"""The replay of pi 1.x system messages into one (pi-ai's getCurrentSystemMessage)."""

from __future__ import annotations

from typing import Any

from orchestrator._core.system_prompt import current_system_message, system_text


def tool(name: str, description: str = "") -> dict[str, Any]:
    return {"name": name, "description": description, "parameters": {}}


def test_sections_are_patched_by_name_and_tools_resolved_in_order() -> None:
    messages = [
        {"role": "system", "content": "Base.", "sections": {"a": "A1", "b": "B"},
         "toolsAdded": [tool("read"), tool("write")], "timestamp": 5},
        {"role": "user", "content": "hi", "timestamp": 6},
        {"role": "system", "content": [{"type": "text", "text": "More."}],
         "sections": {"a": "A2", "b": None, "c": "C"}, "toolsRemoved": [{"name": "write"}],
         "toolsAdded": [tool("read", "again"), tool("bash")], "timestamp": 7},
    ]  # fmt: skip
    assert current_system_message(messages) == {
        "role": "system",
        "content": "Base.\n\nMore.",
        "sections": {"a": "A2", "c": "C"},
        # A redeclared tool keeps its place (a Map's set); a removed one is gone.
        "toolsAdded": [tool("read", "again"), tool("bash")],
        "timestamp": 5,
    }


def test_the_first_timestamp_that_exists_and_an_empty_replay() -> None:
    assert current_system_message([{"role": "user", "content": "x"}]) is None
    # Sections alone, no time and no tool: pi answers nothing, and so do we.
    assert (
        current_system_message([{"role": "system", "content": "", "sections": {"a": "A"}}]) is None
    )
    later: list[dict[str, Any]] = [
        {"role": "system", "content": "x"},
        {"role": "system", "content": "", "timestamp": 9},
    ]
    assert current_system_message(later) == {"role": "system", "content": "x", "timestamp": 9}
    tools_only = current_system_message([{"role": "system", "toolsAdded": [tool("read")]}])
    assert tools_only == {
        "role": "system",
        "content": "",
        "toolsAdded": [tool("read")],
        "timestamp": 0,
    }


def test_the_prompt_text_is_the_content_then_the_sections() -> None:
    message = {"role": "system", "content": "Base.", "sections": {"a": "A", "gone": None, "e": ""}}
    assert system_text(message) == "Base.\n\nA"
    assert system_text({"role": "system", "content": ""}) == ""
