"""The signals that stop a long-running process (``serve``, ``worker``) cleanly."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl+C, a service manager's SIGTERM, a closed terminal."""


def stop_signals() -> tuple[signal.Signals, ...]:
    """:data:`STOP_SIGNALS` but those the process was started ignoring.

    ``nohup`` starts a program with SIGHUP ignored so that it outlives its terminal, and a
    shell starts a background job (``&``) with SIGINT ignored: a handler of ours would undo
    that, and stop the server or worker the user meant to keep.
    """
    return tuple(s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN)
