"""Render a machine table as a Mermaid state diagram and as Markdown tables.

The pictures are drawn from the same validated table the engine runs, never by hand, so the
documentation (docs/machines.md) cannot drift from the behaviour. Output is deterministic (file
order throughout), which lets a test keep that page's copy current by comparing text.

The diagram is structural: states, and one arrow per (row, source) labelled with the event and
its guards. Explanations and effects go in the Markdown table, where long text reads well. Every
name in a diagram is lower_snake_case (the loader enforces it), so nothing needs escaping there.

Usage: ``orchestrator machines NAME [--mermaid | --table]``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.machine import MachineDef, Row, load_machine, shipped_machines


def guard_label(row: Row) -> str:
    """Return a row's guards as text, ``unless`` guards prefixed with ``not``; empty if none."""
    return ", ".join([*row.guards, *(f"not {g}" for g in row.unless)])


def render_mermaid(defn: MachineDef) -> str:
    """Return a Mermaid ``stateDiagram-v2`` for the table, one arrow per row and source.

    Args:
        defn: The validated table.

    Returns:
        The diagram text, ending with a newline.
    """
    lines = ["stateDiagram-v2", f"    [*] --> {defn.initial}"]
    for row in defn.rows:
        guards = guard_label(row)
        label = f"{row.event} [{guards}]" if guards else row.event
        lines.extend(f"    {source} --> {row.dest}: {label}" for source in row.sources)
    lines.extend(f"    {state} --> [*]" for state in defn.states if state in defn.final)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def render_table(defn: MachineDef) -> str:
    """Return Markdown: the states with their meaning, then every transition row in file order.

    Args:
        defn: The validated table.

    Returns:
        The Markdown text, ending with a newline.
    """
    lines = ["| State | Meaning |", "|---|---|"]
    for state, doc in defn.states.items():
        flags = (("initial", state == defn.initial), ("final", state in defn.final))
        marks = [name for name, on in flags if on]
        mark = f" ({', '.join(marks)})" if marks else ""
        lines.append(f"| `{state}`{mark} | {_cell(doc)} |")
    lines += [
        "",
        "| # | From | Event | Guards | To | Effects | Why |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in defn.rows:
        guards = _cell(guard_label(row))
        lines.append(
            f"| {row.index + 1} | {_code(row.sources)} | `{row.event}` | {guards} "
            f"| `{row.dest}` | {_code(row.effects)} | {_cell(row.doc)} |"
        )
    return "\n".join(lines) + "\n"


def render_markdown(defn: MachineDef) -> str:
    """Return a docs/machines.md section: heading, doc, fenced Mermaid diagram, then the tables.

    Returns:
        The Markdown text, ending with a newline.
    """
    intro = f"{defn.doc}\n\n" if defn.doc else ""
    return (
        f"### `{defn.name}`\n\n{intro}```mermaid\n{render_mermaid(defn)}```\n\n{render_table(defn)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print one shipped machine: Mermaid, Markdown tables, or both (the default).

    Args:
        argv: ``NAME [--mermaid | --table]``; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 2 on bad arguments or an unknown machine.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {a for a in args if a.startswith("--")}
    names = [a for a in args if not a.startswith("--")]
    if len(names) != 1 or not flags <= {"--mermaid", "--table"} or len(flags) > 1:
        print(
            "usage: orchestrator machines NAME [--mermaid | --table]",
            file=sys.stderr,
        )
        return 2
    if names[0] not in shipped_machines():
        print(
            f"unknown machine {names[0]!r}; known: {', '.join(shipped_machines())}", file=sys.stderr
        )
        return 2
    try:
        defn = load_machine(names[0])
    except DefinitionError as exc:  # a broken shipped table: say which and why
        print(str(exc), file=sys.stderr)
        return 2
    render = {"--mermaid": render_mermaid, "--table": render_table}.get(
        next(iter(flags), ""), render_markdown
    )
    sys.stdout.write(render(defn))
    return 0
