"""The Session layer: pi's lazy persistence, naming, and the incremental context."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator._core.context import build_context
from orchestrator._store.session import Session


def assistant(text: str) -> dict[str, object]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "provider": "p",
        "model": "m",
        "stopReason": "stop",
        "usage": {"totalTokens": 5},
        "timestamp": 2,
    }


def test_nothing_is_written_until_an_assistant_message_exists(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    session.append_model_change("p", "m")
    session.append_message({"role": "user", "content": "hi", "timestamp": 1})
    assert not path.exists()  # pi's lazy persistence: a session with no reply is not saved
    session.append_message(assistant("hello"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["session", "model_change", "message", "message"]
    session.append_message({"role": "user", "content": "again", "timestamp": 3})
    assert len(path.read_text().splitlines()) == 5  # later entries are appended one by one
    session.close()


def test_flush_writes_a_session_without_replies(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    session.append_message({"role": "user", "content": "only a question", "timestamp": 1})
    session.flush()
    session.close()
    assert [e["type"] for e in Session.open(path).tree.entries] == ["message"]


def test_set_name_records_a_session_info_entry(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    session.append_message(assistant("hello"))
    session.set_name("  Invoice rounding  ")
    session.close()
    reopened = Session.open(path)
    info = reopened.tree.entries[-1]
    assert (info["type"], info["name"]) == ("session_info", "Invoice rounding")
    assert reopened.tree.session_name() == "Invoice rounding"
    assert len(reopened.context().messages) == 1  # names take no part in the context


def test_incremental_context_matches_a_rebuild_across_branching() -> None:
    session = Session.in_memory()
    first = session.append_message({"role": "user", "content": "one", "timestamp": 1})
    session.append_message(assistant("reply one"))
    assert session.context() == build_context(session.path())
    session.branch(first["id"])
    session.append_message(assistant("another reply"))
    session.append_custom_message("note", "remember this")
    assert session.context() == build_context(session.path())
    assert [m["role"] for m in session.context().messages] == ["user", "assistant", "custom"]
    assert session.context(first["id"]).entry_ids == (first["id"],)
