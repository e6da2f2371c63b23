"""Commands import only what they use (issue 9): an inspection loads no runtime dependency."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli_kit import EXAMPLE

# msgspec too: it parses big files only (tests/data's example is small); its import costs more.
HEAVY = (
    "anyio",
    "httpx",
    "aiohttp",
    "httptools",
    "tenacity",
    "transitions",
    "textual",
    "opentelemetry",
    "litellm",
    "msgspec",
    # The PostgreSQL store's driver: only a database location loads it (issue 10).
    "psycopg",
    # The Temporal SDK: only the cluster's commands load it (issue 10).
    "temporalio",
)

# Runs a command in a fresh interpreter, then prints the heavy packages it imported. Only what the
# command loads counts, not what a site's .pth files imported at startup.
PROBE = """
import sys
before = set(sys.modules)
import contextlib, io, json
from orchestrator._cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
heavy = sorted({name.split(".")[0] for name in set(sys.modules) - before} & set(json.loads(HEAVY)))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _probe(*argv: str) -> tuple[int, list[str]]:
    """(exit code, heavy packages imported) of ``orchestrator ARGV...`` in a fresh process."""
    code = PROBE.replace("json.loads(HEAVY)", repr(list(HEAVY)))
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return int(result["code"]), [str(name) for name in result["heavy"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ("context", str(EXAMPLE), "--json"),
        ("context", str(EXAMPLE)),
        ("plan", str(EXAMPLE), "--json"),
        ("tree", str(EXAMPLE)),
        ("check", str(EXAMPLE)),
    ],
    ids=lambda argv: " ".join(argv[:1] + argv[2:]),
)
def test_inspection_commands_import_no_runtime_dependency(argv: tuple[str, ...]) -> None:
    assert _probe(*argv) == (0, [])


@pytest.mark.slow
def test_the_probe_sees_a_command_that_does_import_them() -> None:
    # The same probe on a command that needs the runtime: the check above can fail.
    code, heavy = _probe("compact", str(EXAMPLE), "--dry-run")
    assert code == 0
    assert {"anyio", "opentelemetry"} <= set(heavy)


@pytest.mark.slow
def test_importing_the_package_imports_nothing_heavy() -> None:
    code = (
        "import sys, orchestrator; "
        "print(sorted(m for m in sys.modules if m.startswith('orchestrator.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_file_based_path_never_imports_the_database_driver() -> None:
    # A compaction of a file goes through the runtime, the store and the journal: no psycopg.
    code, heavy = _probe("compact", str(EXAMPLE), "--dry-run")
    assert code == 0
    assert "psycopg" not in heavy
    # The same probe sees it where a database is named (the server is unreachable: exit 1).
    code, heavy = _probe("export", "s", "--database", "postgresql://u@127.0.0.1:1/db")
    assert code == 1
    assert "psycopg" in heavy


def _loaded_by(*modules: str) -> list[str]:
    """The cluster packages (temporalio, psycopg) that importing ``modules`` loads."""
    code = (
        "import importlib, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'temporalio', 'psycopg'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [str(name) for name in json.loads(out.stdout.strip().replace("'", '"'))]


@pytest.mark.slow
def test_the_file_based_path_never_imports_temporal() -> None:
    # A compaction of a file: no temporalio. The one-process server and its commands: none.
    code, heavy = _probe("compact", str(EXAMPLE), "--dry-run")
    assert code == 0
    assert "temporalio" not in heavy
    assert _loaded_by("orchestrator._cli.serve", "orchestrator._cli.worker") == []
    # The same check sees it where the cluster is used.
    assert _loaded_by("orchestrator._rpc.cluster_hub") == ["temporalio"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "library", "not_loaded"),
    [
        ("outside", "httptools", "httpx"),
        ("asyncio", "httptools", "httpx"),
        ("trio", "httpx", "httptools"),
    ],
)
def test_a_remote_route_imports_its_http_library_when_made_not_at_its_first_call(
    where: str, library: str, not_loaded: str
) -> None:
    # A server makes its routes at start: the import (tenths of a second) must not stall its
    # event loop in the middle of its first requests (issue 9). The library is the one of the
    # event loop the route is made on (asyncio's outside any).
    code = (
        "import sys\n"
        "import anyio\n"
        "from orchestrator import RemoteSummaryModel\n"
        "before = set(sys.modules)\n"
        "async def make():\n"
        "    RemoteSummaryModel('http://127.0.0.1:1/summary')\n"
        f"if {where!r} == 'outside':\n"
        "    RemoteSummaryModel('http://127.0.0.1:1/summary')\n"
        "else:\n"
        f"    anyio.run(make, backend={where!r})\n"
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert library in loaded
    assert "msgspec" in loaded
    assert not_loaded not in loaded


def test_the_version_alone_registers_no_command() -> None:
    # It prints and exits while parsing: registering every command would import the runtime.
    code = PROBE.replace("json.loads(HEAVY)", repr(list(HEAVY))).replace(
        "    code = main(sys.argv[1:])",
        "    try:\n        main(sys.argv[1:])\n"
        "    except SystemExit as exit:\n        code = exit.code",
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "--version"], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}
