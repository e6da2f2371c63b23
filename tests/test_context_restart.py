"""A compaction's restart reuses the kept messages' numbers: same context as measuring again.

:class:`~orchestrator._core.context.ContextBuilder` restarts at a compaction entry. When every
kept entry was written after the previous compaction, the kept messages are already in the
context, measured, and the restart copies their numbers (issue 9: the commit of a compaction ran
on the event loop and re-measured every kept message). Whatever the restart takes, the context
and its planning index must equal the one that measures every kept message again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.entries import COMPACTION, Entry
from tests.sessions import SessionBuilder
from tests.test_planning_properties import sessions


class MeasuringBuilder(ContextBuilder):
    """The reference: every restart measures the kept messages again."""

    def _restart_at(self, compaction: Entry) -> None:
        self._irregular = True  # what makes a restart measure again (a context edit does)
        super()._restart_at(compaction)


def from_zero(sums: Sequence[int]) -> list[int]:
    return [value - sums[0] for value in sums]


def fields(context: SessionContext) -> dict[str, Any]:
    index = context.index
    assert index is not None
    return {
        "messages": list(context.messages),
        "entry_ids": list(context.entry_ids),
        "estimates": list(context.estimates),
        "fresh_from": context.fresh_from,
        "model": context.model,
        "thinking": context.thinking_level,
        "positions": list(index.positions[: index.count]),
        # Running sums are compared as sums from the start: a restart keeps the kept part's
        # sums where they stood (ContextIndex), a build from scratch starts them at 0.
        "prefix": from_zero(index.prefix[: index.count + 1]),
        "count": index.count,
        "base": index.base,
        "last_compaction": index.last_compaction,
        "context_start": index.context_start,
        "last_invalidating": index.last_invalidating,
        "system": list(index.system),
        "events": [
            (index.event_message[i], index.event_kind[i], index.event_path[i])
            for i in range(index.events)
        ],
        "first_seen": {kind: list(seen.items()) for kind, seen in index.first_seen.items()},
        "serial": from_zero(index.serial[: index.count + 1]),
        "late": list(index.late),
        "shapes": list(index.shapes[: index.count]),
        "tokens": context.tokens(),
    }


def assert_same_at_every_step(path: list[Entry]) -> None:
    live, reference = ContextBuilder(), MeasuringBuilder()
    for entry in path:
        live.push(entry)
        reference.push(entry)
        assert fields(live.context()) == fields(reference.context())


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sessions(branched=False))
def test_planned_compactions_restart_to_the_measured_context(session: Any) -> None:
    assert_same_at_every_step(session.path())


@SETTINGS
@given(sessions(branched=False), st.data())
def test_a_compaction_keeping_any_entry_restarts_to_the_measured_context(
    session: Any, data: st.DataObject
) -> None:
    # Kept from after the last compaction (reused), from before it (measured), from the
    # compaction itself, or from an id not on the path (nothing kept).
    path = session.path()
    ids = [e["id"] for e in path] + ["not-on-the-path"]
    last = path[-1]["id"] if path else None
    compaction = {
        "type": COMPACTION,
        "id": "c-new",
        "parentId": last,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "summary": "summary",
        "firstKeptEntryId": data.draw(st.sampled_from(ids)),
        "tokensBefore": 1,
    }
    assert_same_at_every_step([*path, compaction])


def test_a_second_compaction_keeps_file_operations_and_late_summaries() -> None:
    s = SessionBuilder()
    s.user("start")
    s.assistant("reading", calls=[("read", {"path": "a.py"}), ("edit", {"path": "b.py"})])
    s.tool_result("aaa")
    s.tool_result("bbb")
    s.branch_summary("earlier work")
    s.user("again")
    s.assistant("more", calls=[("read", {"path": "a.py"}), ("write", {"path": "c.py"})])
    s.tool_result("ccc")
    s.tool_result("ddd")
    path = s.path()
    first = s.compaction("one", first_kept=path[4]["id"])
    s.user("after")
    s.assistant("x", calls=[("read", {"path": "d.py"})])
    s.tool_result("eee")
    s.compaction("two", first_kept=s.path()[-3]["id"])
    full = s.path()
    assert first in [e["id"] for e in full]
    assert_same_at_every_step(full)
    context = ContextBuilder(full).context()
    assert context.index is not None
    assert dict(context.index.first_seen["read"]) == {"d.py": 2}
