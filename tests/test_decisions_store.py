"""One test per storage decision, D1 to D4, named after it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator._core.context import ModelRef
from orchestrator._core.entries import is_from_extension
from orchestrator._core.errors import SessionError, SessionLockedError
from orchestrator._store.session import Session

HEX8 = re.compile(r"[0-9a-f]{8}\Z")


def conversation(session: Session) -> None:
    session.append_model_change("anthropic", "claude")
    session.append_message({"role": "user", "content": "hi", "timestamp": 1})
    session.append_message(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "yo"}],
            "provider": "anthropic",
            "model": "claude",
            "stopReason": "stop",
            "usage": {"totalTokens": 3},
            "timestamp": 2,
        }
    )


def test_d1_files_are_written_the_way_pi_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path, cwd="/work")
    conversation(session)
    session.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header = lines[0]
    assert header["type"] == "session"
    assert header["version"] == 3
    assert set(header) >= {"id", "timestamp", "cwd"}
    assert header["cwd"] == "/work"
    assert [e["type"] for e in lines[1:]] == ["model_change", "message", "message"]
    assert all(HEX8.match(e["id"]) for e in lines[1:])
    assert lines[1]["parentId"] is None
    assert lines[2]["parentId"] == lines[1]["id"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z", lines[1]["timestamp"])
    # Compact JSON, one object per line, like JSON.stringify.
    assert path.read_text().splitlines()[1] == json.dumps(
        lines[1], separators=(",", ":"), ensure_ascii=False
    )


def test_d1_reads_both_extension_flags_and_model_change_shapes(tmp_path: Path) -> None:
    assert is_from_extension({"fromHook": True})
    assert is_from_extension({"fromExtension": True})
    assert not is_from_extension({})
    path = tmp_path / "omp.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {
                    "type": "session",
                    "version": 3,
                    "id": "s",
                    "timestamp": "2026-01-01T00:00:00.000Z",
                    "cwd": "/",
                },
                {
                    "type": "model_change",
                    "id": "aaaaaaaa",
                    "parentId": None,
                    "timestamp": "2026-01-01T00:00:01.000Z",
                    "model": "openai/gpt-5",
                    "role": "default",
                },
            ]
        )
        + "\n"
    )
    assert Session.open(path).context().model == ModelRef(provider="openai", model_id="gpt-5")


def test_d2_unknown_types_and_fields_survive_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    conversation(session)
    session.append_entry("future_entry_type", {"payload": {"nested": [1, 2]}, "x-extra": True})
    message = session.tree.entries[1]
    session.replace_entries([{**message, "unknownField": {"kept": "verbatim"}}])  # a rewrite
    session.close()
    reopened = Session.open(path)
    assert reopened.tree.entries[1]["unknownField"] == {"kept": "verbatim"}
    future = reopened.tree.entries[-1]
    assert future["type"] == "future_entry_type"
    assert future["payload"] == {"nested": [1, 2]}
    assert reopened.problems == []
    assert len(reopened.context().messages) == 2  # unknown types take no part in the context


def test_d3_damage_is_reported_with_lines_and_never_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    conversation(session)
    session.close()
    damaged = path.read_bytes() + b"this is not json\n" + b'{"type":"message","id":"torn'
    path.write_bytes(damaged)
    reopened = Session.open(path)
    assert [(p.line, p.code) for p in reopened.problems] == [(5, "not_json"), (6, "torn_line")]
    assert len(reopened.tree.entries) == 3
    assert path.read_bytes() == damaged  # loading never writes
    with pytest.raises(SessionError):
        reopened.replace_entries([reopened.tree.entries[0]])  # a rewrite would drop the bad line
    assert path.read_bytes() == damaged
    reopened.close()


def test_d3_torn_last_line_is_moved_aside_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    conversation(session)
    session.close()
    path.write_bytes(path.read_bytes() + b'{"type":"mess')
    reopened = Session.open(path)
    reopened.append_message({"role": "user", "content": "after the crash", "timestamp": 3})
    reopened.close()
    assert (tmp_path / "s.jsonl.corrupt").read_bytes() == b'{"type":"mess\n'
    final = Session.open(path)
    assert final.problems == []
    assert final.context().messages[-1]["content"] == "after the crash"


def test_d4_a_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    first = Session.open(path)
    conversation(first)
    second = Session.open(path)
    with pytest.raises(SessionLockedError):
        second.append_message({"role": "user", "content": "me too", "timestamp": 9})
    first.close()
    second.close()
    assert len(Session.open(path).tree.entries) == 3


def test_d4_rewrites_go_through_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    conversation(session)
    before = path.read_bytes()
    replaced: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        replaced.append((str(src), str(dst)))
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "replace", spy)
    with pytest.raises(OSError, match="disk full"):
        session.replace_entries([{**session.tree.entries[1], "edited": True}])
    monkeypatch.setattr(os, "replace", real)
    assert replaced
    assert replaced[0][1] == str(path)
    assert replaced[0][0] != str(path)
    assert path.read_bytes() == before  # the original is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.jsonl.lock"]
    session.close()
