"""The ``serve`` command: the JSON-RPC server on stdio, a Unix socket or a loopback TCP port.

``orchestrator serve [SESSION.jsonl ...] [--dir DIR] [--stdio | --socket PATH | --port N]
[--host ADDR] [--token-file FILE] [--model M ...] [--api-key-file FILE]``

With no ``--model`` compactions and branch summaries use the built-in offline summarizer and
``session.prompt`` is refused; with ``--model`` the first model is also the chat agent's. On
stdio, stdout carries protocol lines only; everything meant for a person goes to stderr.

Who may connect (D30): stdio belongs to the parent process; a Unix socket is made with mode
0600; a TCP port listens on loopback only and wants a token first, random and written to a new
0600 file (its path printed at start) unless ``--token-file`` names one. A mistake in these
options (a port out of range, a non-loopback host, a busy port, a token file others can read)
is one line on stderr: exit 2 for a usage error, 1 for a listener that cannot be made.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from orchestrator._cli.chat import chat_agent_factory, runtime_settings
from orchestrator._cli.common import (
    API_KEY_VISIBLE,
    KEEP_RECENT_TOKENS,
    RESERVE_TOKENS,
    UsageError,
    add_cluster_arguments,
    add_compaction_size_arguments,
    add_timeout_argument,
    check_cluster_database,
    http_url,
    one_line,
    positive_int,
    require_cluster,
)
from orchestrator._cli.pi_settings import first_model, with_pi_settings
from orchestrator._core.errors import SessionError
from orchestrator._process.gc_policy import POLICY, freeze_after_full_collections
from orchestrator._process.signals import stop_signals
from orchestrator._rpc import access
from orchestrator._rpc.hub import RpcHub, RuntimeOptions, SessionHub
from orchestrator._rpc.server import RpcServer
from orchestrator._runtime.driver import first_error
from orchestrator._runtime.operation.routes import RouteSettings, build_summarizer

Listener = TypeVar("Listener")


def register(commands: Any) -> None:
    """Add ``serve`` to the parser."""
    serve = commands.add_parser(
        "serve", help="serve sessions over JSON-RPC (stdio, a Unix socket or loopback TCP)"
    )
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
    where.add_argument(
        "--socket", type=Path, metavar="PATH", help="listen on a Unix socket (mode 0600)"
    )
    where.add_argument(
        "--port", type=int, help="listen on loopback TCP port N (0: any free port); needs a token"
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="loopback address for --port (127.0.0.1, ::1)"
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="with --port: read the token from FILE (mode 0600) instead of making one",
    )
    serve.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="M",
        help="litellm model id: the chat agent and the first summary route; "
        "repeat for more summary candidates (default: offline, no prompts)",
    )
    serve.add_argument("--api-base", help="base URL for the litellm routes")
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="read the API key from FILE (mode 0600; default: the provider's usual variable)",
    )
    keys.add_argument(
        "--api-key", help="API key (visible to other users in the process list: avoid)"
    )
    serve.add_argument(
        "--context-window",
        type=positive_int,
        default=0,
        help="the model's context window in tokens",
    )
    serve.add_argument(
        "--remote", type=http_url, metavar="URL", help="remote summary endpoint (http or https)"
    )
    add_compaction_size_arguments(serve)
    add_timeout_argument(serve)
    serve.add_argument(
        "--short-summary",
        action="store_true",
        help="also write a one-or-two sentence short summary on each compaction and branch summary",
    )
    add_cluster_arguments(serve, required=False)
    serve.set_defaults(handler=_serve)


class _Refused(Exception):
    """A bad option: one line on stderr and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _options(args: argparse.Namespace, api_key: str | None = None) -> RuntimeOptions:
    args = with_pi_settings(args, first_model(args))
    routes = RouteSettings(
        models=tuple(args.model),
        api_base=args.api_base,
        api_key=api_key or args.api_key or None,
        context_window=args.context_window,
        remote_url=args.remote,
        reserve_tokens=args.reserve_tokens,
    )
    agent_factory = chat_agent_factory(routes, args.timeout)
    settings = runtime_settings(args)
    return RuntimeOptions(
        agent_factory=agent_factory,
        summarizer=build_summarizer(routes),
        settings=settings,
        root=args.dir,
    )


def _check(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """Validate the listener, key and store options; returns (host to bind, API key from a file).

    Raises:
        _Refused: a usage error (2) or a file that cannot be used (1).
    """
    if args.port is not None and not 0 <= args.port <= 65535:
        raise _Refused(f"--port {args.port}: not a port number (0 to 65535)", 2)
    host = None
    if args.port is not None:
        try:
            host = access.loopback_host(args.host)
        except ValueError as exc:
            raise _Refused(str(exc), 2) from None
    elif args.host != "127.0.0.1" or args.token_file is not None:
        raise _Refused("--host and --token-file go with --port", 2)
    if args.temporal and args.database and not args.sessions:
        require_cluster()
        try:
            check_cluster_database(args.database)
        except SessionError as exc:
            raise _Refused(f"--database: {exc}", 2) from None
    api_key = None
    if args.api_key_file is not None:
        try:
            api_key = access.read_secret_file(args.api_key_file, "API key")
        except ValueError as exc:
            raise _Refused(str(exc), 1) from None
    return host, api_key


def _serve(args: argparse.Namespace) -> int:
    try:
        host, api_key = _check(args)
        token, token_file, made = _token(args) if host is not None else (None, None, False)
    except _Refused as refused:
        _say(str(refused))
        return refused.code
    if args.api_key:
        _say(API_KEY_VISIBLE)
    hub = (
        _cluster_hub(args)
        if args.temporal or args.database
        else SessionHub(_options(args, api_key))
    )
    server = RpcServer(hub, log=_say)
    # A server holds many sessions for long: the collector stops re-walking them (issue 9).
    policy = freeze_after_full_collections()
    try:
        anyio.run(_run, args, hub, server, host, token, token_file)
    except KeyboardInterrupt:
        _say("stopped")
    except _Refused as refused:
        _say(str(refused))
        return refused.code
    finally:
        policy.uninstall()
        if made and token_file is not None:
            access.remove_token_file(token_file)
    return 0


def _cluster_hub(args: argparse.Namespace) -> RpcHub:
    """The hub backed by session workflows (``--temporal`` with ``--database``)."""
    if not (args.temporal and args.database):
        raise UsageError("--temporal and --database go together")
    if args.sessions:
        raise UsageError(
            "with --temporal, sessions live in --database: open them with session.open"
        )
    if ignored := _workers_options(args):
        raise UsageError(
            f"with --temporal, {', '.join(ignored)} would do nothing here: the workers call the "
            "models and compact (give the model options to orchestrator worker), and the "
            "sessions live in --database"
        )
    require_cluster()
    from orchestrator._rpc.cluster_hub import ClusterHub

    return ClusterHub(args.temporal, args.database, task_queue=args.task_queue)


def _workers_options(args: argparse.Namespace) -> list[str]:
    """The options given that only a one-process server uses.

    With ``--temporal`` the workers call the models and compact, and the sessions live in
    ``--database``, not ``--dir``: given here, they did nothing.
    """
    given = {
        "--dir": args.dir is not None,
        "--model": bool(args.model),
        "--api-base": args.api_base is not None,
        "--api-key": args.api_key is not None,
        "--api-key-file": args.api_key_file is not None,
        "--remote": args.remote is not None,
        "--context-window": bool(args.context_window),
        "--reserve-tokens": args.reserve_tokens != RESERVE_TOKENS,
        "--keep-recent-tokens": args.keep_recent_tokens != KEEP_RECENT_TOKENS,
        "--pi-settings": bool(args.pi_settings),
        "--timeout": args.timeout is not None,
        "--short-summary": bool(args.short_summary),
    }
    return [option for option, present in given.items() if present]


def _token(args: argparse.Namespace) -> tuple[str, Path, bool]:
    """The TCP token, the file holding it, and whether I made that file."""
    if args.token_file is not None:
        try:
            return access.read_secret_file(args.token_file, "token"), args.token_file, False
        except ValueError as exc:
            raise _Refused(str(exc), 1) from None
    token = access.new_token()
    return token, access.write_token_file(token), True


async def _run(
    args: argparse.Namespace,
    hub: RpcHub,
    server: RpcServer,
    host: str | None,
    token: str | None,
    token_file: Path | None,
) -> None:
    identity = None
    try:
        async with _unwrapped(), anyio.create_task_group() as group:
            # Ctrl+C, SIGTERM and SIGHUP: every running request answered, then sessions
            # closed, socket and token file removed. Watched from the start: a signal while the
            # sessions open ends the start within a few sessions of it (a session's opening is
            # not interrupted; Ctrl+C was lost, the server went on; SIGTERM killed it, leaving
            # its token file behind).
            starting = anyio.CancelScope()
            await group.start(_stop_on_signal, server, group.cancel_scope, starting)
            listener = None
            with starting:
                listener = await _start(args, hub, host, token_file)
            if args.socket is not None and listener is not None:
                identity = access.file_identity(args.socket)
            if starting.cancel_called:  # stopped while starting: nothing to answer yet
                if listener is not None:
                    await listener.aclose()
            elif listener is not None:
                await server.serve_listener(listener, token=token)
            else:
                await server.serve_stdio()
            group.cancel_scope.cancel()
    finally:
        if args.socket is not None:
            access.remove_socket(args.socket, identity)
        hub.abort_all()
        hub.close_all()


@contextlib.asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """The error of the start or of serving as it was raised, not grouped by the task group.

    A session the start cannot open is one line and exit 1, as before the stop signals were
    watched from the start (the watcher never raises).
    """
    try:
        yield
    except BaseExceptionGroup as errors:
        error = first_error(errors)
        # Its own cause kept (`from None` would erase it: a surface reads the chain for
        # the system error behind it), the group's context hidden.
        raise error from error.__cause__


async def _start(
    args: argparse.Namespace, hub: RpcHub, host: str | None, token_file: Path | None
) -> anyio.abc.Listener[anyio.abc.SocketStream] | None:
    """Open the sessions named at start, then listen (``None``: the server reads stdin)."""
    for path in args.sessions:
        assert isinstance(hub, SessionHub)  # noqa: S101 - refused with --temporal above
        slot = hub.open(path, create=True)
        _say(f"session {slot.runtime.session.session_id}: {slot.path}")
        await anyio.lowlevel.checkpoint()  # where a stop signal meanwhile ends the start
    POLICY.settle()  # freeze what the sessions opened at start hold, before serving
    if args.socket is not None:
        # Nothing awaits between the socket's creation and the caller reading its identity
        # (so that it is removed at the end): a stop lands in serving, not in between.
        listener = await _listen(args.socket, access.unix_listener(args.socket))
        _say(f"listening on unix:{args.socket}")
        return listener
    if host is not None:
        bind = anyio.create_tcp_listener(local_host=host, local_port=args.port)
        tcp = await _listen(f"{host}:{args.port}", bind)
        port = tcp.extra(anyio.abc.SocketAttribute.local_port)
        _say(f"listening on {host}:{port} (token in {token_file})")
        return tcp
    return None


async def _stop_on_signal(
    server: RpcServer,
    scope: anyio.CancelScope,
    starting: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    # SIGINT too: as KeyboardInterrupt it would cancel every request with no answer sent. A
    # second signal meanwhile waits here; stopping takes at most the drop timeout.
    with anyio.open_signal_receiver(*stop_signals()) as signals:
        task_status.started()
        async for _ in signals:
            _say("stopped")
            starting.cancel()  # a start in progress opens no more sessions
            with anyio.move_on_after(server.limits.drop_timeout):
                await server.stop()
            scope.cancel()
            return


async def _listen(where: object, bind: Awaitable[Listener]) -> Listener:
    try:
        # Shielded: a stop signal meanwhile must not leave a socket file made and not known.
        with anyio.CancelScope(shield=True):
            listener = await bind
    except OSError as exc:
        raise _Refused(f"cannot listen on {where}: {exc.strerror or exc}", 1) from None
    return listener


def _say(text: str) -> None:
    print(f"orchestrator serve: {one_line(text)}", file=sys.stderr, flush=True)
