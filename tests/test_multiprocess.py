"""D27 with real processes: one owner per session, refused before any model call.

Each test starts real ``orchestrator`` processes. The model is the local OpenAI-compatible
provider, reached through litellm's real HTTP path; its replies are held until the test
releases them, so "while the first process is in its model call" is a state the test waits
for, not a race against the clock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator._store.journal import Journal
from orchestrator._store.journal_records import operations
from orchestrator._store.session import Session
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import EXAMPLE, either_part, pi_user_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
COMMAND = [sys.executable, "-m", "orchestrator"]


@pytest.fixture
def session(tmp_path: Path) -> Path:
    target = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


@pytest.fixture
def held() -> Iterator[LocalProvider]:
    """A provider whose answers wait for ``release()``: a model call in progress, on demand."""
    replies = (Reply.hang(Reply.summary(either_part("Held summary."))),) * 2
    with LocalProvider(replies) as provider:
        yield provider


def model_args(provider: LocalProvider) -> list[str]:
    return [
        "--model",
        "openai/test-model",
        "--api-base",
        provider.url + "/v1",
        "--api-key",
        "test",
        "--context-window",
        "128000",
    ]


def start(*argv: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, *argv],
        env=ENV,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *argv], env=ENV, capture_output=True, text=True, check=False)


def wait_until(condition: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    """Poll for a state of ``process``; fail at once (no clock) if it exits first."""
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"exited with {process.returncode} first: {out}{err}")
        time.sleep(0.02)


def owned_by(session: Path, owner: str) -> Callable[[], bool]:
    lock = Path(f"{session}.lock")

    def check() -> bool:
        try:
            return lock.read_text().endswith(f" {owner}\n")
        except FileNotFoundError:
            return False

    return check


def stop(process: subprocess.Popen[str]) -> None:
    """Kill a process the test did not finish (a failed assertion) and close its pipes."""
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def test_two_compactions_at_once_one_wins_the_other_is_refused_before_its_model_call(
    session: Path, held: LocalProvider
) -> None:
    first = start("compact", str(session), *model_args(held))
    try:
        wait_until(lambda: len(held.requests) >= 1, first)  # in its model call, owning
        calls = len(held.requests)
        second = finish("compact", str(session), *model_args(held))
        assert second.returncode == 1
        assert second.stderr == (
            f"orchestrator compact: {session}: session is being changed by pid {first.pid} "
            "(orchestrator compact)\n"
        )
        assert second.stdout == ""
        held.release()
        out, err = first.communicate()
    finally:
        stop(first)
    assert first.returncode == 0, err
    assert "compacted" in out
    assert len(held.requests) == calls or len(held.requests) == 2  # only the first one's calls
    assert len(held.requests) <= 2
    reopened = Session.open(session)
    compactions = [e for e in reopened.tree.entries if e["type"] == "compaction"]
    assert len(compactions) == 2  # the example's own and the winner's
    # The journal tells the truth: one operation, committed, never settled by the loser.
    ops = operations(Journal.open(session).records())
    assert [(op.kind, op.state) for op in ops] == [("compaction", "committed")]
    assert all(record.dest != "cancelled" for record in ops[0].records)
    assert not any(record.data.get("settled") for record in ops[0].records)
    assert sorted(p.name for p in session.parent.iterdir()) == ["s.jsonl", "s.jsonl.journal"]


def test_server_owns_its_sessions_and_a_command_line_navigate_is_refused(
    session: Path,
) -> None:
    server = start("serve", "--stdio", str(session), stdin=subprocess.PIPE)
    try:
        wait_until(owned_by(session, "orchestrator serve"), server)
        before = session.read_bytes()
        refused = finish("navigate", str(session), "--to", "ec48c90d")
        assert refused.returncode == 1
        assert refused.stderr == (
            f"orchestrator navigate: {session}: session is being changed by pid {server.pid} "
            "(orchestrator serve)\n"
        )
        assert session.read_bytes() == before
        server.communicate(input="")  # end of input: the server closes its sessions and exits
    finally:
        stop(server)
    assert not Path(f"{session}.lock").exists()
    moved = finish("navigate", str(session), "--to", "ec48c90d")
    assert moved.returncode == 0, moved.stderr


def test_a_conditional_commit_after_a_foreign_append_is_refused_and_writes_nothing(
    session: Path,
) -> None:
    # pi appends without our lock. The owner's commit names the tail it planned from; the
    # store sees the foreign line and refuses, writing nothing. (Store level: the runtime's
    # operation commit passes the same expect once the lifecycle work lands it.)
    owner_code = (
        "import sys\n"
        "from orchestrator._core.errors import ConflictError\n"
        "from orchestrator._store.session import Session\n"
        "s = Session.open(sys.argv[1], owner='orchestrator compact')\n"
        "planned = s.tail()\n"
        "print('planned', flush=True)\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    s.append_entry('compaction', {'summary': 'late', 'firstKeptEntryId': 'x',\n"
        "                   'tokensBefore': 1}, expect=planned)\n"
        "except ConflictError as exc:\n"
        "    print(exc, flush=True); sys.exit(3)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code, str(session)],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdin is not None
        assert owner.stdout.readline() == "planned\n"
        leaf = Session.open(session).leaf_id
        pi_id = "p1a2b3c4"
        with session.open("ab") as file:  # what pi does: a plain append, no lock
            file.write(pi_user_line(leaf, pi_id))
        after_pi = session.read_bytes()
        rest, err = owner.communicate(input="commit\n")
    finally:
        stop(owner)
    assert owner.returncode == 3, err
    assert "the session changed since it was read" in rest
    assert f"now at entry {pi_id}" in rest
    assert session.read_bytes() == after_pi
    assert Session.open(session).leaf_id == pi_id


def test_compaction_while_another_program_appends_ends_in_conflict_and_loses_nothing(
    session: Path, held: LocalProvider
) -> None:
    # pi appends without our lock while `compact` waits for its model. The commit names the
    # tail it planned from, so the compaction is refused and pi's message stays on the path.
    compact = start("compact", str(session), *model_args(held))
    try:
        wait_until(lambda: len(held.requests) >= 1, compact)
        leaf = Session.open(session).leaf_id
        pi_id = "c0ffee01"
        with session.open("ab") as file:
            file.write(pi_user_line(leaf, pi_id, "typed in pi meanwhile"))
        after_pi = session.read_bytes()
        held.release()
        out, err = compact.communicate()
    finally:
        stop(compact)
    assert compact.returncode == 1, out
    assert err.startswith("orchestrator compact: ")
    assert err.count("\n") == 1
    # The store's reason, in one line, not "Compaction cancelled".
    assert "the session changed since it was read" in err
    assert f"now at entry {pi_id}" in err
    assert "cancelled" not in err.lower()
    assert session.read_bytes() == after_pi  # nothing written over or after pi's line
    reopened = Session.open(session)
    assert reopened.leaf_id == pi_id
    ops = operations(Journal.open(session).records())
    [operation] = ops
    assert (operation.kind, operation.state) == ("compaction", "conflict")
    assert "the session changed since it was read" in str(operation.data.get("error"))


def test_a_session_removed_during_the_model_call_is_one_line_of_error(
    session: Path, held: LocalProvider
) -> None:
    # The runtime reads the session again after a conflict; a removed file cannot be read, and
    # that was a second, unexplained stderr line ("...; the session stays as it was read").
    compact = start("compact", str(session), *model_args(held))
    try:
        wait_until(lambda: len(held.requests) >= 1, compact)
        session.unlink()
        held.release()
        out, err = compact.communicate()
    finally:
        stop(compact)
    assert compact.returncode == 1, out
    assert err.count("\n") == 1, err
    assert err.startswith("orchestrator compact: ")
    assert "(the file was removed)" in err
    assert not session.exists()
