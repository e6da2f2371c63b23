"""The ``serve`` command: the JSON-RPC server on stdio or on a local TCP port.

``orchestrator serve [SESSION.jsonl ...] [--dir DIR] [--stdio | --port N] [--model M ...]``

With no ``--model`` compactions and branch summaries use the built-in offline summarizer and
``session.prompt`` is refused; with ``--model`` the first model is also the chat agent's. On
stdio, stdout carries protocol lines only; everything meant for a person goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from orchestrator._cli.common import add_timeout_argument, positive_int, with_timeout
from orchestrator._core.tokens import CompactionSettings
from orchestrator._rpc.server import RpcServer, RuntimeOptions, SessionHub
from orchestrator._runtime.agent import Agent, ChatAgent
from orchestrator._runtime.routes import RouteSettings, build_summarizer
from orchestrator._runtime.types import RuntimeSettings


def register(commands: Any) -> None:
    """Add ``serve`` to the parser."""
    serve = commands.add_parser("serve", help="serve sessions over JSON-RPC (stdio or TCP)")
    serve.add_argument(
        "sessions",
        nargs="*",
        metavar="SESSION.jsonl",
        help="sessions to open at start (created when missing)",
    )
    serve.add_argument("--dir", type=Path, help="relative paths resolve here; others are refused")
    where = serve.add_mutually_exclusive_group()
    where.add_argument(
        "--stdio", action="store_true", help="newline-delimited JSON on stdio (the default)"
    )
    where.add_argument("--port", type=int, help="listen on 127.0.0.1:PORT (0: any free port)")
    serve.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="M",
        help="litellm model id: the chat agent and the first summary route; "
        "repeat for more summary candidates (default: offline, no prompts)",
    )
    serve.add_argument("--api-base", help="base URL for the litellm routes")
    serve.add_argument("--api-key", help="API key (default: the provider's usual variable)")
    serve.add_argument(
        "--context-window",
        type=positive_int,
        default=0,
        help="the model's context window in tokens",
    )
    serve.add_argument("--remote", metavar="URL", help="remote summary endpoint")
    serve.add_argument("--reserve-tokens", type=positive_int, default=16384)
    add_timeout_argument(serve)
    serve.add_argument("--keep-recent-tokens", type=positive_int, default=20000)
    serve.add_argument(
        "--short-summary",
        action="store_true",
        help="also write a one-or-two sentence short summary on each compaction and branch summary",
    )
    serve.set_defaults(handler=_serve)


def _options(args: argparse.Namespace) -> RuntimeOptions:
    routes = RouteSettings(
        models=tuple(args.model),
        api_base=args.api_base,
        api_key=args.api_key or None,
        context_window=args.context_window,
        remote_url=args.remote,
        reserve_tokens=args.reserve_tokens,
    )
    agent_factory: Callable[[], Agent] | None = None
    if routes.models:
        from orchestrator._models.litellm import LiteLLMModel

        chat = LiteLLMModel(
            routes.models[0],
            api_base=routes.api_base,
            api_key=routes.api_key,
            context_window=routes.context_window,
        )
        agent_factory = lambda: ChatAgent(model=chat)  # noqa: E731 - one line reads better
    settings = with_timeout(
        RuntimeSettings(
            context_window=args.context_window or RuntimeSettings().context_window,
            compaction=CompactionSettings(
                reserve_tokens=args.reserve_tokens, keep_recent_tokens=args.keep_recent_tokens
            ),
            short_summary=args.short_summary,
        ),
        args,
    )
    return RuntimeOptions(
        agent_factory=agent_factory,
        summarizer=build_summarizer(routes),
        settings=settings,
        root=args.dir,
    )


def _serve(args: argparse.Namespace) -> int:
    hub = SessionHub(_options(args))
    server = RpcServer(hub)

    async def run() -> None:
        try:
            for path in args.sessions:
                slot = hub.open(path, create=True)
                _say(f"session {slot.runtime.session.session_id}: {slot.path}")
            if args.port is None:
                await server.serve_stdio()
                return
            async with anyio.create_task_group() as group:
                port = await group.start(server.serve_tcp, args.port)
                _say(f"listening on 127.0.0.1:{port}")
        finally:
            hub.abort_all()
            hub.close_all()

    try:
        anyio.run(run)
    except KeyboardInterrupt:
        _say("stopped")
    return 0


def _say(text: str) -> None:
    print(f"orchestrator serve: {text}", file=sys.stderr, flush=True)
