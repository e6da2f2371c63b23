"""``navigate --summarize`` with the offline summarizer, as a new user tries it on the example."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator._store.session import Session
from tests.cli_kit import run

TARGET = "11a25bfa"  # on the first branch: navigating there abandons the "Keep Decimal." branch
REQUEST = (
    "Keep Decimal. Write the regression test expecting 10.01 and make sure the whole suite "
    "passes. Please use pytest parametrize for the cases."
)


def section(summary: str, heading: str) -> str:
    return summary.split(f"{heading}\n", 1)[1].split("\n## ", 1)[0]


def summarize(example: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code, out, err = run(capsys, "navigate", str(example), "--to", TARGET, "--summarize", *extra)
    assert code == 0, err
    entry = Session.open(example).tree.entries[-1]
    assert entry["type"] == "branch_summary"
    assert entry["summary"] in out
    summary: str = entry["summary"]
    return summary


def test_the_branch_summary_has_the_whole_request_and_the_work_done(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summarize(example, capsys)
    assert section(summary, "## Goal") == f"- {REQUEST}\n"
    done = section(summary, "## Progress").split("### In Progress")[0]
    assert "- [x] write `tests/test_tax_rounding.py`\n" in done
    assert "- [x] Ran `python -m pytest -q` (the assistant reported: " in done
    assert "all 54 tests pass." in done
    steps = section(summary, "## Next Steps")
    assert steps.startswith(
        "1. Nothing on this branch was left open\n"
        "2. The branch ended at the assistant's reply: Done: totals and VAT round once"
    )
    critical = section(summary, "## Critical Context")
    # The branch this one came back from is a lesson for this one: it is kept.
    assert "- An abandoned branch tried: Add a VAT rounding regression test." in critical


def test_the_focus_is_honoured(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = summarize(example, capsys, "--focus", "the report modules")
    critical = section(summary, "## Critical Context")
    assert "- Requested focus: the report modules\n" in critical
    assert "- On the focus (verbatim): None of the report modules round per line.\n" in critical


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--summarize", "--focus", "a haiku", "--replace-instructions"],
            "the offline summarizer cannot follow replacement instructions",
        ),
    ],
)
def test_instructions_that_cannot_be_honoured_are_refused(
    example: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    before = example.read_bytes()
    code, out, err = run(capsys, "navigate", str(example), "--to", TARGET, *extra)
    assert code == 1
    assert err.startswith("orchestrator navigate: ")
    assert message in err
    assert err.count("\n") == 1
    assert example.read_bytes() == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--focus", "the tests"], "--focus and --replace-instructions shape the summary"),
        (["--summarize", "--replace-instructions"], "--replace-instructions needs --focus"),
    ],
)
def test_options_that_do_not_go_together_are_a_usage_error(
    example: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    before = example.read_bytes()
    with pytest.raises(SystemExit) as exited:
        run(capsys, "navigate", str(example), "--to", TARGET, *extra)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: orchestrator navigate")
    assert f"orchestrator navigate: error: {message}" in err
    assert example.read_bytes() == before


def test_summarizing_a_branch_of_only_our_leaf_marker_writes_nothing(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first move leaves a leaf marker under the target; going there again with --summarize
    # abandoned only that marker and wrote "No content to summarize" into the context.
    code, _, err = run(capsys, "navigate", str(example), "--to", "7c3c1046")
    assert code == 0, err
    moved = example.read_bytes()
    code, out, err = run(
        capsys, "navigate", str(example), "--to", "7c3c1046", "--summarize", "--json"
    )
    assert code == 0, err
    assert '"summaryEntryId": null' in out
    assert example.read_bytes() == moved  # no summary entry, no second marker
