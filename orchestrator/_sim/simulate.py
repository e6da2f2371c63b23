"""Run a simulation scenario against the real runtime and record its trace.

Everything is real except the agent, the summarizer routes and time: the session file, the
journal, the machines, the hooks and the OpenTelemetry spans are the production ones. Ids and
clocks are counters, so a rerun produces the same transitions (``tests/test_simulations.py``
checks the recordings in ``traces/``). A ``[crash]`` scenario runs its actions in a child
process that kills itself with SIGKILL at the named transition; the parent then reopens the
session, which settles the half-done operation without calling any model (D24).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from orchestrator._core.errors import (
    Cancelled,
    ModelError,
    OrchestratorError,
    error_name,
    model_error,
)
from orchestrator._core.model import ModelResponse
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.events import Event
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._sim.scenario import Scenario, load_scenario
from orchestrator._telemetry.export import make_tracer_provider
from orchestrator._telemetry.tracing import LifecycleTracer
from orchestrator.testing import FakeClock, Hang, ScriptedModel
from orchestrator.testing._agent import (
    AgentHang,
    ScriptedAgent,
    error_reply,
    reply,
    tool_result,
)

START_MS = 1_767_225_600_000


@dataclass(slots=True)
class Report:
    """What a simulation did.

    Attributes:
        events: Runtime events, except transitions and messages, as JSON.
        outcomes: One line per action.
        entries: Entry types of the final session, in file order.
        trace: Where the trace was written.
        crashed: The child process was killed as planned.
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    trace: str = ""
    crashed: bool = False


def _agent(scenario: Scenario) -> ScriptedAgent:
    turns = []
    for steps in scenario.turns:
        turn: list[Any] = []
        for step in steps:
            if step.get("hang"):
                turn.append(AgentHang())
            elif "error" in step:
                turn.append(error_reply(str(step["error"])))
            elif "tool_result" in step:
                text = str(step.get("text", "")) or "z" * int(step.get("size", 100))
                turn.append(
                    tool_result(str(step["tool_result"]), text, tool=str(step.get("tool", "read")))
                )
            else:
                calls = [(str(c[0]), str(c[1]), dict(c[2])) for c in step.get("calls", ())]
                turn.append(
                    reply(
                        str(step.get("reply", "")),
                        tokens=int(step.get("tokens", 0)),
                        stop=str(step.get("stop", "stop")),
                        calls=calls,
                    )
                )
        turns.append(turn)
    return ScriptedAgent(turns)


def _answer(item: dict[str, Any]) -> Any:
    if item.get("hang"):
        return Hang()
    if "error" in item:
        retry_after = item.get("retry_after")
        return model_error(
            str(item.get("kind", "fatal")),
            str(item["error"]),
            retry_after=float(retry_after) if retry_after is not None else None,
        )
    return ModelResponse(
        text=str(item.get("text", "")),
        stop_reason=str(item.get("stop", "stop")),
        model="scripted",
        provider="simulation",
    )


def _summarizer(scenario: Scenario, clock: FakeClock) -> tuple[SummaryRoutes, list[ScriptedModel]]:
    names = scenario.settings.get("candidates") or list(scenario.summarizer) or ["primary"]
    models = [
        ScriptedModel(
            [_answer(i) for i in scenario.summarizer.get(n, ())], name=f"scripted/{n}", clock=clock
        )
        for n in names
    ]
    summarizer = SummaryRoutes(
        candidates=tuple(models),
        reserve_tokens=int(scenario.settings.get("reserve_tokens", 1000)),
        retry=RetryPolicy(
            max_retries=int(scenario.settings.get("max_retries", 3)),
            base_delay_ms=int(scenario.settings.get("base_delay_ms", 2000)),
        ),
        sleep=clock.sleep,
    )
    return summarizer, models


def _settings(scenario: Scenario) -> RuntimeSettings:
    s = scenario.settings
    return RuntimeSettings(
        context_window=int(s.get("context_window", 10_000)),
        compaction=CompactionSettings(
            reserve_tokens=int(s.get("reserve_tokens", 1000)),
            keep_recent_tokens=int(s.get("keep_recent_tokens", 300)),
            adaptive_keep=bool(s.get("adaptive_keep", False)),
            auto_continue=bool(s.get("auto_continue", True)),
        ),
        retry=RetryPolicy(
            max_retries=int(s.get("max_retries", 3)),
            base_delay_ms=int(s.get("base_delay_ms", 2000)),
        ),
        prune=bool(s.get("prune", True)),
    )


def _hooks(scenario: Scenario) -> Hooks:
    hooks = Hooks()
    for name, behaviour in scenario.hooks.items():
        hooks.on(name, _hook(behaviour))
    return hooks


def _hook(behaviour: str) -> Callable[[dict[str, Any]], Any]:
    def handler(payload: dict[str, Any]) -> Any:
        if behaviour == "cancel":
            return {"cancel": True}
        if behaviour == "throw":
            raise RuntimeError("hook failure (simulated)")
        preparation = payload.get("preparation") or {}
        return {
            "compaction": {
                "summary": "Summary supplied by a hook.",
                "firstKeptEntryId": preparation.get("firstKeptEntryId"),
                "tokensBefore": preparation.get("tokensBefore", 0),
            },
            "summary": {"summary": "Branch summary supplied by a hook."},
        }

    return handler


class Simulation:
    """One run of a scenario in a working folder."""

    def __init__(self, scenario: Scenario, workdir: Path, trace: Path) -> None:
        self.scenario = scenario
        self.path = workdir / "session.jsonl"
        self.trace = trace
        self.report = Report(trace=str(trace))
        self.clock = FakeClock()
        self._ms = itertools.count(START_MS, 1000)
        self._ids = itertools.count(1)
        self._ops = itertools.count(1)
        self.provider = make_tracer_provider(
            "jsonl", trace.parent, file_name=trace.name, shutdown_on_exit=False
        )
        self.models: list[ScriptedModel] = []
        self._kind = ""
        self.runtime = self._open()

    def _open(self) -> AgentSession:
        summarizer, self.models = _summarizer(self.scenario, self.clock)
        runtime = AgentSession.open(
            self.path,
            random_hex=lambda: f"{next(self._ids):08x}" + "0" * 24,
            agent=_agent(self.scenario) if not hasattr(self, "runtime") else self.runtime.agent,
            summarizer=summarizer,
            settings=_settings(self.scenario),
            hooks=_hooks(self.scenario),
            tracer=LifecycleTracer(self.provider),
            sleep=self.clock.sleep,
            clock_ms=lambda: next(self._ms),
            operation_ids=lambda: f"op{next(self._ops):04d}",
        )
        runtime.events.subscribe(self._event)
        self._crash_after_commit(runtime)
        for settled in runtime.settlements:
            self.report.outcomes.append(
                f"settled {settled.operation_id} ({settled.kind}): "
                f"{settled.source} -> {settled.dest}"
            )
        return runtime

    def _event(self, event: Event) -> None:
        if event.type not in ("transition", "message"):
            self.report.events.append(event.as_json())
        crash = self.scenario.crash
        if not crash or os.environ.get(_CHILD) != "1":
            return
        if event.type == "compaction_update" and event.payload["status"] == "in_progress":
            self._kind = str(event.payload["kind"])
        if event.type == "transition" and "after" not in crash:
            p = event.payload
            if (
                p["machine"] == crash["machine"]
                and p["dest"] == crash["to"]
                and crash.get("event", p["event"]) == p["event"]
                and crash.get("kind", self._kind) == self._kind
            ):
                os.kill(os.getpid(), signal.SIGKILL)

    def _crash_after_commit(self, runtime: AgentSession) -> None:
        # ``after = "commit"``: die once the commit is written but before the operation records
        # ``entry_appended``; the reopened session must then find the commit and settle it
        # ``committed``. The commit is a flush (compaction, branch summary) or a rewrite (prune).
        crash = self.scenario.crash
        if not crash or crash.get("after") != "commit" or os.environ.get(_CHILD) != "1":
            return
        session = runtime.session
        flush, replace = session.flush, session.replace_entries

        def die_if_committing() -> None:
            if (
                self._kind == crash.get("kind", self._kind)
                and runtime.current_operation is not None
                and runtime.current_operation.state == "committing"
            ):
                os.kill(os.getpid(), signal.SIGKILL)

        def flush_then_die() -> None:
            flush()
            die_if_committing()

        def replace_then_die(entries: Any, **options: Any) -> None:
            replace(entries, **options)
            die_if_committing()

        session.flush = flush_then_die  # type: ignore[method-assign]
        session.replace_entries = replace_then_die  # type: ignore[method-assign,assignment]

    async def run(self) -> Report:
        for action in self.scenario.actions:
            await self._act(action)
        self.report.entries = [
            e["type"] if e["type"] != "message" else f"message:{e['message'].get('role')}"
            for e in self.runtime.session.tree.entries
        ]
        self.runtime.close()
        self.provider.shutdown()
        return self.report

    async def _act(self, action: dict[str, Any]) -> None:
        kind = action["do"]
        if kind == "reopen":
            self.runtime.close()
            self.runtime = self._open()
            self.report.outcomes.append("reopen")
            return
        requests = sum(len(m.requests) for m in self.models)
        async with anyio.create_task_group() as group:
            group.start_soon(self._perform, kind, action)
            if "abort" in action:
                await self._abort(action["abort"], requests)

    async def _abort(self, phase: str, requests: int) -> None:
        runtime = self.runtime

        def ready() -> bool:
            calls = sum(len(m.requests) for m in self.models)
            return {
                "agent": runtime.state == "running",
                "retry_wait": runtime.state == "retrying",
                "compaction": runtime.state in ("compacting", "manual_compacting")
                and calls > requests,
                "branch_summary": runtime.branch_operation is not None and calls > requests,
            }[phase]

        for _ in range(100_000):
            if ready():
                break
            await anyio.lowlevel.checkpoint()
        else:
            raise OrchestratorError(f"{self.scenario.source}: never reached {phase} to abort it")
        if phase == "branch_summary":
            runtime.abort_branch_summary()
        elif phase == "compaction":
            runtime.abort_compaction()
        else:
            runtime.abort()

    async def _perform(self, kind: str, action: dict[str, Any]) -> None:
        runtime = self.runtime
        try:
            if kind == "prompt":
                text = str(action.get("text", "")) or "x" * int(action.get("size", 100))
                result = await runtime.prompt(text)
                self.report.outcomes.append(f"prompt: {result.state}")
            elif kind == "compact":
                outcome = await runtime.compact(action.get("focus"))
                self.report.outcomes.append(f"compact: {outcome.status} {outcome.reason or ''}")
            else:
                target = self._target(str(action["target"]))
                nav = await runtime.navigate(
                    target,
                    summarize=bool(action.get("summarize")),
                    instructions=action.get("focus"),
                )
                self.report.outcomes.append(
                    f"navigate: {'cancelled' if nav.cancelled else 'done'}"
                    f"{' with summary' if nav.summary_entry else ''}"
                )
        except (Cancelled, ModelError) as error:
            self.report.outcomes.append(f"{kind}: {error_name(error)}: {error}")

    def _target(self, spec: str) -> str:
        kind, _, number = spec.partition(":")
        entries = self.runtime.session.tree.entries
        if kind == "user":
            entries = [e for e in entries if e.get("message", {}).get("role") == "user"]
        return str(entries[int(number) - 1]["id"])


_CHILD = "ORCHESTRATOR_SIMULATION_CHILD"


async def _run(scenario: Scenario, workdir: Path, trace: Path) -> Report:
    return await Simulation(scenario, workdir, trace).run()


def simulate(
    path: str | Path, trace: str | Path | None = None, *, workdir: str | Path | None = None
) -> Report:
    """Run the scenario file at ``path``; write its trace to ``trace`` (a ``.jsonl`` file).

    Args:
        path: The scenario file.
        trace: Where to write the trace (default: a temporary file).
        workdir: Where the session file and its journal live (default: a temporary folder,
            removed afterwards).

    Returns:
        The report. For a ``[crash]`` scenario, the child is killed at the named transition and
        the session is then reopened (and settled) here.

    Raises:
        DefinitionError: the scenario file is malformed.
        OrchestratorError: a crash scenario's child was not killed where planned.
    """
    scenario = load_scenario(path)
    target = Path(trace) if trace else Path(tempfile.mkdtemp()) / f"{scenario.name}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        return _simulate_in(scenario, Path(path), Path(workdir), target)
    with tempfile.TemporaryDirectory() as tmp:
        return _simulate_in(scenario, Path(path), Path(tmp), target)


def _simulate_in(scenario: Scenario, path: Path, workdir: Path, target: Path) -> Report:
    if scenario.crash is None:
        return anyio.run(_run, scenario, workdir, target)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from orchestrator._sim.simulate import _child; _child(sys.argv[1:])",
            str(path),
            str(workdir),
            str(target),
        ],
        env={**os.environ, _CHILD: "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != -signal.SIGKILL:
        raise OrchestratorError(
            f"{path}: the child should have been killed at the crash point, but exited "
            f"with {child.returncode}: {child.stderr.strip()[-500:]}"
        )
    report = anyio.run(_run, replace_actions(scenario, [{"do": "reopen"}]), workdir, target)
    report.crashed = True
    return report


def replace_actions(scenario: Scenario, actions: list[dict[str, Any]]) -> Scenario:
    """The same scenario with other actions (the crash parent only reopens)."""
    import dataclasses

    return dataclasses.replace(scenario, actions=tuple(actions), crash=None)


def _child(argv: list[str]) -> None:  # pragma: no cover - runs in the killed child
    scenario_path, workdir, trace = argv
    anyio.run(_run, load_scenario(scenario_path), Path(workdir), Path(trace))
