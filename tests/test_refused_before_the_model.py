"""A write the file refuses anyway is refused before a summary is paid for (D3, D27).

Before, ``compact`` and ``navigate --summarize`` on a file with a version-4 header, or with a
torn last line whose ``.corrupt`` side file is a folder, called the summarizer and only then
refused to append.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator._core.errors import SessionError
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator.testing import ScriptedModel
from tests.cli_kit import EXAMPLE
from tests.runtime_kit import summary

pytestmark = pytest.mark.anyio

OTHER_BRANCH = "36fbeee7"  # an assistant message off the example's active path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def version_four(tmp_path: Path) -> Path:
    path = tmp_path / "v4.jsonl"
    text = EXAMPLE.read_text(encoding="utf-8")
    path.write_text(text.replace('"version":3', '"version":4', 1), encoding="utf-8")
    return path


def torn(tmp_path: Path) -> Path:
    """The example with a torn last line (a commit moves it into the .corrupt side file)."""
    path = tmp_path / "torn.jsonl"
    shutil.copy(EXAMPLE, path)
    with path.open("ab") as file:
        file.write(b'{"type":"message","id":"torn')
    return path


def torn_with_a_folder_for_its_side_file(tmp_path: Path) -> Path:
    path = torn(tmp_path)
    Path(f"{path}.corrupt").mkdir()
    return path


def torn_with_a_hard_linked_side_file(tmp_path: Path) -> Path:
    path = torn(tmp_path)
    other = tmp_path / "precious.txt"
    other.write_text("precious\n")
    Path(f"{path}.corrupt").hardlink_to(other)
    return path


@pytest.mark.parametrize(
    ("make", "complaint"),
    [
        (version_four, "refusing to append to"),
        (torn_with_a_folder_for_its_side_file, "it is not a regular file"),
        (torn_with_a_hard_linked_side_file, "has 2 names"),
    ],
)
@pytest.mark.parametrize("call", ["compact", "navigate"])
async def test_no_model_call_for_a_write_the_file_refuses(
    tmp_path: Path, make: object, complaint: str, call: str
) -> None:
    assert callable(make)
    path: Path = make(tmp_path)
    before = path.read_bytes()
    model = ScriptedModel([summary()] * 3)
    runtime = AgentSession.open(path, summarizer=SummaryRoutes(candidates=(model,)))
    try:
        work = (
            runtime.compact()
            if call == "compact"
            else runtime.navigate(OTHER_BRANCH, summarize=True)
        )
        with pytest.raises(SessionError, match=complaint):
            await work
        assert model.requests == []
        # A dry run writes nothing, so it is not refused.
        if call == "compact":
            await runtime.compact(dry_run=True)
    finally:
        runtime.close()
    assert path.read_bytes() == before
    if (tmp_path / "precious.txt").exists():
        assert (tmp_path / "precious.txt").read_text() == "precious\n"
