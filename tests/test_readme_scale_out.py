"""The "Scale out" commands (docs/scale-out.md, once the README's section) are ones the command
line accepts (issue 10).

The page was run as written on a fresh machine; this keeps it from drifting: every
``orchestrator`` line in its shell block parses with the current parser, and the block starts
the services and the two workers it promises.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from orchestrator._cli.main import _build_parser

PAGE = Path(__file__).resolve().parent.parent / "docs" / "scale-out.md"


def scale_out_block() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Scale out\n")
    section = text.split("\n## ", 1)[0]  # the page's text before any subsection
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).splitlines()


def test_every_orchestrator_command_in_scale_out_parses() -> None:
    stripped = [line.strip().removeprefix("| ") for line in scale_out_block()]
    commands = [line for line in stripped if line.startswith("orchestrator ")]
    assert len(commands) == 5  # import, two workers, serve, export
    for line in commands:
        words = shlex.split(line.split("#")[0].split("|")[0].rstrip(" &"))[1:]
        words = [w.replace("$DB", "postgresql://u@h/d").replace("$S", "s") for w in words]
        parser = _build_parser(words)
        args = parser.parse_args(words)
        assert args.command == words[0]


def test_scale_out_starts_both_services_two_workers_and_a_server() -> None:
    lines = scale_out_block()
    assert lines[0] == "pip install -e '.[cluster]'"
    assert any(line.startswith("temporal server start-dev --headless") for line in lines)
    assert any(line.startswith("pg_ctlcluster 15 main start") for line in lines)
    assert sum(line.startswith("orchestrator worker --temporal") for line in lines) == 2
    assert any("orchestrator serve --temporal" in line for line in lines)
