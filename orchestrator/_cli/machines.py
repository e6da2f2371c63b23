"""Commands about the lifecycle machines: ``machines`` (render) and ``simulate`` (a scenario)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchestrator._cli.common import UsageError, print_json
from orchestrator._core.errors import SessionError
from orchestrator._core.resources import data_dir
from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._lifecycle.render import render_markdown, render_mermaid, render_table


def register(commands: Any) -> None:
    """Add ``machines`` and ``simulate``."""
    machines = commands.add_parser("machines", help="render the lifecycle machines")
    machines.add_argument(
        "name", nargs="?", help="turn, operation, navigation or session (default: all)"
    )
    form = machines.add_mutually_exclusive_group()
    form.add_argument("--mermaid", action="store_true", help="Mermaid stateDiagram only")
    form.add_argument("--table", action="store_true", help="Markdown transition table only")
    machines.set_defaults(handler=_machines)

    simulate = commands.add_parser(
        "simulate",
        help="run a simulation scenario, optionally writing its trace",
        epilog=f"shipped scenarios: {', '.join(shipped_scenarios()) or '(none found)'}",
    )
    simulate.add_argument(
        "scenario",
        nargs="?",
        help="a scenario file, or the name of a shipped one (none: list the shipped ones)",
    )
    simulate.add_argument(
        "--out", metavar="FILE", help="write the OpenTelemetry trace here (default: not kept)"
    )
    simulate.add_argument("--json", action="store_true", help="print the report as JSON")
    simulate.set_defaults(handler=_simulate)


def _machines(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(shipped_machines())
    for name in names:
        if name not in shipped_machines():
            raise UsageError(f"unknown machine {name!r}; known: {', '.join(shipped_machines())}")
    render = render_mermaid if args.mermaid else render_table if args.table else render_markdown
    sys.stdout.write("\n".join(render(load_machine(name)) for name in names))
    return 0


def shipped_scenarios() -> list[str]:
    """Names of the shipped scenarios (in the wheel, or ``traces/scenarios`` in a checkout)."""
    return sorted(p.stem for p in data_dir("scenarios").glob("*.toml"))


def _simulate(args: argparse.Namespace) -> int:
    if args.scenario is None:
        # Without a name: what can be run (it was an argparse error naming nothing to run).
        if args.out:
            raise UsageError("--out needs a scenario to run")
        if args.json:
            print_json({"scenarios": shipped_scenarios()})
        else:
            print("\n".join(shipped_scenarios()))
        return 0
    path = Path(args.scenario)
    if os.path.lexists(path) and not path.is_file():
        raise SessionError(f"{path}: not a regular file (a scenario is a TOML file)")
    if not path.is_file():
        shipped = data_dir("scenarios") / f"{args.scenario}.toml"
        if not shipped.is_file():
            raise SessionError(
                f"{args.scenario}: no such scenario file or shipped scenario "
                f"(shipped: {', '.join(shipped_scenarios())})"
            )
        path = shipped
    if args.out:
        return _run_and_report(args, path, _new_file(Path(args.out)), keep=True)
    # Without --out the trace is not kept: the recorded traces in a checkout are test data, and
    # a command run from any folder must not rewrite them.
    with tempfile.TemporaryDirectory() as tmp:
        return _run_and_report(args, path, Path(tmp) / f"{path.stem}.jsonl", keep=False)


def _new_file(out: Path) -> Path:
    """``--out``: a new file in an existing folder; anything already there is kept (as fork's)."""
    if not out.parent.is_dir():
        raise SessionError(f"{out}: the folder {out.parent} does not exist; create it first")
    if os.path.lexists(out):  # a symbolic link too, even one that points nowhere
        raise SessionError(f"{out}: already exists; choose another --out")
    return out


def _run_and_report(args: argparse.Namespace, path: Path, trace: Path, *, keep: bool) -> int:
    from orchestrator._sim.simulate import simulate

    report = simulate(path, trace)
    if args.json:
        print_json(
            {
                "outcomes": report.outcomes,
                "events": report.events,
                "entries": report.entries,
                "trace": report.trace if keep else None,
                "crashed": report.crashed,
            }
        )
        return 0
    for line in report.outcomes:
        print(line)
    for event in report.events:
        if event["type"] != "compaction_update":
            detail = {k: v for k, v in event.items() if k not in ("type", "result")}
            print(f"  event {event['type']} {detail}")
    print(f"-- entries: {', '.join(report.entries)}")
    if report.crashed:
        print("-- the process was killed at the crash point; the reopened session was settled")
    if keep:
        print(f"-- trace written to {trace}")
    else:
        print("-- trace not kept (pass --out FILE to write it)")
    return 0
