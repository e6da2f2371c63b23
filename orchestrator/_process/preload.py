"""What a long-running process reads before its first request, not during it.

A command that only inspects a file loads as little as it can (the machine tables, the prompt
templates and msgspec are read or imported on first use). A server is the other way round: what
is read on first use is then read in the middle of a request, and a file that cannot be opened
then fails that request. At the descriptor limit (``ulimit -n``, every open session holds its
lock and journal) a server's first ``session.compress`` failed as an internal error, because
importing msgspec for the journal's first record could not open ``msgspec/__init__.py``, and
its first ``session.tree.navigate`` because ``navigation.toml`` could not be read; nothing was
wrong with either. Read at start, they are in memory before any session is open.
"""

from __future__ import annotations

from orchestrator._core.prompts import default_prompts
from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._store.journal import load_encoder


def load_on_start() -> None:
    """Load every shipped machine table and prompt template, and the journal's encoder.

    Each is cached for the life of the process. Importing msgspec also makes every session
    opened afterwards parse with it (``orchestrator._core.json_lines``), as a server's do.

    Raises:
        DefinitionError: A shipped table or prompt is missing or broken (then the server
            should not start: every request of that kind would fail).
    """
    for name in shipped_machines():
        load_machine(name)
    default_prompts()
    load_encoder()
