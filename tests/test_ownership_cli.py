"""D27 at the surfaces: which commands own a session and which only read it (in process)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from orchestrator._cli import tui
from orchestrator._core.errors import SessionLockedError
from orchestrator._rpc.server import RuntimeOptions, SessionHub
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session
from tests.cli_kit import run


def held_by(path: Path, owner: str) -> str:
    return rf"{path}: session is being changed by pid \d+ \({owner}\)"


@pytest.mark.parametrize(
    "argv",
    [
        ["compact"],
        ["navigate", "--to", "ec48c90d"],
    ],
)
def test_commands_that_write_are_refused_while_another_owner_holds_the_session(
    example: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    owner = Session.open(example, owner="my app")
    try:
        code, out, err = run(capsys, argv[0], str(example), *argv[1:])
    finally:
        owner.close()
    assert (code, out) == (1, "")
    assert err.startswith(f"orchestrator {argv[0]}: {example}: session is being changed by pid ")
    assert err.endswith(" (my app)\n")
    assert example.read_bytes() == before


@pytest.mark.parametrize(
    "argv",
    [["context"], ["plan"], ["tree"], ["check"], ["compact", "--dry-run"]],
)
def test_readers_work_while_the_session_is_owned(
    example: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    owner = Session.open(example, owner="my app")
    try:
        code, _, err = run(capsys, argv[0], str(example), *argv[1:])
    finally:
        owner.close()
    assert code == 0, err


def test_compact_names_itself_in_the_lock(example: Path) -> None:
    # What a second process sees while `orchestrator compact` runs: its own command name.
    runtime = AgentSession.open(example, owner="orchestrator compact")
    try:
        with pytest.raises(SessionLockedError, match=held_by(example, "orchestrator compact")):
            AgentSession.open(example, owner="orchestrator navigate")
    finally:
        runtime.close()
    AgentSession.open(example).close()


def test_the_tui_owns_its_session_while_open(example: Path) -> None:
    parser = argparse.ArgumentParser()
    tui.register(parser.add_subparsers())
    runtime = tui.build_runtime(parser.parse_args(["tui", str(example)]))
    try:
        with pytest.raises(SessionLockedError, match=held_by(example, "orchestrator tui")):
            Session.open(example, owner="orchestrator navigate")
    finally:
        runtime.close()
    Session.open(example, owner="orchestrator navigate").close()


def test_the_server_owns_what_it_opens_until_it_closes_it(example: Path) -> None:
    hub = SessionHub(RuntimeOptions())
    slot = hub.open(str(example))
    with pytest.raises(SessionLockedError, match=held_by(example, "orchestrator serve")):
        Session.open(example, owner="orchestrator navigate")
    assert slot.runtime.session.store.location == str(example)
    hub.close_all()
    Session.open(example, owner="orchestrator navigate").close()
    assert sorted(p.name for p in example.parent.iterdir()) == ["session.jsonl"]
