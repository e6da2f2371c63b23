"""``orchestrator worker``: run session workflows and their activities for a Temporal cluster.

Start as many as you like, on as many machines as you like, against one Temporal server and one
shared store: each session is owned by one workflow at a time, and a worker that dies hands its
work to the others (docs/scale-out.md). The worker calls the models, so the route options are
the ones ``serve`` takes: with ``--model`` the first model is also the chat agent's (prompts run
their turns here), without one compactions use the offline summarizer and prompts are refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from orchestrator._cli.common import (
    API_KEY_VISIBLE,
    add_cluster_arguments,
    add_compaction_size_arguments,
    add_model_arguments,
    add_timeout_argument,
    check_cluster_database,
    integer,
    one_line,
    require_cluster,
)
from orchestrator._cluster.cache import MAX_MIB, MAX_SESSIONS
from orchestrator._core.errors import SessionError, UnavailableError


def register(commands: Any) -> None:
    """Add ``worker`` to the parser."""
    worker = commands.add_parser(
        "worker", help="run session workflows for a Temporal cluster (needs the 'cluster' extra)"
    )
    add_cluster_arguments(worker)
    add_model_arguments(worker)
    add_compaction_size_arguments(worker)
    worker.add_argument(
        "--short-summary",
        action="store_true",
        help="also write a one-or-two sentence short summary on each compaction",
    )
    worker.add_argument(
        "--no-offline-fallback",
        action="store_true",
        help="when the summary gate refuses every model's summary, fail instead of committing the "
        "offline extractive summary (D32)",
    )
    add_timeout_argument(worker)
    worker.add_argument(
        "--cache-sessions",
        type=cache_bound,
        default=MAX_SESSIONS,
        metavar="N",
        help=f"parsed sessions this worker keeps at most (default: {MAX_SESSIONS}; 0: no cache)",
    )
    worker.add_argument(
        "--cache-mib",
        type=cache_bound,
        default=MAX_MIB,
        metavar="M",
        help=f"MiB of stored sessions it keeps parsed at most (default: {MAX_MIB}; 0: no cache)",
    )
    worker.add_argument(
        "--deployment",
        metavar="NAME",
        help="the Temporal worker deployment this build belongs to (default: the task queue)",
    )
    worker.add_argument(
        "--unversioned",
        action="store_true",
        help="poll without Temporal worker versioning (session runs are then not pinned to "
        "this build; docs/scale-out.md)",
    )
    worker.add_argument(
        "--no-promote",
        action="store_true",
        help="start this build without making it the deployment's current one (new sessions "
        "keep starting on the current build)",
    )
    worker.set_defaults(handler=_worker)


def cache_bound(text: str) -> int:
    """An ``argparse`` type for the cache's bounds: an integer, 0 (no cache) or more.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not an integer, or is negative.
    """
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (0 turns the cache off)")
    return value


def _worker(args: argparse.Namespace) -> int:
    require_cluster()
    try:
        check_cluster_database(args.database)
    except SessionError as exc:
        return _refuse(f"--database: {exc}")
    from orchestrator._cli.chat import chat_agent_factory, route_settings, runtime_settings
    from orchestrator._cli.pi_settings import first_model, with_pi_settings
    from orchestrator._cluster.cache import SessionCache
    from orchestrator._cluster.operation.activities import SessionActivities
    from orchestrator._cluster.stores import WorkerStores
    from orchestrator._cluster.versioning import WorkerVersion, build_id
    from orchestrator._cluster.worker import run_worker
    from orchestrator._runtime.operation.routes import build_summarizer

    args = with_pi_settings(args, first_model(args))
    routes = route_settings(args)
    if args.api_key:
        print(f"orchestrator worker: {API_KEY_VISIBLE}", file=sys.stderr, flush=True)
    settings = runtime_settings(args)
    agent_factory = chat_agent_factory(routes, args.timeout)
    cache = SessionCache(max_sessions=args.cache_sessions, max_bytes=args.cache_mib << 20)
    activities = SessionActivities(
        args.database,
        build_summarizer(routes),
        settings,
        agent_factory=agent_factory,
        stores=WorkerStores(args.database, cache=cache),
    )

    # The deployment is the task queue's: fleets on two queues never promote over each other.
    deployment = args.deployment or args.task_queue
    version = None if args.unversioned else WorkerVersion(deployment, build_id())

    def ready(text: str) -> None:
        print(f"orchestrator worker: ready: {text}", file=sys.stderr, flush=True)

    try:
        asyncio.run(
            run_worker(
                args.temporal,
                activities,
                task_queue=args.task_queue,
                version=version,
                make_current=not args.no_promote,
                ready=ready,
            )
        )
    except UnavailableError as exc:
        return _refuse(f"--temporal: {exc}")
    except KeyboardInterrupt:  # Ctrl+C before the worker was ready
        pass
    print("orchestrator worker: stopped", file=sys.stderr)
    return 0


def _refuse(message: str) -> int:
    """A store or server the worker cannot use: one line, exit 2, before any work is taken."""
    print(f"orchestrator worker: {one_line(message)}", file=sys.stderr)
    return 2
