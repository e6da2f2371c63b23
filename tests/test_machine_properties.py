"""Properties of the shipped tables.

For every machine, every state and every event, with random facts of that machine's own record:
firing either moves to the destination of the first listed row whose guards hold (checked against
an oracle written here from the raw rows and the machine's guard registry), or raises
TransitionError with the state unchanged. The transitions-backed Runner and the pure ``step`` must
agree.
"""

import random
from collections import defaultdict
from dataclasses import Field, fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import TransitionError
from orchestrator._lifecycle.guards import GUARDS, Facts
from orchestrator._lifecycle.machine import (
    MachineDef,
    Row,
    Runner,
    Step,
    load_machine,
    shipped_machines,
    step,
)

MACHINES = shipped_machines()


def _field_strategy(name: str, kind: object) -> st.SearchStrategy[object]:
    if kind == "bool":
        return st.booleans()
    if kind == "str":
        return st.sampled_from(["", "length"])
    if name in ("delay_ms", "max_delay_ms"):
        # Cluster around the 30 s limit so both sides of delay_within_limit are drawn.
        return st.sampled_from([0, 1_000, 29_999, 30_000, 30_001, 60_000])
    return st.integers(min_value=0, max_value=4)


def facts_strategy(machine: str) -> st.SearchStrategy[Facts]:
    """Every field of ``machine``'s own facts record, drawn at random."""
    record = GUARDS[machine].facts
    drawn: st.SearchStrategy[Facts] = st.builds(
        record, **{f.name: _field_strategy(f.name, f.type) for f in fields(record)}
    )
    return drawn


def oracle(defn: MachineDef, state: str, event: str, facts: Facts) -> Row | None:
    """First row listed for (state, event) whose guards all hold and unless-guards all fail."""
    for row in defn.rows:
        if row.event != event or state not in row.sources:
            continue
        guards = GUARDS[defn.name]
        if all(guards[g](facts) for g in row.guards) and not any(
            guards[g](facts) for g in row.unless
        ):
            return row
    return None


class Pool:
    """Runners waiting in each state: building one costs ~1 ms, firing one ~10 µs."""

    def __init__(self, defn: MachineDef) -> None:
        self.defn = defn
        self.idle: dict[str, list[Runner]] = defaultdict(list)
        self.seen: list[Step] = []

    def take(self, state: str) -> Runner:
        self.seen.clear()
        waiting = self.idle[state]
        return (
            waiting.pop()
            if waiting
            else Runner(self.defn, state=state, observers=[self.seen.append])
        )

    def give(self, runner: Runner) -> None:
        self.idle[runner.state].append(runner)


POOLS = {name: Pool(load_machine(name)) for name in MACHINES}


def check_one(pool: Pool, state: str, event: str, facts: Facts) -> None:
    defn = pool.defn
    expected = oracle(defn, state, event, facts)
    runner = pool.take(state)
    seen = pool.seen
    try:
        if expected is None:
            with pytest.raises(TransitionError) as caught:
                runner.fire(event, facts)
            assert (caught.value.machine, caught.value.state, caught.value.event) == (
                defn.name,
                state,
                event,
            )
            assert runner.state == state
            assert seen == []
            with pytest.raises(TransitionError):
                step(defn, state, event, facts)
        else:
            taken = runner.fire(event, facts)
            assert taken == Step(
                machine=defn.name,
                source=state,
                event=event,
                dest=expected.dest,
                effects=expected.effects,
            )
            assert runner.state == expected.dest
            assert seen == [taken]
            assert step(defn, state, event, facts) == taken
    finally:
        pool.give(runner)


@pytest.mark.parametrize("name", MACHINES)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_every_state_and_event_is_a_listed_move_or_a_refusal(
    name: str, data: st.DataObject
) -> None:
    pool = POOLS[name]
    facts = data.draw(facts_strategy(name))
    for state in pool.defn.states:
        for event in pool.defn.events:
            check_one(pool, state, event, facts)


@pytest.mark.parametrize("name", MACHINES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_walks_stay_on_the_table(name: str, data: st.DataObject) -> None:
    defn = POOLS[name].defn
    runner = Runner(defn)
    log: list[Step] = []
    runner.subscribe(log.append)
    moves = data.draw(
        st.lists(st.tuples(st.sampled_from(defn.events), facts_strategy(name)), max_size=25)
    )
    for event, facts in moves:
        before = runner.state
        expected = oracle(defn, before, event, facts)
        if expected is None:
            with pytest.raises(TransitionError):
                runner.fire(event, facts)
            assert runner.state == before
        else:
            assert runner.fire(event, facts).dest == expected.dest == runner.state
        if runner.done:
            assert runner.listed_events() == ()
    for earlier, later in zip(log, log[1:], strict=False):
        assert earlier.dest == later.source
    assert all(s.source in defn.states and s.dest in defn.states for s in log)


def _random_facts(machine: str, count: int) -> list[Facts]:
    # Seeded, so the witness search is the same on every run.
    rng = random.Random(4)

    def value(f: Field[Any]) -> bool | int | str:
        if f.type == "bool":
            return rng.random() < 0.5
        if f.type == "str":
            return rng.choice(["", "length"])
        if f.name.endswith("delay_ms"):
            return rng.choice([0, 1, 3, 4, 30_000, 60_000])
        return rng.randint(0, 4)

    record = GUARDS[machine].facts

    def one() -> Facts:
        values: dict[str, Any] = {f.name: value(f) for f in fields(record)}
        made: Facts = record(**values)
        return made

    return [one() for _ in range(count)]


WITNESSES = {name: _random_facts(name, 2_000) for name in MACHINES}


@pytest.mark.parametrize("name", MACHINES)
def test_every_row_can_fire_for_some_facts(name: str) -> None:
    # A row that no facts can reach is dead text in the table (and in the diagram).
    defn = load_machine(name)
    for row in defn.rows:
        for source in row.sources:
            assert any(
                oracle(defn, source, row.event, facts) == row for facts in WITNESSES[name]
            ), f"row #{row.index + 1} ({source} -{row.event}->) never fires"
