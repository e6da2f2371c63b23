"""A compaction's kept messages are the plan's window on the context, not a copy (issue 9).

The window is safe to hold because the context's lists only grow until the next compaction,
which starts new ones: whatever the session does after planning, the window shows the same
messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import OfflineSummarizer
from orchestrator._core.tokens import CompactionSettings
from orchestrator._runtime.operation.jobs import CompactionJob, kept_messages
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator._runtime.session import AgentSession
from orchestrator._store.session import Session


def _job(session: Session) -> CompactionJob:
    routes = SummaryRoutes(candidates=(OfflineSummarizer(),))
    ports = Ports(session=session, routes=routes)
    return CompactionJob(ports, routes, reason="manual", settings=CompactionSettings())


def test_the_kept_messages_are_the_plans_window_not_a_copy(example: Path) -> None:
    session = Session.open(example)
    job = _job(session)
    assert job.plan is not None
    kept = job.inputs.kept_messages
    assert kept is job.plan.kept_messages
    assert kept is kept_messages(session, job.plan)
    # The context's own message objects, in order: the newest messages of the context.
    context = session.context()
    assert list(kept) == list(context.messages[len(context.messages) - len(kept) :])
    assert all(a is b for a, b in zip(kept, context.messages[-len(kept) :], strict=True))


@pytest.mark.anyio
async def test_the_kept_messages_do_not_change_when_the_session_does(example: Path) -> None:
    runtime = AgentSession.open(example, owner="test")
    try:
        session = runtime.session
        job = _job(session)
        assert job.plan is not None
        before = tuple(job.inputs.kept_messages)
        # A message appended after planning is not in the window,
        session.append_message({"role": "user", "content": "one more", "timestamp": 1})
        assert tuple(job.inputs.kept_messages) == before
        # nor does a compaction committed meanwhile (the context restarts on new lists) change it.
        assert (await runtime.compact()).status == "committed"
        assert tuple(job.inputs.kept_messages) == before
        assert all(a is b for a, b in zip(job.inputs.kept_messages, before, strict=True))
    finally:
        runtime.close()
