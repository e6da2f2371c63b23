"""The ``orchestrator`` command: argument parsing and error reporting.

Each command lives in its own module here; this one only builds the parser, dispatches, and
turns our errors into one line on stderr (no traceback for a user mistake). Exit codes (README,
"Commands"): 0 ok, 1 a file or input that cannot be used, 2 a usage error.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from orchestrator._cli.common import (
    MissingExtraError,
    UsageError,
    kept,
    one_line,
    release_kept,
)
from orchestrator._cli.terminal import TerminalSafe
from orchestrator._core.errors import EntryNotFoundError, OrchestratorError
from orchestrator._core.redact import redact

Command = Callable[[argparse.Namespace], int]

# The module that registers and runs each command. A command imports its own module only: an
# inspection command then never loads the runtime, the model clients, tracing or the TUI
# (tests/test_imports.py holds it to that). Modules in the order ``--help`` lists them.
_MODULES = (
    "sessions",
    "inspect",
    "ops",
    "operation",
    "journal",
    "machines",
    "tui",
    "serve",
    "database",
    "worker",
)
_COMMANDS = {
    "sessions": "sessions",
    "context": "inspect",
    "plan": "inspect",
    "tree": "inspect",
    "check": "inspect",
    "compact": "ops",
    "navigate": "ops",
    "fork": "ops",
    "operation": "operation",
    "journal": "journal",
    "machines": "machines",
    "simulate": "machines",
    "tui": "tui",
    "serve": "serve",
    "import": "database",
    "export": "database",
    "worker": "worker",
}


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Inspect, compact and navigate pi-format agent sessions.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    first = next((arg for arg in argv or () if not arg.startswith("-")), None)
    # No command, or one I do not know: register them all, for --help and argparse's message.
    # The version alone needs none (registering every command imports the runtime: 0.3 s).
    modules: tuple[str, ...] = (_COMMANDS[first],) if first in _COMMANDS else _MODULES
    if list(argv or ()) == ["--version"]:
        modules = ()
    for name in modules:
        importlib.import_module(f"orchestrator._cli.{name}").register(commands)
    for command in commands.choices.values():
        # Errors found after parsing are reported with the subcommand's own usage (main).
        command.set_defaults(command_parser=command)
    return parser


class _VersionAction(argparse.Action):
    """``--version``, reading the installed version only when asked (package metadata is slow)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("session-orchestrator")
    except PackageNotFoundError:  # pragma: no cover - only when run from an uninstalled tree
        return "unknown (not installed)"


def _tolerate_lone_surrogates() -> None:
    # A session may hold a lone surrogate (JSON carries one, pi writes one); printing it to a
    # UTF-8 stream would raise. Human output shows it as a \udXXX escape instead.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (also used by the console script)."""
    _tolerate_lone_surrogates()
    release_kept()
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(words)
    args, extra = parser.parse_known_args(words)
    command: argparse.ArgumentParser = args.command_parser
    if extra:
        # argparse would blame the top-level parser and show its usage; a mistake after the
        # command name is in the subcommand's arguments, so its usage is the helpful one.
        before = words[: words.index(args.command)] if args.command in words else []
        owner = parser if any(word in before for word in extra) else command
        owner.error(f"unrecognized arguments: {' '.join(extra)}")  # exits with 2
    handler: Command = args.handler
    if args.command in _OWN_THE_TERMINAL:
        return _run(handler, args, command)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalSafe(sys.stdout), TerminalSafe(sys.stderr)
    try:
        return _run(handler, args, command)
    finally:
        sys.stdout, sys.stderr = saved


def run() -> NoReturn:
    """The console script and ``python -m orchestrator``: :func:`main`, then exit.

    A process that started the Temporal SDK's runtime (``serve --temporal``, ``worker``) exits
    without the interpreter's finalization, once everything is flushed and the exit functions
    have run. The runtime's core forwards its log lines to Python from a thread of its own;
    while the interpreter finalizes, that thread waits for the interpreter lock for good, and
    the collector dropping the runtime then waits for the thread: ``serve --temporal`` hung
    after printing "stopped" in about one exit of six (tests/test_cluster_processes.py), so a
    service manager's SIGTERM did not end it.

    An inspection command that read a session (``context``, ``plan``, ``tree``, ``check``) exits
    the same way, so that the interpreter does not free every entry before the kernel takes
    the whole memory back (:func:`~orchestrator._cli.common.keep_until_exit`).
    """
    code = main()
    if _temporal_runtime_started() or kept():
        atexit._run_exitfuncs()  # what a normal exit runs first (database connections, logging)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _temporal_runtime_started() -> bool:
    client = sys.modules.get("orchestrator._cluster.client")
    runtime = getattr(client, "_runtime", None)
    return runtime is not None and runtime.cache_info().currsize > 0


_OWN_THE_TERMINAL = frozenset({"tui", "serve", "worker"})
"""Commands that drive the terminal or speak a protocol on stdout: not wrapped (terminal.py)."""


def _run(handler: Command, args: argparse.Namespace, command: argparse.ArgumentParser) -> int:
    try:
        return handler(args)
    except UsageError as exc:
        command.error(one_line(str(exc)))
    except MissingExtraError as exc:
        print(f"orchestrator {args.command}: {exc}", file=sys.stderr)
        return 2
    except EntryNotFoundError as exc:
        # pi's "Entry X not found" names neither the session nor, for an empty or odd id,
        # visibly the id: "Entry  not found" for --leaf "".
        where = getattr(args, "session", None)
        message = f"entry {exc.entry_id!r} not found"
        print(
            f"orchestrator {args.command}: {f'{where}: ' if where else ''}{message}",
            file=sys.stderr,
        )
        return 1
    except OrchestratorError as exc:
        # A model's failure is redacted where it is made; this line is redacted again, as it
        # may quote a provider's exception some route wrapped in another error.
        print(f"orchestrator {args.command}: {one_line(redact(str(exc)))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"orchestrator {args.command}: interrupted; nothing was applied", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # The stores name the file and the reason themselves; this catches what slips past
        # them (a full disk mid-write, a file removed under us), still as one line (issue 8).
        print(f"orchestrator {args.command}: {one_line(_os_error_line(exc))}", file=sys.stderr)
        return 1


def _os_error_line(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
