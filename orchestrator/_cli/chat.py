"""What the commands that call models build alike from their options.

The summary routes (``compact``, ``navigate``, ``worker``), the chat agent and the runtime
settings (``serve``, ``worker``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from orchestrator._cli.common import api_key_of, with_timeout
from orchestrator._cli.pi_settings import compaction_enabled
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.agent import Agent, ChatAgent
from orchestrator._runtime.operation.routes import RouteSettings
from orchestrator._runtime.types import RuntimeSettings


def route_settings(args: argparse.Namespace) -> RouteSettings:
    """The summary routes the model options name (``--model`` ... ``--short-summary``).

    A command without ``--short-summary`` (the TUI) asks for no short summary; one without
    ``--no-offline-fallback`` keeps the offline fallback (D32).
    """
    # --context-window is the summarizer's window, not the chat model's: a reserve larger than
    # it is no usage error, because the request clamps its output budget to the window and
    # refuses (one line, exit 1) only when nothing useful fits (D14).
    return RouteSettings(
        models=tuple(args.model),
        api_base=args.api_base,
        api_key=api_key_of(args),
        context_window=args.context_window,
        remote_url=args.remote,
        reserve_tokens=args.reserve_tokens,
        short_summary=getattr(args, "short_summary", False),
        offline_fallback=not getattr(args, "no_offline_fallback", False),
    )


def chat_agent_factory(
    routes: RouteSettings, timeout_s: float | None
) -> Callable[[], Agent] | None:
    """What makes the agent of a turn: the first ``--model`` (``None``: prompts are refused).

    ``timeout_s`` (``--timeout``): a hung chat provider fails the call, as a summary's does.
    """
    if not routes.models:
        return None
    from orchestrator._models.litellm import LiteLLMModel

    chat = LiteLLMModel(
        routes.models[0],
        api_base=routes.api_base,
        api_key=routes.api_key,
        context_window=routes.context_window,
    )
    return lambda: ChatAgent(model=chat, timeout_s=timeout_s)


def runtime_settings(args: argparse.Namespace) -> RuntimeSettings:
    """The window, compaction settings, short summaries and time limits the options give.

    ``args`` has been through :func:`~orchestrator._cli.pi_settings.with_pi_settings` when the
    command takes ``--pi-settings``.
    """
    return with_timeout(
        RuntimeSettings(
            context_window=args.context_window or RuntimeSettings().context_window,
            compaction=CompactionSettings(
                enabled=compaction_enabled(args),
                reserve_tokens=args.reserve_tokens,
                keep_recent_tokens=args.keep_recent_tokens,
            ),
            branch_reserve_tokens=_branch_reserve_tokens(args),
            short_summary=args.short_summary,
        ),
        args,
    )


def _branch_reserve_tokens(args: argparse.Namespace) -> int:
    # branchSummary.reserveTokens of --pi-settings (with_pi_settings put it there), else pi's.
    from_file = getattr(args, "branch_reserve_tokens", None)
    return RuntimeSettings().branch_reserve_tokens if from_file is None else int(from_file)
