"""The machines and simulate commands, and the event bus's async stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator._lifecycle.machine import load_machine
from orchestrator._lifecycle.render import render_mermaid, render_table
from orchestrator._runtime.events import EventBus
from tests.cli_kit import run


def test_machines_renders_one_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "machines", "turn", "--mermaid")
    assert (code, out) == (0, render_mermaid(load_machine("turn")))
    code, out, _ = run(capsys, "machines", "navigation", "--table")
    assert (code, out) == (0, render_table(load_machine("navigation")))
    code, out, _ = run(capsys, "machines")
    assert code == 0
    assert out.count("stateDiagram-v2") == 4
    assert "### `operation`" in out
    assert "### `session`" in out
    assert "refuse_second_compaction" in out
    code, out, _ = run(capsys, "machines", "session", "--table")
    assert (code, out) == (0, render_table(load_machine("session")))


def test_unknown_machine_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(capsys, "machines", "teleport")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    assert err.strip().endswith(
        "error: unknown machine 'teleport'; known: navigation, operation, session, turn"
    )


def test_simulate_a_shipped_scenario_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "overflow.jsonl"
    code, out, err = run(capsys, "simulate", "overflow", "--out", str(out_file))
    assert code == 0, err
    assert "event auto_compaction_start {'reason': 'overflow'}" in out
    assert f"-- trace written to {out_file}" in out
    assert out_file.stat().st_size > 0
    code, out, _ = run(capsys, "simulate", "crash", "--out", str(tmp_path / "c.jsonl"), "--json")
    report = json.loads(out)
    assert report["crashed"] is True
    assert report["outcomes"][0].endswith("committing -> failed")


def test_simulate_without_out_keeps_no_trace_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = Path(__file__).resolve().parent.parent / "traces"
    recorded = {p: p.read_bytes() for p in traces.glob("*.jsonl")}
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "simulate", "threshold")
    assert code == 0, err
    assert out.rstrip().endswith("-- trace not kept (pass --out FILE to write it)")
    assert list(tmp_path.iterdir()) == []
    assert {p: p.read_bytes() for p in traces.glob("*.jsonl")} == recorded
    code, out, _ = run(capsys, "simulate", "threshold", "--json")
    assert json.loads(out)["trace"] is None


def test_simulate_help_lists_the_shipped_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(capsys, "simulate", "--help")
    out = " ".join(capsys.readouterr().out.split())
    assert "shipped scenarios: abort-retry-wait, abort-summary," in out
    assert "threshold" in out.split("shipped scenarios:")[1]


def test_simulate_unknown_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", "no-such-scenario")
    assert code == 1
    assert "no such scenario file or shipped scenario" in err


def test_simulate_never_overwrites_with_its_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --out once replaced whatever was there (a session file too) with the trace's spans.
    session = tmp_path / "v.jsonl"
    session.write_bytes(b'{"type":"session","version":3,"id":"x"}\n')
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "nowhere")
    for target, complaint in [
        (session, f"{session}: already exists; choose another --out"),
        (dangling, f"{dangling}: already exists; choose another --out"),
        (
            tmp_path / "nodir" / "t.jsonl",
            f"{tmp_path / 'nodir' / 't.jsonl'}: the folder {tmp_path / 'nodir'} does not exist",
        ),
    ]:
        code, out, err = run(capsys, "simulate", "threshold", "--out", str(target))
        assert code == 1
        assert complaint in err
        assert out == ""
    assert session.read_bytes() == b'{"type":"session","version":3,"id":"x"}\n'
    assert not (tmp_path / "nodir").exists()
    assert not (tmp_path / "nowhere").exists()


def test_simulate_names_what_is_wrong_with_the_scenario_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "g.toml"
    binary.write_bytes(b"name = '\xff\xfe'\n")
    code, _, err = run(capsys, "simulate", str(binary))
    assert code == 1
    assert "cannot read scenario: not UTF-8 text" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "simulate", str(tmp_path))
    assert code == 1
    assert f"{tmp_path}: not a regular file" in err


@pytest.mark.anyio
async def test_event_stream_delivers_what_is_emitted_while_open() -> None:
    bus = EventBus()
    seen: list[str] = []
    unsubscribe = bus.subscribe(lambda e: seen.append(e.type))
    bus.emit("before")
    async with bus.stream() as events:
        bus.emit("one", n=1)
        bus.emit("two", n=2)
        received = [await events.__anext__(), await events.__anext__()]
    bus.emit("after")
    unsubscribe()
    bus.emit("unheard")
    assert [e.as_json() for e in received] == [{"type": "one", "n": 1}, {"type": "two", "n": 2}]
    assert seen == ["before", "one", "two", "after"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
