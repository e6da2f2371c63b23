"""``orchestrator serve`` in a child process, for the benchmarks that drive a server."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def serving(command: list[str], *, stop_within: float) -> Iterator[subprocess.Popen[str]]:
    """The server ``command`` starts, once it says it is listening; SIGTERM and a wait after.

    Raises:
        SystemExit: the server ended before it listened.
    """
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stderr is not None
        while "listening" not in server.stderr.readline():
            if server.poll() is not None:
                raise SystemExit("the server did not start")
        yield server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(stop_within)
