"""What a new user trips over on the command line: usage errors, help, version, error wording."""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import pytest

from orchestrator._cli.common import UsageError
from orchestrator._cli.main import _build_parser, main
from orchestrator._core.errors import SessionError
from tests.cli_kit import EXAMPLE, run


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_unknown_flag_shows_the_subcommand_usage(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(capsys, "plan", str(example), "--bogus")
    assert err.startswith("usage: orchestrator plan ")
    assert err.rstrip().endswith("orchestrator plan: error: unrecognized arguments: --bogus")


def test_unknown_flag_before_the_command_shows_the_top_level_usage(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(capsys, "--bogus", "plan", str(example))
    assert err.startswith("usage: orchestrator [-h]")
    assert err.rstrip().endswith("orchestrator: error: unrecognized arguments: --bogus")


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "S", "--context-window", "-16389"),
        ("plan", "S", "--context-window", "0"),
        ("plan", "S", "--keep-recent-tokens", "0"),
        ("plan", "S", "--reserve-tokens", "-1"),
        ("plan", "S", "--from", "a", "--to", "b", "--budget", "0"),
        ("compact", "S", "--keep-recent-tokens", "-5"),
        ("compact", "S", "--context-window", "0"),
        ("navigate", "S", "--to", "x", "--reserve-tokens", "0"),
        ("tui", "S", "--context-window", "-1"),
        ("serve", "--keep-recent-tokens", "0"),
    ],
)
def test_token_counts_must_be_positive(
    argv: tuple[str, ...], example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = example.read_bytes()
    args = [str(example) if a == "S" else a for a in argv]
    err = _usage_error(capsys, *args)
    assert f"usage: orchestrator {argv[0]} " in err
    assert "is not a positive number of tokens" in err
    assert example.read_bytes() == before


def test_a_reserve_that_fills_the_window_is_a_usage_error(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(capsys, "plan", str(example), "--context-window", "5")
    assert "--reserve-tokens 16384 must be smaller than --context-window 5" in err
    # compact's --context-window is the summarizer's: a small one is clamped or refused there
    # (tests/test_cli_request_sizing.py), not a usage error.


def test_from_without_to_is_a_usage_error(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(capsys, "plan", str(example), "--from", "x")
    assert "--from and --to go together" in err


def test_context_of_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "context", str(tmp_path))
    assert code == 1
    assert err.strip() == f"orchestrator context: {tmp_path}: is a directory, not a session file"


def test_journal_of_a_missing_session_names_the_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    code, _, err = run(capsys, "journal", str(missing))
    assert code == 1
    assert err.strip() == f"orchestrator journal: {missing}: no such session file"


def test_journal_of_an_unjournaled_session_says_there_is_none(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "journal", str(example))
    assert (code, err) == (0, "")
    assert out == f"-- no journal at {example}.journal: nothing was journaled\n"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"orchestrator {version('session-orchestrator')}"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def test_every_option_of_every_command_has_help() -> None:
    # `orchestrator COMMAND --help` describes every option (README); compact had no help for
    # --keep-recent-tokens, --no-adaptive-keep and --reserve-tokens, tree, check and fork none
    # for --json. The parser with no argument registers every command.
    parser = _build_parser()
    commands = _subparsers(parser)
    assert set(commands) >= {"context", "plan", "tree", "check", "compact", "navigate", "fork"}
    missing = [
        (name, action.option_strings or action.dest)
        for name, command in [("orchestrator", parser), *commands.items()]
        for action in command._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []


@pytest.mark.parametrize(
    "url", ["", "notaurl", "ftp://x/y", "http://", "https:///path", "http://[x"]
)
@pytest.mark.parametrize("command", [("compact", "S", "--dry-run"), ("navigate", "S", "--to", "x")])
def test_remote_must_be_an_http_url_with_a_host(
    url: str, command: tuple[str, ...], example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty --remote fell back to the offline summarizer and wrote; the others failed later
    # with the bare value as the whole message ("orchestrator compact: notaurl").
    before = example.read_bytes()
    args = [str(example) if a == "S" else a for a in command]
    err = _usage_error(capsys, *args, "--remote", url)
    assert f"usage: orchestrator {command[0]} " in err
    assert err.rstrip().endswith(
        f"error: argument --remote: {url!r} is not an http:// or https:// URL with a host"
    )
    assert example.read_bytes() == before


def test_serve_refuses_a_remote_that_is_not_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, "serve", "--remote", "notaurl")
    assert "argument --remote: 'notaurl' is not an http:// or https:// URL" in err


def test_a_provider_error_of_two_lines_is_printed_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # litellm's "LLM Provider NOT provided" message spans two lines.
    session = tmp_path / "s.jsonl"
    session.write_bytes(EXAMPLE.read_bytes())
    code, out, err = run(capsys, "compact", str(session), "--model", "bogusprovider/foo")
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("orchestrator compact: ")
    assert "bogusprovider/foo; " in err
    assert session.read_bytes() == EXAMPLE.read_bytes()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (SessionError("first line\n  second line\n\n"), 1),
        (OSError(28, "No space\nleft"), 1),
    ],
)
def test_every_error_is_one_line(
    error: Exception,
    code: int,
    example: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(args: object) -> int:
        raise error

    monkeypatch.setattr("orchestrator._cli.inspect._context", fail)
    got, _, err = run(capsys, "context", str(example))
    assert got == code
    assert err.count("\n") == 1
    assert err.startswith("orchestrator context: ")


def test_a_usage_error_of_two_lines_is_one_line(
    example: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(args: object) -> int:
        raise UsageError("first\nsecond")

    monkeypatch.setattr("orchestrator._cli.inspect._context", fail)
    err = _usage_error(capsys, "context", str(example))
    assert err.rstrip().endswith("orchestrator context: error: first; second")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("plan", "S", "--budget", "100"), "--budget needs --from and --to"),
        (
            ("plan", "S", "--from", "a", "--to", "b", "--context-window", "80000"),
            "--context-window is for a compaction plan, without --from and --to",
        ),
        (
            ("plan", "S", "--from", "a", "--to", "b", "--keep-recent-tokens", "5"),
            "--keep-recent-tokens is for a compaction plan",
        ),
        (
            ("plan", "S", "--from", "a", "--to", "b", "--no-adaptive-keep", "--leaf", "x"),
            "--leaf and --no-adaptive-keep are for a compaction plan",
        ),
        (
            ("plan", "S", "--from", "a", "--to", "b", "--reserve-tokens", "5"),
            "--reserve-tokens is for a compaction plan",
        ),
        (
            ("navigate", "S", "--to", "x", "--short-summary"),
            "--short-summary needs --summarize",
        ),
    ],
)
def test_an_option_that_needs_another_is_a_usage_error(
    argv: tuple[str, ...], message: str, example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was silently ignored, as --focus without --summarize no longer is.
    before = example.read_bytes()
    err = _usage_error(capsys, *[str(example) if a == "S" else a for a in argv])
    assert err.startswith(f"usage: orchestrator {argv[0]} ")
    assert message in err.splitlines()[-1]
    assert example.read_bytes() == before


def test_plan_defaults_are_the_compaction_defaults(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", str(example), "--json")
    assert code == 0
    assert json.loads(out)["keepRecentTokens"] == 20000
    err = _usage_error(capsys, "plan", str(example), "--context-window", "16384")
    assert "--reserve-tokens 16384 must be smaller than --context-window 16384" in err


def test_a_symbolic_link_loop_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "no such session file".
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to("nowhere.jsonl")
    for command in ("context", "compact"):
        code, _, err = run(capsys, command, str(tmp_path / "a.jsonl"))
        assert code == 1
        assert err == (
            f"orchestrator {command}: {tmp_path / 'a.jsonl'}: symbolic link loop "
            "(following its links never reaches a file)\n"
        )
        code, _, err = run(capsys, command, str(tmp_path / "dangling.jsonl"))
        assert code == 1
        assert err == (
            f"orchestrator {command}: {tmp_path / 'dangling.jsonl'}: symbolic link to "
            "nowhere.jsonl, which does not exist\n"
        )


def test_fork_with_an_empty_out_is_a_usage_error_not_the_default_name(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(example.parent.iterdir())
    err = _usage_error(capsys, "fork", str(example), "--from", "ec48c90d", "--out", "")
    assert "--out: an empty path names no file; leave it out for a default name" in err
    assert sorted(example.parent.iterdir()) == before  # no fork written beside the source


def test_a_session_name_ending_in_a_slash_names_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Path("s.jsonl/") is Path("s.jsonl"): the tree of s.jsonl was printed, and a fork written
    # to f.jsonl.
    session = tmp_path / "s.jsonl"
    session.write_bytes(EXAMPLE.read_bytes())
    folder = "a name ending in '/' names a folder, not a session file"
    code, out, err = run(capsys, "tree", f"{session}/")
    assert (code, out) == (1, "")
    assert err.strip() == f"orchestrator tree: {session}/: {folder}"
    code, out, err = run(
        capsys, "fork", str(session), "--from", "daa66d13", "--out", f"{session}.f/"
    )
    assert (code, out) == (1, "")
    assert err.strip() == f"orchestrator fork: {session}.f/: {folder}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
