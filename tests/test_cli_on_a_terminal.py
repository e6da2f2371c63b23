"""A failed model call on a terminal: one error line, and a spinner line that never wraps.

On a terminal, ``compact`` and ``navigate --summarize`` printed a 65-line ``ExceptionGroup``
traceback (the spinner's task group wrapped the error), and the spinner line, wider than the
window, wrapped and was drawn again below itself at every frame. These run the command as a
user does, in a pseudo-terminal 60 columns wide, against a provider on the loopback address
that is overloaded once (a long message, retried) and then refuses the request.
"""

from __future__ import annotations

import fcntl
import http.server
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator._cli.terminal import cells
from tests.cli_kit import EXAMPLE

COLUMNS = 60
OVERLOADED = "The service is overloaded, please try again later. " * 6
ROOT = Path(__file__).parent.parent


class Provider(http.server.BaseHTTPRequestHandler):
    """Answers 503 with a long message the first time, then 401."""

    answered = 0

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("content-length", 0)))
        first = Provider.answered == 0
        Provider.answered += 1
        status, message = (503, OVERLOADED) if first else (401, "Incorrect API key provided")
        body = json.dumps({"error": {"message": message, "type": "error", "code": status}})
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - its signature
        del format, args


@pytest.fixture
def provider() -> Iterator[str]:
    Provider.answered = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run ``orchestrator ARGV`` with stdin, stdout and stderr on a pseudo-terminal."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PYTHONPATH=str(ROOT), OPENAI_API_KEY="sk-loopback-only", NO_PROXY="*")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return process.wait(), output.decode()


def check_terminal_output(text: str, command: str) -> None:
    assert "Traceback" not in text, text
    assert "ExceptionGroup" not in text
    draws = [part for part in text.split("\r") if part.endswith("\x1b[K") and part != "\x1b[K"]
    assert draws, "no spinner was drawn"
    for draw in draws:
        line = draw.replace("\x1b[K", "")
        assert "\n" not in line
        assert cells(line) < COLUMNS, line  # one row: never wraps
    assert any(draw.endswith("…\x1b[K") for draw in draws)  # the retry's message, cut to fit
    # What stays on the screen: the spinner's row cleared, then one error line.
    after = text.rsplit("\x1b[K", 1)[1]
    lines = [line for line in after.replace("\r", "").split("\n") if line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"orchestrator {command}: "), lines


@pytest.fixture
def session(tmp_path: Path) -> Path:
    target = tmp_path / "session.jsonl"
    shutil.copy(EXAMPLE, target)
    return target


def test_compact_failing_on_a_terminal_is_one_line(provider: str, session: Path) -> None:
    code, text = on_a_terminal("compact", str(session), "--remote", provider + "/")
    assert code == 1, text
    check_terminal_output(text, "compact")
    assert re.search(r"Remote compaction failed \(401", text)


def test_navigate_summarize_failing_on_a_terminal_is_one_line(provider: str, session: Path) -> None:
    first_user = next(
        entry["id"]
        for entry in map(json.loads, session.read_text().splitlines()[1:])
        if entry.get("type") == "message" and entry["message"]["role"] == "user"
    )
    code, text = on_a_terminal(
        "navigate",
        str(session),
        "--to",
        first_user,
        "--summarize",
        "--model",
        "openai/gpt-4o-mini",
        "--api-base",
        provider,
    )
    assert code == 1, text
    check_terminal_output(text, "navigate")
    assert "Incorrect API key provided" in text
