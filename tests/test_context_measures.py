"""A context measures its messages for summary requests on first need (``_core.measures``).

Whenever the measuring happens (never read until the end, read at some steps, or eagerly from
the first push as the runtime asks), and whatever restarts came between, the numbers are those
of a builder that measures at every step.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import CompactionPlan, CompactionSettings, plan_compaction
from orchestrator._core import measures
from orchestrator._core.context import ContextBuilder
from orchestrator._core.entries import COMPACTION
from orchestrator._core.measured_messages import MeasuredMessages
from orchestrator._core.tokens import estimate_tokens
from tests.sessions import SessionBuilder
from tests.test_context_restart import MeasuringBuilder, fields
from tests.test_measured_serialization import ASSISTANTS, messages
from tests.test_planning_properties import sessions

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_compaction(path: list[Any], kept: int) -> list[Any]:
    compaction = {
        "type": COMPACTION,
        "id": "c-new",
        "parentId": path[-1]["id"] if path else None,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "summary": "summary",
        "firstKeptEntryId": path[min(kept, len(path) - 1)]["id"] if path else "none",
        "tokensBefore": 1,
    }
    return [*path, compaction]


@SETTINGS
@given(sessions(branched=False), st.data())
def test_measured_late_or_eagerly_the_numbers_are_the_measured_ones(
    session: Any, data: st.DataObject
) -> None:
    path = _with_compaction(session.path(), data.draw(st.integers(0, 50)))
    reads = data.draw(st.sets(st.integers(0, len(path))))
    eager = data.draw(st.sampled_from(["lazy", "measure() first", "measured from the start"]))
    live, reference = (
        ContextBuilder(measured=eager == "measured from the start"),
        MeasuringBuilder(),
    )
    if eager == "measure() first":
        live.measure()
    for step, entry in enumerate(path):
        live.push(entry)
        reference.push(entry)
        if step in reads:
            assert fields(live.context()) == fields(reference.context())
    assert fields(live.context()) == fields(reference.context())


def test_a_plan_measures_nothing_until_a_request_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    s = SessionBuilder()
    for k in range(30):
        s.user(f"question {k} " + "x" * 400)
        s.assistant(f"answer {k} " + "y" * 400, calls=[("read", {"path": f"f{k}.py"})])
        s.tool_result("z" * 400)
    calls: list[int] = []
    original = measures.Measures.upto

    def counting(self: measures.Measures, count: int) -> None:
        calls.append(count - self.measured())
        original(self, count)

    monkeypatch.setattr(measures.Measures, "upto", counting)
    context = ContextBuilder(s.path()).context()
    plan = plan_compaction(s.path(), CompactionSettings(keep_recent_tokens=500), context=context)
    assert isinstance(plan, CompactionPlan)
    assert sum(calls) == 0  # planned, nothing measured
    run = plan.messages_to_summarize
    assert isinstance(run, MeasuredMessages)
    assert run.units() > 0
    assert sum(calls) > 0


@SETTINGS
@given(st.lists(messages() | ASSISTANTS, max_size=6))
def test_the_context_estimates_each_message_as_estimate_tokens_does(batch: list[Any]) -> None:
    path = [
        {
            "type": "message",
            "id": f"{k:08x}",
            "parentId": f"{k - 1:08x}" if k else None,
            "message": m,
        }
        for k, m in enumerate(batch)
    ]
    context = ContextBuilder(path).context()
    assert list(context.estimates) == [estimate_tokens(m) for m in context.messages]
    assert len(context.messages) == len(batch)
