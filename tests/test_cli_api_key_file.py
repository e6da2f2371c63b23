"""``--api-key-file`` on every command that takes ``--api-key`` (D30): a key on the command line
is visible to every local user in the process list, a key in a file of ours is not."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from orchestrator._cli.common import API_KEY_VISIBLE, add_model_arguments, api_key_of
from orchestrator._cli.main import main
from orchestrator._cli.tui import build_runtime
from orchestrator._store.session import Session
from orchestrator.testing import LocalProvider, Reply
from tests.cli_kit import either_part, model_args, run


def key_file(tmp_path: Path, text: str = "sk-from-file\n", mode: int = 0o600) -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_compact_sends_the_key_read_from_the_file(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = key_file(tmp_path)
    replies = (
        Reply.summary(either_part("History.")),
        Reply.summary(either_part("Prefix.")),
    )
    with LocalProvider(replies) as provider:
        code, out, err = run(
            capsys,
            "compact",
            str(example),
            *model_args(provider.url, None),
            "--api-key-file",
            str(key),
        )
        requests = provider.requests
    assert code == 0, err
    assert err == ""  # a key from a file needs no warning
    assert {r.headers["authorization"] for r in requests} == {"Bearer sk-from-file"}
    assert Session.open(example).tree.entries[-1]["type"] == "compaction"


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path, 0o600)  # opening it for reading would wait for a writer: never
    return path


@pytest.mark.parametrize("command", ["compact", "navigate"])
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: key_file(p, mode=0o640), "other users may read or change it (mode 0640)"),
        (lambda p: key_file(p, mode=0o604), "other users may read or change it (mode 0604)"),
        (lambda p: key_file(p, text="  \n"), "empty"),
        (lambda p: p / "missing", "No such file or directory"),
        (lambda p: p, "not a regular file"),
        (fifo, "not a regular file"),
    ],
    ids=["group-readable", "world-readable", "empty", "missing", "folder", "named-pipe"],
)
def test_a_key_file_that_cannot_be_trusted_is_refused_before_anything_happens(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    make: object,
    says: str,
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    before = example.read_bytes()
    where = ["--to", "36fbeee7", "--summarize"] if command == "navigate" else []
    code, out, err = run(
        capsys, command, str(example), *where, "--model", "openai/x", "--api-key-file", str(path)
    )
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith(f"orchestrator {command}: API key file {path}: ")
    assert says in err
    assert example.read_bytes() == before
    assert not Path(f"{example}.journal").exists()  # refused before the session was opened


def test_a_symbolic_link_to_a_key_file_is_refused(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "link"
    link.symlink_to(key_file(tmp_path))
    code, out, err = run(capsys, "compact", str(example), "--api-key-file", str(link))
    assert code == 1
    # It said "Too many levels of symbolic links" (O_NOFOLLOW's error).
    assert err == (
        f"orchestrator compact: API key file {link}: is a symbolic link; refused "
        "(name the file itself)\n"
    )


@pytest.mark.parametrize("command", ["compact", "navigate", "tui", "worker", "serve"])
def test_every_command_with_api_key_takes_a_key_file_but_not_both(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "--api-key-file FILE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([command, "s.jsonl", "--api-key", "k", "--api-key-file", "f"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_tui_builds_its_routes_with_the_key_from_the_file(
    example: Path, tmp_path: Path
) -> None:
    parser = argparse.ArgumentParser()
    main_args = ["tui", str(example), "--model", "openai/x", "--chat"]
    from orchestrator._cli.tui import register

    register(parser.add_subparsers())
    args = parser.parse_args([*main_args, "--api-key-file", str(key_file(tmp_path))])
    runtime = build_runtime(args)
    try:
        assert runtime.agent is not None
        assert runtime.agent.model._api_key == "sk-from-file"  # type: ignore[attr-defined]
    finally:
        runtime.close()


def test_the_flag_still_works_and_no_file_means_the_providers_variable() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert api_key_of(parser.parse_args(["--api-key", "sk-flag"])) == "sk-flag"
    assert api_key_of(parser.parse_args([])) is None
    assert "process list" in API_KEY_VISIBLE


def test_the_long_running_worker_warns_about_a_key_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import orchestrator._cluster.worker as worker_module

    async def no_worker(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(worker_module, "run_worker", no_worker)
    code = main(
        [
            "worker",
            "--temporal",
            "127.0.0.1:1",
            "--database",
            os.fspath(tmp_path),  # a directory store: the worker checks it exists
            "--api-key",
            "sk-visible",
        ]
    )
    assert code == 0
    assert f"orchestrator worker: {API_KEY_VISIBLE}" in capsys.readouterr().err


def test_the_tui_warns_about_a_key_on_the_command_line(
    example: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator._tui.app import TreeApp

    monkeypatch.setattr(TreeApp, "run", lambda self: None)  # no terminal in a test
    monkeypatch.setattr("orchestrator._cli.tui.has_terminal", lambda: True)
    assert main(["tui", str(example), "--api-key", "sk-visible"]) == 0
    assert capsys.readouterr().err == f"orchestrator tui: {API_KEY_VISIBLE}\n"
