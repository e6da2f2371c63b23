"""The first hour with the command line: what it says when something is missing or wrong."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from orchestrator._cli import main as cli_main
from orchestrator._cli.machines import shipped_scenarios
from tests.cli_kit import EXAMPLE, run

ROOT = Path(__file__).parent.parent
URL = "postgresql://me@127.0.0.1:1/agents"


def test_simulate_without_a_scenario_lists_the_shipped_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It was argparse's "the following arguments are required: scenario", naming none.
    code, out, err = run(capsys, "simulate")
    assert (code, err) == (0, "")
    assert out.splitlines() == shipped_scenarios()
    assert "overflow" in out.splitlines()


def test_simulate_without_a_scenario_refuses_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["simulate", "--out", "trace.jsonl"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--out needs a scenario to run")


def test_every_command_the_terminal_wrapper_names_exists() -> None:
    # It named a "chat" command, as the README did; there is none (tui --chat is the chat).
    assert set(cli_main._OWN_THE_TERMINAL) <= set(cli_main._COMMANDS)


@pytest.mark.parametrize(
    "argv",
    [
        ["import", str(EXAMPLE), "--database", URL],
        ["export", "s1", "--database", URL],
        ["context", "s1", "--database", URL],
        ["check", "s1", "--database", URL],
    ],
    ids=lambda argv: argv[0],
)
def test_a_database_command_without_psycopg_says_how_to_get_it_in_one_line(
    argv: list[str],
) -> None:
    # It was a ModuleNotFoundError traceback. psycopg is blocked in a fresh interpreter, as if
    # the 'cluster' extra had never been installed.
    script = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "from orchestrator._cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"orchestrator {argv[0]}: --database needs psycopg, from the 'cluster' extra: "
        "pip install -e '.[cluster]'\n"
    )


def test_the_install_hint_is_the_documented_command() -> None:
    from orchestrator._cli.common import CLUSTER_INSTALL

    # The scale-out page, which the README links for the cluster, gives it as its first line.
    assert f"\n{CLUSTER_INSTALL}" in (ROOT / "docs" / "scale-out.md").read_text(encoding="utf-8")


def test_the_package_names_its_authors() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["authors"] == [{"name": "session-orchestrator developers"}]
