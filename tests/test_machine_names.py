"""The code's state and event enums agree with the tables, and the loader enforces it (issue 34)."""

from pathlib import Path

import pytest

from orchestrator._core.errors import DefinitionError
from orchestrator._lifecycle.guards import GuardSet, TurnFacts
from orchestrator._lifecycle.load import MachineDef
from orchestrator._lifecycle.names import VOCABULARY, OperationState, TurnEvent

MACHINES = Path(__file__).resolve().parents[1] / "machines"


@pytest.mark.parametrize("name", sorted(VOCABULARY))
def test_every_shipped_table_names_exactly_the_enum_states(name: str) -> None:
    defn = MachineDef.load(MACHINES / f"{name}.toml")
    states, events = VOCABULARY[name]
    assert set(defn.states) == {s.value for s in states}
    assert set(defn.events) == {e.value for e in events}


def test_members_are_their_names_as_plain_strings() -> None:
    # The journal, traces and JSON-RPC answers keep the same text.
    assert str(OperationState.COMMITTED) == "committed"
    assert OperationState("committed") is OperationState.COMMITTED
    assert f"{TurnEvent.USER_PROMPT}" == "user_prompt"


def _operation_text() -> str:
    return (MACHINES / "operation.toml").read_text(encoding="utf-8")


def test_a_state_the_code_does_not_know_fails_at_load() -> None:
    text = _operation_text().replace("[states.skipped]", "[states.skipped_now]", 1)
    text = text.replace('dest = "skipped"', 'dest = "skipped_now"')
    text = text.replace('"skipped"', '"skipped_now"')
    with pytest.raises(DefinitionError, match="'skipped_now' is not a OperationState"):
        MachineDef.parse(text, source="mutated.toml")


def test_an_event_the_code_does_not_know_fails_at_load() -> None:
    text = _operation_text().replace('event = "wait_done"', 'event = "wait_over"', 1)
    with pytest.raises(DefinitionError, match="mutated.toml: event 'wait_over' is not a"):
        MachineDef.parse(text, source="mutated.toml")


def test_a_table_without_some_event_still_loads() -> None:
    # A row taken out (as the table-mutation tests do) leaves an event no row answers: refused
    # at run time like any other refused event, not a load error.
    defn = MachineDef.load(MACHINES / "operation.toml")
    assert "reopened" in defn.events
    rows = _operation_text().split("[[transitions]]")
    kept = [row for row in rows if 'event = "reopened"' not in row]
    assert len(kept) < len(rows)
    mutated = "[[transitions]]".join(kept)
    assert "reopened" not in MachineDef.parse(mutated).events


def test_a_machine_without_enums_is_not_checked() -> None:
    text = """
[machine]
name = "made_up"
initial = "a"
final = "b"
[states.a]
doc = "start"
[states.b]
doc = "end"
[[transitions]]
source = "a"
event = "go"
dest = "b"
"""
    defn = MachineDef.parse(text, guards=GuardSet("made_up", TurnFacts, {}), effects=())
    assert defn.initial == "a"
