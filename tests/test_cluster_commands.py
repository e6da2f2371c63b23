"""The cluster's commands refuse what they cannot do, in one line, without a server (issue 10)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestrator._cli.main import main


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_serve_needs_both_temporal_and_database(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "serve", "--temporal", "127.0.0.1:7233")
    assert line.endswith("--temporal and --database go together")


def test_a_cluster_server_opens_no_session_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = usage_error(capsys, "serve", "--temporal", "h:1", "--database", str(tmp_path), "s.jsonl")
    assert line.endswith(
        "with --temporal, sessions live in --database: open them with session.open"
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (("--model", "openai/m"), "--model"),
        (("--remote", "http://127.0.0.1:1/summary", "--timeout", "5"), "--remote, --timeout"),
        (
            ("--keep-recent-tokens", "200", "--short-summary"),
            "--keep-recent-tokens, --short-summary",
        ),
        (("--dir", "."), "--dir"),
        (("--pi-settings", "settings.json"), "--pi-settings"),
    ],
)
def test_a_cluster_server_refuses_the_options_only_one_process_uses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, options: tuple[str, ...], named: str
) -> None:
    # The workers run the turns and compactions: a --model given to serve --temporal did
    # nothing, and session.prompt was then refused with "start the server with --model".
    line = usage_error(capsys, "serve", "--temporal", "h:1", "--database", str(tmp_path), *options)
    assert line.endswith(
        f"with --temporal, {named} would do nothing here: the workers call the models and "
        "compact (give the model options to orchestrator worker), and the sessions live in "
        "--database"
    )


def test_without_the_cluster_extra_the_worker_says_how_to_get_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "temporalio" else real(name, *args),
    )
    # The README's command (it named a package on an index it was never published to), in one
    # line: the arguments were right, so no usage is printed.
    assert main(["worker", "--temporal", "h:1", "--database", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "orchestrator worker: the cluster needs the 'cluster' extra: pip install -e '.[cluster]'\n"
    )


def test_messages_never_show_the_database_password() -> None:
    pytest.importorskip("temporalio", reason="the cluster package needs the 'cluster' extra")
    from orchestrator._cluster.stores import shown

    assert shown("postgresql://me:secret@db:5432/agents") == "postgresql://me@db:5432/agents"
    assert shown("postgresql://db/agents") == "postgresql://db/agents"
    assert shown("/srv/sessions") == "/srv/sessions"


def test_a_worker_with_a_model_runs_turns_with_it_as_serve_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("temporalio", reason="the worker needs the 'cluster' extra")
    from orchestrator._cluster import worker as worker_module
    from orchestrator._cluster.operation.activities import SessionActivities
    from orchestrator._runtime.agent import ChatAgent

    seen: list[SessionActivities] = []

    async def run_worker(address: str, activities: SessionActivities, **kwargs: object) -> None:
        seen.append(activities)

    monkeypatch.setattr(worker_module, "run_worker", run_worker)
    common = ("worker", "--temporal", "h:1", "--database", str(tmp_path))
    assert main([*common, "--model", "openai/chat", "--context-window", "50000"]) == 0
    assert main(list(common)) == 0
    with_model, without = (a.turns for a in seen)
    assert with_model.agent_factory is not None
    agent = with_model.agent_factory()
    assert isinstance(agent, ChatAgent)
    assert agent.model.name == "openai/chat"
    assert with_model.settings.context_window == 50000
    assert without.agent_factory is None


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_worker_waits_for_one_stop_signal_and_leaves_the_next_to_the_default(stop: str) -> None:
    """The first signal shuts the worker down cleanly; a second ends it as the default would."""
    import asyncio
    import os
    import signal

    pytest.importorskip("temporalio", reason="the worker needs the 'cluster' extra")
    from orchestrator._cluster.worker import _stop_signal
    from orchestrator._process.signals import STOP_SIGNALS

    number = getattr(signal, stop)

    defaults = {signal.SIGINT: signal.default_int_handler}

    async def stopped() -> None:
        waiting = asyncio.ensure_future(_stop_signal())
        await asyncio.sleep(0)  # the handlers are in place
        assert signal.getsignal(number) not in (signal.SIG_DFL, signal.default_int_handler)
        os.kill(os.getpid(), number)
        await asyncio.wait_for(waiting, timeout=60)  # a guard against a hang, not a measure
        # Still in the loop, which would put every default back as it closes.
        for each in STOP_SIGNALS:
            assert signal.getsignal(each) == defaults.get(each, signal.SIG_DFL)

    asyncio.run(stopped())


def test_a_worker_started_ignoring_a_stop_signal_keeps_ignoring_it() -> None:
    """``nohup`` ignores SIGHUP so that the worker outlives its terminal: it must stay so."""
    import asyncio
    import os
    import signal

    pytest.importorskip("temporalio", reason="the worker needs the 'cluster' extra")
    from orchestrator._cluster.worker import _stop_signal

    async def stopped() -> None:
        waiting = asyncio.ensure_future(_stop_signal())
        await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing happens
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(waiting, timeout=60)  # a guard against a hang, not a measure

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        asyncio.run(stopped())
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_the_command_line_exits_without_finalizing_once_the_temporal_runtime_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK runtime's log thread deadlocked the interpreter's finalization now and then
    (``serve --temporal`` hung after "stopped"): a process that started it exits at once,
    after its exit functions."""
    import atexit
    import functools
    import os

    pytest.importorskip("temporalio", reason="the cluster commands need the 'cluster' extra")
    from orchestrator._cli import main as cli
    from orchestrator._cluster import client

    done: list[object] = []

    class Exited(Exception):
        pass

    def fake_exit(code: int) -> None:
        done.append(("os._exit", code))
        raise Exited

    monkeypatch.setattr(cli, "main", lambda: 3)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: done.append("exit functions"))
    monkeypatch.setattr(os, "_exit", fake_exit)

    @functools.cache
    def runtime() -> object:
        return object()

    monkeypatch.setattr(client, "_runtime", runtime)
    with pytest.raises(SystemExit) as exited:  # no runtime started: the usual exit
        cli.run()
    assert exited.value.code == 3
    assert done == []
    runtime()
    with pytest.raises(Exited):
        cli.run()
    assert done == ["exit functions", ("os._exit", 3)]
