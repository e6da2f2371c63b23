"""The session workflow replays its recorded histories deterministically (issue 10).

No server is needed: Temporal's replayer runs the workflow code against each history in
``tests/data/temporal/`` (recorded from the simulation scenarios by tests/test_cluster.py,
tests/test_cluster_processes.py, tests/test_cluster_turns.py, tests/test_cluster_navigation.py,
tests/test_cluster_cancel.py and tests/test_cluster_no_wedge.py with ``ORCHESTRATOR_RECORD=1``):
manual, threshold with a candidate switch and a retry, summarizer overflow, every candidate
failing, abort, the workflow cancelled mid-call (Temporal's own cancellation), a worker killed
mid-call, two whole turns: a threshold compaction after a reply (then the D20 continue)
and overflow recovery (compact once, retry), two tree navigations: with a branch summary,
and aborted while summarizing, and a compaction whose planning could not reach the store (the
turn table's ``activity_failed`` row, from tests/test_cluster_no_wedge.py), then one that
commits. A replay that takes a different step than the history recorded
fails, so these also prove that the workflow's decisions come from the tables: a table changed
under a recorded history no longer replays.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the replay tests need the 'cluster' extra")

from temporalio.client import WorkflowHistory  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from orchestrator._cluster import workflow as workflow_module  # noqa: E402
from orchestrator._cluster.worker import workflow_runner  # noqa: E402
from orchestrator._cluster.workflow import SessionWorkflow  # noqa: E402
from orchestrator._lifecycle.load import Row  # noqa: E402
from orchestrator._lifecycle.machine import MachineDef, load_machine  # noqa: E402
from tests.cluster_kit import HISTORIES  # noqa: E402

pytestmark = pytest.mark.anyio
SCENARIOS = sorted(HISTORIES.glob("*.json"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def history(path: Path) -> WorkflowHistory:
    text = path.read_text(encoding="utf-8")
    first = json.loads(text)["events"][0]
    workflow_id = first.get("workflowExecutionStartedEventAttributes", {}).get(
        "workflowId", path.stem
    )
    return WorkflowHistory.from_json(str(workflow_id), text)


def test_every_simulation_scenario_has_a_recorded_history() -> None:
    names = {path.stem for path in SCENARIOS}
    assert {"manual", "candidate_switch", "overflow", "threshold_failed", "abort"} <= names
    assert {"crash", "cancel"} <= names
    assert {"turn_threshold", "turn_overflow"} <= names
    assert {"navigate_summary", "navigate_abort"} <= names
    assert "prepare_unavailable" in names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_a_recorded_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history(path), raise_on_replay_failure=False)
    assert result.replay_failure is None


async def test_a_table_changed_under_a_history_does_not_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Drop the row that asks the model once the hooks are done: the workflow now commits
    # without a model call, which is not what the history recorded.
    table = load_machine("operation")
    rows = tuple(
        r for r in table.rows if not (r.event == "hooks_done" and r.effects == ("call_model",))
    )
    changed = dataclasses.replace(table, rows=rows)

    def tables(name: str) -> MachineDef:
        return changed if name == "operation" else load_machine(name)

    monkeypatch.setattr(workflow_module, "load_machine", tables)
    replayer = Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(
        history(HISTORIES / "manual.json"), raise_on_replay_failure=False
    )
    assert "Nondeterminism" in str(result.replay_failure)


def without(name: str, keep: Callable[[Row], bool]) -> Callable[[str], MachineDef]:
    table = load_machine(name)
    changed = dataclasses.replace(table, rows=tuple(r for r in table.rows if keep(r)))
    return lambda wanted: changed if wanted == name else load_machine(wanted)


@pytest.mark.parametrize(
    ("scenario", "keep"),
    [
        # Without the auto-continue row, a threshold compaction ends the turn.
        (
            "turn_threshold",
            lambda r: not (r.event == "compaction_done" and "auto_continue" in r.guards),
        ),
        # Without the recovery row, an overflow ends the turn uncompacted.
        ("turn_overflow", lambda r: not (r.event == "overflow" and r.dest == "compacting")),
    ],
)
async def test_a_turn_table_changed_under_a_history_does_not_replay(
    monkeypatch: pytest.MonkeyPatch, scenario: str, keep: Callable[[Row], bool]
) -> None:
    monkeypatch.setattr(workflow_module, "load_machine", without("turn", keep))
    replayer = Replayer(workflows=[SessionWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(
        history(HISTORIES / f"{scenario}.json"), raise_on_replay_failure=False
    )
    assert "Nondeterminism" in str(result.replay_failure)
