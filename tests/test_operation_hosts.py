"""The operation machine's two hosts bind the same effects, every one the table names (issue 34).

:class:`~orchestrator._runtime.operation.run.OperationRun` (one process) and
:class:`~orchestrator._cluster.operation.flow.OperationFlow` (the Temporal workflow) perform the I/O
effects; the shared :class:`~orchestrator._runtime.operation.driver.OperationDriver` performs the
rest. A row naming an effect one host lacks would fail on that host only, at run time.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("temporalio", reason="the cluster host needs the 'cluster' extra")

from orchestrator._cluster.calls import Op  # noqa: E402
from orchestrator._cluster.operation.flow import OperationFlow  # noqa: E402
from orchestrator._core.errors import ConflictError  # noqa: E402
from orchestrator._lifecycle.machine import load_machine  # noqa: E402
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.driver import Report  # noqa: E402
from orchestrator._runtime.operation.driver import (  # noqa: E402
    HOST_EFFECTS,
    OperationDriver,
    commit_failure,
)
from orchestrator._runtime.operation.run import OperationRun  # noqa: E402
from orchestrator._runtime.operation.summarize import SummaryRoutes  # noqa: E402
from orchestrator._runtime.ports import Ports  # noqa: E402


def table_effects() -> set[str]:
    return {name for row in load_machine("operation").rows for name in row.effects}


def test_the_hosts_perform_the_io_effects_and_the_one_driver_the_rest() -> None:
    named = table_effects()
    flow = OperationFlow(load_machine("operation"), Op(session_id="s", operation_id="op"))
    job = SimpleNamespace(kind="prune", reason="prune", parts=())  # a job's planned side
    routes = SummaryRoutes(candidates=())
    run = OperationRun(Ports(session=None, routes=routes), job, routes=routes)
    assert set(flow.effects) == named
    assert set(run.effects) == named
    # The hosts perform the I/O; everything else is the one driver's.
    assert set(OperationDriver(kind="compaction", reason="manual").effects(run.effects)) == named
    assert named - HOST_EFFECTS == {
        "next_candidate",
        "next_part",
        "shrink_request",
        "ask_again",
        "use_fallback",
        "check_summary",
        "check_hook_summary",
    }


def test_a_host_missing_an_io_effect_is_refused() -> None:
    driver = OperationDriver(kind="compaction", reason="manual")
    with pytest.raises(TypeError, match="the host performs no call_model"):
        driver.effects({name: driver.check_summary for name in HOST_EFFECTS - {"call_model"}})


def test_a_conflict_reports_the_commit_after_a_cured_failure() -> None:
    # The drift of issue 34, at the driver: one place words the ending for both hosts.
    driver = OperationDriver(kind="compaction", reason="threshold", routes=[1])
    driver.translate(
        "call_model", Report(outcome=ReportOutcome.TRANSIENT, error="429 Too Many Requests")
    )
    driver.committed(commit_failure(ConflictError("the session changed since it was read")))
    ending = driver.ending("conflict")
    assert ending.error == "the session changed since it was read; nothing was applied"
    assert ending.error_kind is None
    failed = driver.ending("failed")
    assert (failed.error, failed.error_kind) == ("429 Too Many Requests", "transient")
