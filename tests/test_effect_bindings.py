"""Every effect a table names is bound on both hosts (issue 34).

Each machine table (``machines/*.toml``) is run by two hosts: the anyio drivers in one process
and the Temporal workflow. Each host binds effect names to what performs them in one mapping;
these tests read the effect names from the loaded tables and check each host's mapping holds
every one of them, and nothing outside the machine's vocabulary. A row naming an effect one host
forgot would otherwise fail only when that row first fires, on that host.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from orchestrator._cluster.calls import Nav, Op
from orchestrator._cluster.contract import NavigateRequest
from orchestrator._cluster.navigation.flow import NavigationFlow
from orchestrator._cluster.operation.flow import OperationFlow
from orchestrator._cluster.turn.flow import TurnFlow
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.admission import REFUSALS
from orchestrator._lifecycle.guards import EFFECTS
from orchestrator._lifecycle.machine import load_machine, shipped_machines
from orchestrator._runtime.operation.jobs import CompactionJob
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator.testing import FakeClock
from tests.runtime_kit import Kit
from tests.sessions import two_turns_plan


def named_effects(machine: str) -> set[str]:
    """The effect names the shipped table's rows name."""
    return {name for row in load_machine(machine).rows for name in row.effects}


def one_process(machine: str) -> Mapping[str, object]:
    """The one-process host's binding of effect names to what performs them."""
    kit = Kit()
    if machine == "turn":
        return kit.runtime.turn.effects
    if machine == "navigation":
        return kit.runtime.navigator.effect_table()
    clock = FakeClock()
    routes = SummaryRoutes(candidates=(), retry=RetryPolicy(), sleep=clock.sleep)
    ports = Ports(session=None, routes=routes, sleep=clock.sleep)
    job = CompactionJob(
        ports, routes, reason="threshold", settings=CompactionSettings(), plan=two_turns_plan()
    )
    return OperationRun(ports, job, routes=routes, dry_run=True).effects


def cluster(machine: str) -> Mapping[str, object]:
    """The Temporal workflow host's binding of effect names to what performs them."""
    operation = load_machine("operation")
    if machine == "turn":
        return TurnFlow(load_machine("turn"), operation, "s1").effects
    if machine == "navigation":
        nav = Nav(session_id="s1", navigation_id="n1", request=NavigateRequest(target_id="e1"))
        return NavigationFlow(load_machine("navigation"), operation, nav).effects
    return OperationFlow(operation, Op(session_id="s1", operation_id="o1")).effects


HOSTS = {"one process": one_process, "cluster": cluster}


def test_the_shipped_machines_are_the_three_hosted_ones_and_the_session_table() -> None:
    # A new table needs its hosts' bindings checked here too.
    assert shipped_machines() == ("navigation", "operation", "session", "turn")


def test_every_session_effect_is_bound_once_for_both_hosts() -> None:
    # Both hosts step the session table through one function (_lifecycle/admission.py), whose
    # only effects are the refusals' words.
    assert named_effects("session") == set(REFUSALS)
    assert set(REFUSALS) <= set(EFFECTS["session"])


@pytest.mark.parametrize("machine", ["turn", "operation", "navigation"])
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_every_effect_a_table_names_is_bound_on_the_host(machine: str, host: str) -> None:
    bound = HOSTS[host](machine)
    missing = named_effects(machine) - set(bound)
    assert not missing, f"{host} binds no {sorted(missing)} of machines/{machine}.toml"
    assert set(bound) <= set(EFFECTS[machine]), f"{host} binds effects outside the vocabulary"
    assert all(callable(perform) for perform in bound.values())


@pytest.mark.parametrize("machine", ["turn", "operation", "navigation"])
def test_both_hosts_bind_the_same_effect_names(machine: str) -> None:
    assert set(one_process(machine)) == set(cluster(machine))
