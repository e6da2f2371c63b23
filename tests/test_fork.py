"""D28: a fork is a valid session; issue 11: fork's errors and its ``parentSession``.

pi#5669: forking a path that holds a label entry left the label's child pointing at the
dropped label, so the fork failed ``check`` and its context stopped at the label.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from orchestrator._core.errors import SessionError
from orchestrator._runtime.session import AgentSession
from orchestrator._store.fork import branched_session, fork_target
from orchestrator._store.memory import MemoryStore
from orchestrator._store.session import Session
from tests.cli_kit import run


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


FORK_POINT = "ec48c90d"
"""A user message of the example whose path runs through a label entry."""


def test_the_example_path_runs_through_a_label(example: Path) -> None:
    # The premise of the tests below: the fork point's path holds a label with a child.
    source = Session.open(example)
    leaf, _ = fork_target(source, FORK_POINT)
    path = source.path(leaf)
    labels = [i for i, e in enumerate(path) if e["type"] == "label"]
    assert labels
    assert labels[0] < len(path) - 1


def test_cli_fork_passes_check_and_keeps_the_context(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    out = tmp_path / "f.jsonl"
    code, _, err = run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
    assert code == 0, err
    code, report, err = run(capsys, "check", str(out))
    assert (code, err) == (0, "")
    assert "ok" in report
    source = Session.open(example)
    leaf, _ = fork_target(source, FORK_POINT)
    forked = Session.open(out)
    assert forked.problems == []
    assert forked.context().messages == source.context(leaf).messages
    assert len(forked.context().messages) == 9
    assert forked.tree.labels == {
        target: label for target, label in source.tree.labels.items() if target in forked.tree
    }
    assert forked.tree.labels  # the label was re-applied
    assert example.read_bytes() == before


def test_fork_never_changes_the_source_entries(example: Path) -> None:
    source = Session.open(example)
    snapshot = json.dumps(source.tree.entries, sort_keys=True)
    leaf, _ = fork_target(source, FORK_POINT)
    forked = branched_session(source, leaf, MemoryStore())
    assert json.dumps(source.tree.entries, sort_keys=True) == snapshot
    parents = {e["id"]: e.get("parentId") for e in forked.tree.entries}
    assert all(p is None or p in parents for p in parents.values())


@pytest.mark.anyio
async def test_agent_session_fork_is_valid_too(example: Path, tmp_path: Path) -> None:
    runtime = AgentSession.open(example, owner="test")
    try:
        result = await runtime.fork(FORK_POINT, tmp_path / "g.jsonl")
        assert result.session is not None
        result.session.close()
        leaf, _ = fork_target(runtime.session, FORK_POINT)
        expected = runtime.session.context(leaf).messages
    finally:
        runtime.close()
    reopened = Session.open(tmp_path / "g.jsonl")
    assert reopened.problems == []
    assert reopened.context().messages == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "session.jsonl"]


def test_parent_session_is_absolute_as_pi_writes_it(
    example: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "fork", example.name, "--from", FORK_POINT, "--out", "f.jsonl")
    assert code == 0, err
    header = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert header["parentSession"] == str(example.resolve())


def test_fork_from_an_unknown_id_and_from_a_non_user_entry_say_different_things(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "f.jsonl")
    code, _, unknown = run(capsys, "fork", str(example), "--from", "nope1234", "--out", out)
    assert (code, unknown.strip()) == (
        1,
        f"orchestrator fork: {example}: entry 'nope1234' not found",
    )
    source = Session.open(example)
    compaction = next(e for e in source.tree.entries if e["type"] == "compaction")
    code, _, wrong = run(capsys, "fork", str(example), "--from", compaction["id"], "--out", out)
    assert (code, wrong.strip()) == (
        1,
        f"orchestrator fork: Invalid entry ID for forking: {compaction['id']} is a compaction "
        "entry; a fork starts before a user message",
    )
    assert not Path(out).exists()
    tool = next(e for e in source.tree.entries if e.get("message", {}).get("role") == "toolResult")
    with pytest.raises(SessionError, match="is a toolResult message"):
        fork_target(source, tool["id"])


def test_fork_into_a_missing_folder_is_one_line(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "f.jsonl"
    code, stdout, err = run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
    assert (code, stdout) == (1, "")
    assert err == (
        f"orchestrator fork: {out}: the folder {out.parent} does not exist; create it first\n"
    )
    assert not out.parent.exists()


@pytest.mark.parametrize("step", ["fsync", "rename"])
def test_a_fork_killed_before_it_is_named_leaves_no_file_and_a_retry_works(
    step: str,
    example: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A kill before the new file was whole and named left it empty: ``check`` said "ok, 0
    entries" and the retry said "already exists". Now the name comes last, in one step."""
    import os

    out = tmp_path / "f.jsonl"

    def killed(*args: object, **kwargs: object) -> None:
        raise SystemExit(137)

    with monkeypatch.context() as patched:
        for name in ["fsync"] if step == "fsync" else ["replace", "rename", "link"]:
            patched.setattr(os, name, killed)
        with pytest.raises(SystemExit):
            run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
    assert not out.exists()
    code, _, err = run(capsys, "fork", str(example), "--from", FORK_POINT, "--out", str(out))
    assert code == 0, err
    code, report, err = run(capsys, "check", str(out))
    assert (code, err) == (0, "")
    assert len(Session.open(out).tree) > 0


@pytest.mark.anyio
async def test_a_fork_cancelled_before_it_returns_leaves_no_file_and_a_retry_works(
    example: Path, tmp_path: Path
) -> None:
    """Cancelled after the new file was written (a server stopping during a slow
    ``session_fork`` hook), the fork left the file: the caller, told it was cancelled, found a
    session nobody had asked for, and a retry to the same path said "already exists"."""
    runtime = AgentSession.open(example, owner="test")
    started = anyio.Event()

    async def held(payload: object) -> None:
        started.set()
        await anyio.sleep_forever()

    remove = runtime.hooks.on("session_fork", held)
    target = tmp_path / "g.jsonl"
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(runtime.fork, FORK_POINT, target)
            await started.wait()
            group.cancel_scope.cancel()
        assert not target.exists()
        assert not any(tmp_path.glob("g.*"))  # nor its lock
        remove()
        result = await runtime.fork(FORK_POINT, target)
        assert result.session is not None
        result.session.close()
    finally:
        runtime.close()
    assert Session.open(target).problems == []
