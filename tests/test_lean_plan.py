"""``plan`` reads a linear file once, keeping of each message only what planning reads.

The lean context (``ContextBuilder(lean=True)``, :mod:`orchestrator._core.lean`) must plan exactly
as the whole path does, or say it cannot (``BodiesNeeded``); the lean read of a file
(:mod:`orchestrator._store.lean_read`) must give the problems a whole load gives, or ``None``
for a file it does not take (a branch, an old version, no header). The command prints the same
bytes either way, and holds a fraction of the memory.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator._core import lean
from orchestrator._core.compaction_plan import plan_report
from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.lean import BodiesNeeded, lean_entry, lean_message
from orchestrator._core.tokens import CompactionSettings
from orchestrator._store import jsonl_io
from orchestrator._store.lean_read import read_lean
from orchestrator._store.session import Session
from tests.bench.bench_core import write_session
from tests.cli_kit import run
from tests.test_context_quick import PROPERTIES, paths
from tests.test_context_restart import fields

HEADER = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"}
DATA = Path(__file__).parent / "data"
SETTINGS = [
    CompactionSettings(keep_recent_tokens=1),
    CompactionSettings(keep_recent_tokens=40, reserve_tokens=10),
    CompactionSettings(keep_recent_tokens=20_000, adaptive_keep=False),
]


def planned(context: SessionContext) -> dict[str, Any]:
    """What planning reads of a context: not its messages' text, nor the summary measures."""
    kept = {k: v for k, v in fields(context).items() if k not in ("messages", "serial", "shapes")}
    return {**kept, "roles": [message.get("role") for message in context.messages]}


def lean_context(path: list[dict[str, Any]], recent: int = lean.RECENT) -> SessionContext | None:
    with mock.patch.object(lean, "RECENT", recent):
        builder = ContextBuilder(lean=True)
    try:
        for entry in path:
            builder.push(entry)
    except BodiesNeeded:
        return None
    return builder.context()


@PROPERTIES
@given(
    paths(), st.sampled_from(SETTINGS), st.sampled_from([None, 2_000]), st.sampled_from([1, 3, 99])
)
def test_a_lean_context_plans_as_the_whole_path_does(
    path: list[dict[str, Any]], settings: CompactionSettings, window: int | None, recent: int
) -> None:
    context = lean_context(path, recent)
    if context is None:
        # It said it cannot, and the caller plans from the whole path: only where it must
        # measure entries again and some of them are older than those it keeps whole.
        assert recent < len(path)
        return
    whole = ContextBuilder(path).context()
    assert planned(context) == planned(whole)
    assert context.index is not None
    assert plan_report(context.index.path, settings, window, context=context) == plan_report(
        path, settings, window
    )


@PROPERTIES
@given(paths())
def test_a_lean_context_holds_no_text(path: list[dict[str, Any]]) -> None:
    context = lean_context(path)
    if context is None:
        return
    assert context.index is not None
    for entry in context.index.path:
        message = entry.get("message") if entry.get("type") == "message" else None
        if isinstance(message, dict) and message.get("role") != "system":
            assert "content" not in message
    # Every message it holds is lean, summaries too: planning reads no text but the system
    # prompt's.
    for message in context.messages:
        assert message.get("role") == "system" or set(message) <= set(lean.LEAN_MESSAGE_KEYS)


def test_it_measures_again_from_the_recent_entries_it_keeps_whole() -> None:
    text = {"role": "user", "content": "x" * 400}
    system = {"role": "system", "content": "s"}
    path: list[dict[str, Any]] = [
        {"type": "message", "id": "a", "parentId": None, "message": system},
        {"type": "message", "id": "b", "parentId": "a", "message": text},
        {"type": "message", "id": "c", "parentId": "b", "message": text},
        {"type": "compaction", "id": "d", "parentId": "c", "summary": "s", "firstKeptEntryId": "c"},
        {"type": "context_edit", "id": "e", "parentId": "d", "targetId": "c", "replacement": None},
    ]
    # After a system message, the compaction measures what it keeps (c) again, and the edit
    # the window (c, d, e): the text of c comes from the entries kept whole.
    whole = ContextBuilder(path).context()
    context = lean_context(path, recent=3)
    assert context is not None
    assert planned(context) == planned(whole)
    assert len(whole.estimates) == 1  # the summary; the edit omitted c
    with pytest.raises(BodiesNeeded), mock.patch.object(lean, "RECENT", 2):
        ContextBuilder(path, lean=True)
    assert lean_context(path, recent=2) is None


def test_lean_forms() -> None:
    reply = {"role": "assistant", "content": [], "usage": {"input": 1}, "stopReason": "stop"}
    assert lean_message(reply) == {"role": "assistant", "usage": {"input": 1}, "stopReason": "stop"}
    # A bare role is one shared dict, not one per message.
    assert lean_message({"role": "user", "content": "a"}) is lean_message({"role": "user"})
    assert lean_message({"content": "no role"}) == {}
    system = {"role": "system", "content": "You are here.", "sections": []}
    assert lean_message(system) is system
    entry = {"type": "message", "id": "a", "parentId": None, "timestamp": "t", "message": reply}
    assert lean_entry(entry) == {
        "type": "message",
        "id": "a",
        "parentId": None,
        "message": lean_message(reply),
    }
    assert lean_entry({"type": "message", "id": "b", "message": "text"})["message"] == "text"
    compaction = {"type": "compaction", "id": "c", "summary": "s", "details": {}}
    assert lean_entry(compaction) is compaction


def write(path: Path, entries: list[Any], *, header: dict[str, Any] | None = None) -> Path:
    lines = [
        json.dumps(header or HEADER),
        *(e if isinstance(e, str) else json.dumps(e) for e in entries),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@PROPERTIES
@given(paths(), st.sampled_from(SETTINGS))
def test_a_lean_read_gives_the_problems_and_plan_of_a_whole_load(
    path: list[dict[str, Any]], settings: CompactionSettings
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        file = write(Path(folder) / "s.jsonl", path)
        read = read_lean(str(file))
        session = Session.open(file)
        if read is None:
            return
        problems, lean = read
        assert problems == session.problems
        assert lean.index is not None
        whole = session.path()
        assert [e["id"] for e in lean.index.path] == [e["id"] for e in whole]
        assert plan_report(lean.index.path, settings, None, context=lean) == plan_report(
            whole, settings, None
        )


def test_the_system_prompt_is_estimated_from_the_whole_system_messages() -> None:
    # pi 1.6's own: an empty content, the prompt in sections, the tools declared.
    lines = (DATA / "pi" / "cli-rpc.jsonl").read_text(encoding="utf-8").splitlines()
    system = next(m for m in map(json.loads, lines) if m.get("message", {}).get("role") == "system")
    user = {"role": "user", "content": "hi"}
    path: list[dict[str, Any]] = [
        {**system, "parentId": None},
        {"type": "message", "id": "b", "parentId": system["id"], "message": user},
    ]
    context = lean_context(path)
    assert context is not None
    tokens = context.tokens()
    assert tokens == ContextBuilder(path).context().tokens()
    assert tokens.estimated_tokens > 100  # the prompt counts, not only "hi"


def test_files_it_does_not_take(tmp_path: Path) -> None:
    user = {"role": "user", "content": "hi"}
    linear: list[dict[str, Any]] = [
        {"type": "message", "id": "a", "parentId": None, "timestamp": "t", "message": user},
        {"type": "message", "id": "b", "parentId": "a", "timestamp": "t", "message": user},
    ]
    assert read_lean(str(write(tmp_path / "linear.jsonl", linear))) is not None
    branched = [*linear, {**linear[1], "id": "c"}]  # c's parent is a, not b
    assert read_lean(str(write(tmp_path / "branched.jsonl", branched))) is None
    old = {**HEADER, "version": 2}
    assert read_lean(str(write(tmp_path / "v2.jsonl", linear, header=old))) is None
    (tmp_path / "none.jsonl").write_text('{"type": "message"}\n', encoding="utf-8")
    assert read_lean(str(tmp_path / "none.jsonl")) is None
    # Damage is reported as a whole load reports it, and the plan goes on (D3).
    damaged = write(tmp_path / "damaged.jsonl", [linear[0], "{not json", linear[1]])
    read = read_lean(str(damaged))
    assert read is not None
    assert read[0] == Session.open(damaged).problems
    assert [p.code for p in read[0]] == ["not_json"]


SESSIONS = sorted([*DATA.glob("pi/*.jsonl"), DATA / "example-session.jsonl"])
CURRENT = [f for f in SESSIONS if json.loads(f.read_bytes().split(b"\n")[0]).get("version") == 3]
"""The files a lean read may take: a migrated file (v1, v2) gets new random ids each load."""


@pytest.mark.parametrize("file", CURRENT, ids=lambda p: p.name)
def test_the_command_prints_what_the_whole_load_prints(
    file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("orchestrator._store.lean_read.LEAN_FROM_BYTES", 0)  # small files too
    options = [[], ["--context-window", "60000"], ["--keep-recent-tokens", "50"]]
    outputs = [
        run(capsys, "plan", str(file), *json, *more)
        for json in ([], ["--json"])
        for more in options
    ]
    monkeypatch.setattr("orchestrator._cli.inspect.read_lean", lambda path: None)  # whole loads
    assert outputs == [
        run(capsys, "plan", str(file), *json, *more)
        for json in ([], ["--json"])
        for more in options
    ]


def test_only_a_big_file_is_read_lean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []

    def spy(path: str) -> Any:
        read.append(path)
        return read_lean(path)

    monkeypatch.setattr("orchestrator._cli.inspect.read_lean", spy)
    file = tmp_path / "s.jsonl"
    write_session(file, 50)
    size = file.stat().st_size
    monkeypatch.setattr("orchestrator._store.lean_read.LEAN_FROM_BYTES", size + 1)
    assert run(capsys, "plan", str(file), "--json")[0] == 0
    assert read == []
    monkeypatch.setattr("orchestrator._store.lean_read.LEAN_FROM_BYTES", size)
    assert run(capsys, "plan", str(file), "--json")[0] == 0
    assert read == [str(file)]


def test_the_shipped_linear_sessions_are_read_lean() -> None:
    # The test above would pass without the lean read: it must really be taken, and only there.
    taken = {file.name for file in SESSIONS if read_lean(str(file)) is not None}
    assert len(taken) >= len(CURRENT) // 3, taken
    assert taken <= {file.name for file in CURRENT}


def test_a_lean_plan_holds_a_fraction_of_the_memory(tmp_path: Path) -> None:
    file = tmp_path / "long.jsonl"
    write_session(file, 3_000)
    settings = CompactionSettings()

    def peak(plan: Any) -> int:
        tracemalloc.start()
        try:
            kept = plan()
            return tracemalloc.get_traced_memory()[1] if kept else 0
        finally:
            tracemalloc.stop()

    def lean_plan() -> dict[str, Any]:
        read = read_lean(str(file))
        assert read is not None
        context = read[1]
        assert context.index is not None
        return plan_report(context.index.path, settings, None, context=context)

    def whole() -> dict[str, Any]:
        return plan_report(Session.open(file).path(), settings, None)

    assert lean_plan() == whole()
    # It keeps its last entries whole (lean.RECENT, 2048 by default): fewer here, so that the
    # file holds many more than it keeps, as a long session does.
    # The read's chunk (1 MB, jsonl_io.LOAD_CHUNK) is the same for both, a constant that a
    # file of this size would make the most of: 64 KB here, as a long file sees it.
    with (
        mock.patch.object(lean, "RECENT", 64),
        mock.patch.object(jsonl_io, "LOAD_CHUNK", 1 << 16),
    ):
        assert peak(lean_plan) < 0.6 * peak(whole)
