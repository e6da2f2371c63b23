"""The ``orchestrator`` command: argument parsing and error reporting.

Each command lives in its own ``_cli_*`` module; this one only builds the parser, dispatches, and
turns our errors into one line on stderr (no traceback for a user mistake). Exit codes follow
``spec/inspection-json.md``: 0 ok, 1 a file or input that cannot be used, 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from orchestrator._core.errors import OrchestratorError

Command = Callable[[argparse.Namespace], int]


def _build_parser() -> argparse.ArgumentParser:
    from orchestrator._cli import inspect, journal, machines, ops, serve, tui

    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Inspect, compact and navigate pi-format agent sessions.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect.register(commands)
    ops.register(commands)
    journal.register(commands)
    machines.register(commands)
    tui.register(commands)
    serve.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (also used by the console script)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    handler: Command = args.handler
    try:
        return handler(args)
    except OrchestratorError as exc:
        print(f"orchestrator {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"orchestrator {args.command}: interrupted; nothing was applied", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
