"""The ``tui`` command: browse a session's tree and navigate it in a terminal UI.

With no ``--model`` branch summaries come from the built-in offline summarizer, so the command
works on a fresh machine with no key. With ``--chat`` the first ``--model`` also answers what is
typed in the editor; without it, typed text just stays in the editor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator._cli.chat import route_settings
from orchestrator._cli.common import (
    API_KEY_VISIBLE,
    add_model_arguments,
    add_timeout_argument,
    positive_int,
    with_timeout,
)
from orchestrator._cli.pi_settings import (
    Explicit,
    add_pi_settings_argument,
    branch_reserve,
    first_model,
    pi_compaction,
)
from orchestrator._core.entries import CUSTOM
from orchestrator._core.errors import SessionError
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.agent import ChatAgent
from orchestrator._runtime.navigation.moves import LEAF_MARKER, position_is_recorded
from orchestrator._runtime.operation.routes import build_summarizer, candidate_models
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings


def register(commands: Any) -> None:
    """Add the ``tui`` command."""
    tui = commands.add_parser("tui", help="browse the session tree and navigate it (terminal UI)")
    tui.add_argument("session", help="the session file")
    add_model_arguments(tui)
    tui.add_argument(
        "--reserve-tokens",
        type=positive_int,
        action=Explicit,
        default=16384,
        help="tokens kept free when summarizing a branch (default: branchSummary.reserveTokens "
        "of --pi-settings, else %(default)s)",
    )
    add_timeout_argument(tui)
    add_pi_settings_argument(tui)
    tui.add_argument(
        "--short-summary",
        action="store_true",
        help="also write a one-or-two sentence short summary on each branch summary",
    )
    tui.add_argument(
        "--chat",
        action="store_true",
        help="send editor messages to the first --model (default: no agent)",
    )
    tui.set_defaults(handler=_tui)


def build_runtime(args: argparse.Namespace) -> AgentSession:
    """The agent session the TUI drives, from the command's arguments.

    Raises:
        SessionError: the file does not exist, ``--chat`` without ``--model``, or a
            ``--pi-settings`` file that cannot be used.
    """
    if not Path(args.session).is_file():
        raise SessionError(f"{args.session}: no such session file")
    routes = route_settings(args)
    if args.chat and not args.model:
        raise SessionError("--chat needs a --model to talk to")
    # The chat model is the model in use: its compactions (a turn's) follow its pi overrides.
    compaction = pi_compaction(args, first_model(args)) or CompactionSettings()
    chat = candidate_models(routes)[0] if args.chat else None
    agent = ChatAgent(model=chat, timeout_s=args.timeout) if chat is not None else None
    return AgentSession.open(
        args.session,
        owner="orchestrator tui",  # held while the TUI is open (D27)
        agent=agent,
        summarizer=build_summarizer(routes),
        settings=with_timeout(
            RuntimeSettings(
                compaction=compaction,
                branch_reserve_tokens=branch_reserve(args),
                short_summary=args.short_summary,
            ),
            args,
        ),
    )


def keep_position(runtime: AgentSession) -> None:
    """Record the active leaf so that reopening the file lands where the user left it.

    pi keeps the leaf in memory and reopens a file at its last entry. A navigation without a
    summary appends nothing, so, like the ``navigate`` command, I record the position as a
    ``custom`` entry under the leaf (never part of the context; pi ignores it). Nothing is
    written when reopening already lands there (the last entry is the leaf, or its marker).
    """
    session = runtime.session
    if position_is_recorded(session):
        return
    session.append_entry(
        CUSTOM,
        {"customType": LEAF_MARKER, "data": {"to": session.leaf_id}},
        parent_id=session.leaf_id,
    )
    session.flush()


def has_terminal() -> bool:
    """Whether standard input and output are a terminal, as the interface needs."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _tui(args: argparse.Namespace) -> int:
    from orchestrator._tui.app import TreeApp

    if not has_terminal():
        # Without a terminal the interface is drawn for nobody and never ends, holding the
        # session's lock (D27) until someone kills it.
        raise SessionError(
            "tui needs a terminal on standard input and output; use `tree`, `navigate` or "
            "`serve` from scripts"
        )
    runtime = build_runtime(args)
    if args.api_key:
        print(f"orchestrator tui: {API_KEY_VISIBLE}", file=sys.stderr)
    try:
        TreeApp(runtime).run()
        keep_position(runtime)
    finally:
        runtime.close()
    return 0
