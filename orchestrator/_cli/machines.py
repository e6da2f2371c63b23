"""Commands about the lifecycle machines: ``machines`` (render) and ``simulate`` (a scenario)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator._cli.common import print_json
from orchestrator._core.errors import SessionError
from orchestrator._core.resources import data_dir
from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._lifecycle.render import render_markdown, render_mermaid, render_table


def register(commands: Any) -> None:
    """Add ``machines`` and ``simulate``."""
    machines = commands.add_parser("machines", help="render the lifecycle machines")
    machines.add_argument("name", nargs="?", help="turn, operation or navigation (default: all)")
    form = machines.add_mutually_exclusive_group()
    form.add_argument("--mermaid", action="store_true", help="Mermaid stateDiagram only")
    form.add_argument("--table", action="store_true", help="Markdown transition table only")
    machines.set_defaults(handler=_machines)

    simulate = commands.add_parser("simulate", help="run a simulation scenario, write its trace")
    simulate.add_argument("scenario", help="a scenario file, or the name of a shipped one")
    simulate.add_argument("--out", help="trace file (default: traces/<name>.jsonl in the checkout)")
    simulate.add_argument("--json", action="store_true", help="print the report as JSON")
    simulate.set_defaults(handler=_simulate)


def _machines(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(shipped_machines())
    for name in names:
        if name not in shipped_machines():
            raise SessionError(f"unknown machine {name!r}; known: {', '.join(shipped_machines())}")
    render = render_mermaid if args.mermaid else render_table if args.table else render_markdown
    sys.stdout.write("\n".join(render(load_machine(name)) for name in names))
    return 0


def scenario_dir() -> Path:
    """The shipped scenarios (``traces/scenarios`` in the checkout)."""
    return data_dir("machines").parent / "traces" / "scenarios"


def _simulate(args: argparse.Namespace) -> int:
    from orchestrator._sim.simulate import simulate

    path = Path(args.scenario)
    if not path.is_file():
        shipped = scenario_dir() / f"{args.scenario}.toml"
        if not shipped.is_file():
            raise SessionError(f"{args.scenario}: no such scenario file or shipped scenario")
        path = shipped
    out = Path(args.out) if args.out else scenario_dir().parent / f"{path.stem}.jsonl"
    report = simulate(path, out)
    if args.json:
        print_json(
            {
                "outcomes": report.outcomes,
                "events": report.events,
                "entries": report.entries,
                "trace": report.trace,
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
    print(f"-- trace written to {out}")
    return 0
