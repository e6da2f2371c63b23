"""What ``serve`` and ``worker`` build alike from their options: the chat agent, the settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from orchestrator._cli.common import with_timeout
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.agent import Agent, ChatAgent
from orchestrator._runtime.routes import RouteSettings
from orchestrator._runtime.types import RuntimeSettings


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
    """The window, compaction settings, short summaries and time limits the options give."""
    return with_timeout(
        RuntimeSettings(
            context_window=args.context_window or RuntimeSettings().context_window,
            compaction=CompactionSettings(
                reserve_tokens=args.reserve_tokens, keep_recent_tokens=args.keep_recent_tokens
            ),
            short_summary=args.short_summary,
        ),
        args,
    )
