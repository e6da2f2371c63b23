"""``--pi-settings FILE`` on the commands that take compaction settings; options win."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator._cli.pi_settings import with_pi_settings
from orchestrator._core.context import ContextBuilder
from orchestrator._store.session import Session
from tests.cli_kit import run

# The model the example session's path selects (plan's model in use).
EXAMPLE_MODEL = "anthropic/claude-opus-4-1"


def settings_file(tmp_path: Path, value: Any) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "plan", *argv, "--json")
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_plan_reads_the_fields(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(tmp_path, {"compaction": {"reserveTokens": 1000, "keepRecentTokens": 5}})
    report = plan(capsys, str(example), "--context-window", "80000", "--pi-settings", str(path))
    assert report["threshold"] == 80000 - 1000
    assert report["keepRecentTokens"] == 5


def test_plan_disabled_never_should_compact(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(tmp_path, {"compaction": {"enabled": False}})
    report = plan(capsys, str(example), "--context-window", "80000", "--pi-settings", str(path))
    assert report["shouldCompact"] is False
    assert plan(capsys, str(example), "--context-window", "80000")["shouldCompact"] is True


def test_plan_applies_the_override_of_the_session_model(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = {EXAMPLE_MODEL: {"keepRecentTokens": 7}, "openai/gpt-5": {"keepRecentTokens": 8}}
    path = settings_file(
        tmp_path, {"compaction": {"keepRecentTokens": 100, "modelOverrides": overrides}}
    )
    assert plan(capsys, str(example), "--pi-settings", str(path))["keepRecentTokens"] == 7


def test_plan_builds_the_context_it_reads_the_model_from_once(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []
    original = ContextBuilder.__init__

    def counted(self: ContextBuilder, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ContextBuilder, "__init__", counted)
    overrides = {EXAMPLE_MODEL: {"keepRecentTokens": 7}}
    path = settings_file(tmp_path, {"compaction": {"modelOverrides": overrides}})
    assert plan(capsys, str(example), "--pi-settings", str(path))["keepRecentTokens"] == 7
    assert len(built) == 1  # the plan's own context says which model is in use


def test_options_given_win_over_the_file(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(tmp_path, {"compaction": {"reserveTokens": 1000, "keepRecentTokens": 5}})
    report = plan(
        capsys,
        str(example),
        "--context-window",
        "80000",
        "--reserve-tokens",
        "16384",  # the default value, given: it still wins
        "--pi-settings",
        str(path),
    )
    assert report["threshold"] == 80000 - 16384
    assert report["keepRecentTokens"] == 5


def test_later_files_merge_over_earlier(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "user.json"
    user.write_text(json.dumps({"compaction": {"reserveTokens": 1000, "keepRecentTokens": 5}}))
    project = tmp_path / "project.json"
    project.write_text(json.dumps({"compaction": {"keepRecentTokens": 6}}))
    report = plan(
        capsys,
        str(example),
        "--context-window",
        "80000",
        "--pi-settings",
        str(user),
        "--pi-settings",
        str(project),
    )
    assert (report["threshold"], report["keepRecentTokens"]) == (79000, 6)


def test_compact_keeps_what_the_file_says(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(
        tmp_path, {"compaction": {"keepRecentTokens": 100, "modelOverrides": {"x/y": {}}}}
    )
    expected = plan(capsys, str(example), "--keep-recent-tokens", "100")["compaction"]
    code, out, err = run(
        capsys, "compact", str(example), "--dry-run", "--json", "--pi-settings", str(path)
    )
    assert code == 0, err
    assert json.loads(out)["firstKeptEntryId"] == expected["firstKeptEntryId"]
    default = plan(capsys, str(example))["compaction"]
    assert default["firstKeptEntryId"] != expected["firstKeptEntryId"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read pi settings: No such file or directory"),
        ("{not json", "pi settings are not valid JSON"),
        ('{"compaction": {"keepRecentTokens": "20000"}}', "compaction.keepRecentTokens must be"),
        ('{"compaction": {"enabled": 1}}', "compaction.enabled must be true or false, not 1"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "compact"])
def test_bad_file_is_one_line_exit_1_and_nothing_written(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    content: str | None,
    message: str,
) -> None:
    path = tmp_path / "settings.json"
    if content is not None:
        path.write_text(content)
    before = example.read_bytes()
    code, out, err = run(capsys, command, str(example), "--pi-settings", str(path))
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"orchestrator {command}: {path}: ")
    assert message in err
    assert example.read_bytes() == before


def test_branch_plan_refuses_pi_settings(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    leaf = Session.open(example).leaf_id
    assert leaf is not None
    path = settings_file(tmp_path, {})
    with pytest.raises(SystemExit) as exc:
        run(capsys, "plan", str(example), "--from", leaf, "--to", leaf, "--pi-settings", str(path))
    assert exc.value.code == 2
    assert "--pi-settings is for a compaction plan" in capsys.readouterr().err


def parser_for(*names: str) -> argparse.ArgumentParser:
    from orchestrator._cli.main import _build_parser

    return _build_parser(list(names))


def test_serve_and_worker_runtime_settings_come_from_the_file(tmp_path: Path) -> None:
    from orchestrator._cli.chat import runtime_settings
    from orchestrator._cli.serve import _options

    overrides = {"openai/x": {"reserveTokens": 3000}}
    path = settings_file(
        tmp_path,
        {"compaction": {"enabled": False, "keepRecentTokens": 9, "modelOverrides": overrides}},
    )
    args = parser_for("serve").parse_args(
        ["serve", "--model", "openai/x", "--pi-settings", str(path)]
    )
    settings = _options(args).settings
    assert settings is not None
    compaction = settings.compaction
    assert (compaction.enabled, compaction.reserve_tokens, compaction.keep_recent_tokens) == (
        False,
        3000,
        9,
    )
    # worker: the same two steps (its handler needs a cluster), options first.
    words = ["worker", "--temporal", "h:1", "--database", "postgresql://x", "--pi-settings"]
    args = parser_for("worker").parse_args([*words, str(path), "--keep-recent-tokens", "50"])
    compaction = runtime_settings(with_pi_settings(args, None)).compaction
    assert (compaction.enabled, compaction.reserve_tokens, compaction.keep_recent_tokens) == (
        False,
        16384,
        50,
    )


def test_tui_turn_compactions_follow_the_file_not_its_branch_reserve(
    example: Path, tmp_path: Path
) -> None:
    from orchestrator._cli.tui import build_runtime

    path = settings_file(tmp_path, {"compaction": {"reserveTokens": 1000, "keepRecentTokens": 9}})
    args = parser_for("tui").parse_args(["tui", str(example), "--pi-settings", str(path)])
    runtime = build_runtime(args)
    try:
        settings = runtime.settings
        assert (settings.compaction.reserve_tokens, settings.compaction.keep_recent_tokens) == (
            1000,
            9,
        )
        assert settings.branch_reserve_tokens == 16384  # tui's --reserve-tokens: untouched
    finally:
        runtime.close()


def test_a_reserve_from_the_file_too_big_for_the_window_is_named(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(tmp_path, {"compaction": {"reserveTokens": 90000}})
    with pytest.raises(SystemExit) as exc:
        run(capsys, "plan", str(example), "--context-window", "80000", "--pi-settings", str(path))
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(
        "compaction.reserveTokens (--pi-settings) 90000 must be smaller than "
        "--context-window 80000\n"
    )


def test_branch_summaries_keep_free_what_the_files_branch_summary_says(
    example: Path, tmp_path: Path
) -> None:
    # pi reads branchSummary.reserveTokens for its branch summaries, not compaction's reserve.
    from orchestrator._cli.chat import runtime_settings
    from orchestrator._cli.serve import _options
    from orchestrator._cli.tui import build_runtime

    path = settings_file(
        tmp_path, {"compaction": {"reserveTokens": 1000}, "branchSummary": {"reserveTokens": 777}}
    )
    serve = parser_for("serve").parse_args(["serve", "--pi-settings", str(path)])
    settings = _options(serve).settings
    assert settings is not None
    assert (settings.branch_reserve_tokens, settings.compaction.reserve_tokens) == (777, 1000)
    words = ["worker", "--temporal", "h:1", "--database", "postgresql://x", "--pi-settings"]
    worker = parser_for("worker").parse_args([*words, str(path)])
    assert runtime_settings(with_pi_settings(worker, None)).branch_reserve_tokens == 777
    # Without the option, pi's default.
    plain = parser_for("serve").parse_args(["serve"])
    settings = _options(plain).settings
    assert settings is not None
    assert settings.branch_reserve_tokens == 16384
    for argv, expected in (([], 777), (["--reserve-tokens", "5000"], 5000)):
        tui = parser_for("tui").parse_args(["tui", str(example), "--pi-settings", str(path), *argv])
        runtime = build_runtime(tui)
        try:
            assert runtime.settings.branch_reserve_tokens == expected
        finally:
            runtime.close()


def test_navigate_sizes_the_branch_with_the_files_reserve_unless_given(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The offline summarizer's window is 1,000,000 tokens: a reserve above it leaves no room.
    path = settings_file(tmp_path, {"branchSummary": {"reserveTokens": 2_000_000}})
    before = example.read_bytes()
    move = ["navigate", str(example), "--to", "11a25bfa", "--summarize", "--pi-settings", str(path)]
    code, out, err = run(capsys, *move)
    assert (code, out) == (1, "")
    assert "leaves no room for the branch after the 2000000 tokens kept free" in err
    assert "pi's setting branchSummary.reserveTokens, navigate --reserve-tokens" in err
    assert example.read_bytes() == before
    code, out, err = run(capsys, *move, "--reserve-tokens", "1000", "--json")
    assert code == 0, err
    assert json.loads(out)["summaryEntryId"] is not None


def test_navigate_refuses_a_bad_branch_reserve_before_writing(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_file(tmp_path, {"branchSummary": {"reserveTokens": "x"}})
    before = example.read_bytes()
    code, out, err = run(
        capsys, "navigate", str(example), "--to", "11a25bfa", "--pi-settings", str(path)
    )
    assert (code, out) == (1, "")
    assert err == (
        f"orchestrator navigate: {path}: branchSummary.reserveTokens must be a whole number of "
        'tokens from 0 to 2^53 - 1, not "x"\n'
    )
    assert example.read_bytes() == before


def test_compact_without_a_model_applies_the_session_models_override(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # pi compacts with the session's model: its modelOverrides entry applies, as in plan.
    overrides = {EXAMPLE_MODEL: {"keepRecentTokens": 100}, "other/model": {"keepRecentTokens": 7}}
    path = settings_file(tmp_path, {"compaction": {"modelOverrides": overrides}})
    expected = plan(capsys, str(example), "--keep-recent-tokens", "100")["compaction"]
    assert plan(capsys, str(example), "--pi-settings", str(path))["compaction"] == expected
    code, out, err = run(
        capsys, "compact", str(example), "--dry-run", "--json", "--pi-settings", str(path)
    )
    assert code == 0, err
    assert json.loads(out)["firstKeptEntryId"] == expected["firstKeptEntryId"]


def test_the_model_in_use_is_the_first_model_else_the_sessions(example: Path) -> None:
    from orchestrator._cli.pi_settings import model_in_use

    compact = parser_for("compact")
    with_model = compact.parse_args(["compact", "S", "--model", "a/b", "--pi-settings", "f"])
    assert model_in_use(with_model, "/no/such/file") == "a/b"  # the file is not read
    without_settings = compact.parse_args(["compact", "S"])
    assert model_in_use(without_settings, "/no/such/file") is None  # nor here
    with_settings = compact.parse_args(["compact", "S", "--pi-settings", "f"])
    assert model_in_use(with_settings, str(example)) == EXAMPLE_MODEL
