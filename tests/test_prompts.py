import string
from pathlib import Path

import pytest

from orchestrator._core.errors import DefinitionError
from orchestrator._core.prompts import PLACEHOLDERS, PromptSet, default_prompts, render
from orchestrator._core.resources import data_dir

# What the code fills, written out by hand: adding or removing a placeholder in a prompt file
# (or in PLACEHOLDERS) without changing the code that renders it fails here.
EXPECTED = {
    "summarizer_system": set(),
    "compaction_summary": set(),
    "compaction_update": set(),
    "turn_prefix": set(),
    "short_summary": set(),
    "branch_summary": set(),
    "branch_preamble": set(),
    "auto_continue": set(),
    "compaction_context": {"summary"},
    "branch_context": {"summary"},
}


def test_placeholder_table_matches_the_code() -> None:
    assert {name: set(keys) for name, keys in PLACEHOLDERS.items()} == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_shipped_template_has_exactly_the_filled_keys(name: str) -> None:
    text = (data_dir("prompts") / f"{name}.md").read_text(encoding="utf-8")
    template = string.Template(text)
    assert template.is_valid()
    assert set(template.get_identifiers()) == EXPECTED[name]


def test_every_shipped_prompt_file_is_known_and_clean() -> None:
    files = sorted(path.stem for path in data_dir("prompts").glob("*.md"))
    assert files == sorted(EXPECTED)
    for path in data_dir("prompts").glob("*.md"):
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n"), path.name
        assert not text.endswith("\n\n"), path.name
        assert all(line == line.rstrip() for line in text.split("\n")), path.name
        assert "\t" not in text, path.name
        assert "\r" not in text, path.name


def test_default_set_loads_every_template() -> None:
    assert default_prompts().names == frozenset(EXPECTED)


def test_auto_continue_text_is_exact() -> None:
    assert render("auto_continue") == "Continue if you have next steps."


def test_wrappers_put_the_summary_in_tags() -> None:
    for name in ("compaction_context", "branch_context"):
        text = render(name, summary="S1\nS2")
        assert text.endswith("\n\n<summary>\nS1\nS2\n</summary>")


def test_branch_context_keeps_pi_sentence() -> None:
    assert render("branch_context", summary="x").startswith(
        "The following is a summary of a branch that this conversation came back from:"
    )


def test_summary_prompts_ask_for_the_reference_layout() -> None:
    for name in ("compaction_summary", "compaction_update", "branch_summary"):
        text = render(name)
        headings = [
            "## Goal",
            "## Constraints & Preferences",
            "## Progress",
            "### Done",
            "### In Progress",
            "### Blocked",
            "## Key Decisions",
            "## Next Steps",
            "## Critical Context",
        ]
        positions = [text.index(h + "\n") for h in headings]
        assert positions == sorted(positions), name
    # A branch summary has Critical Context too: what was learned there (answers, errors,
    # values) and an unanswered question are what the user comes back for.
    prefix = render("turn_prefix")
    for heading in ("## Original Request", "## Early Progress", "## Context for Suffix"):
        assert heading in prefix


def test_render_needs_every_value() -> None:
    with pytest.raises(KeyError):
        render("compaction_context")


def _write(directory: Path, **texts: str) -> None:
    for name, text in texts.items():
        (directory / f"{name}.md").write_text(text, encoding="utf-8")


def test_unfilled_placeholder_fails_at_load(tmp_path: Path) -> None:
    _write(tmp_path, a="Hello $name and $other\n")
    with pytest.raises(DefinitionError, match="never filled.*other"):
        PromptSet(tmp_path, {"a": frozenset({"name"})})


def test_missing_placeholder_fails_at_load(tmp_path: Path) -> None:
    _write(tmp_path, a="Hello\n")
    with pytest.raises(DefinitionError, match="missing placeholders.*name"):
        PromptSet(tmp_path, {"a": frozenset({"name"})})


def test_invalid_placeholder_fails_at_load(tmp_path: Path) -> None:
    _write(tmp_path, a="Costs $5\n")
    with pytest.raises(DefinitionError, match="invalid placeholder"):
        PromptSet(tmp_path, {"a": frozenset()})


def test_trailing_whitespace_fails_at_load(tmp_path: Path) -> None:
    _write(tmp_path, a="line  \nnext\n")
    with pytest.raises(DefinitionError, match="line 1 ends with whitespace"):
        PromptSet(tmp_path, {"a": frozenset()})


def test_missing_file_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read"):
        PromptSet(tmp_path, {"absent": frozenset()})


def test_good_set_renders_and_keeps_dollar_escapes(tmp_path: Path) -> None:
    _write(tmp_path, a="Pay $$5 to ${name}\n\n")
    prompts = PromptSet(tmp_path, {"a": frozenset({"name"})})
    assert prompts.render("a", name="Ann") == "Pay $5 to Ann"
    assert prompts.render("a", name="$x") == "Pay $5 to $x"
