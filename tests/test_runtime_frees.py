"""A runtime that is let go frees its session at once, without the cyclic collector.

The turn driver, its effect tables, the navigator and the machines that call them back used to
hold one another in a reference cycle, and that cycle held the session: every entry of it. Only
a full collection freed them, and the loader moves what it parses straight into the oldest
generation without counting it (``gc_paused``), so CPython saw no reason to run one: a program
opening, compacting and closing a 10k-entry session in a loop held 1.4 GB after sixty of them,
with no full collection run. Reference counting alone now frees a runtime and its session.
"""

from __future__ import annotations

import gc
import shutil
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import AgentSession, SummaryRoutes
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._rpc.protocol import Dispatcher
from orchestrator.testing import ScriptedAgent, ScriptedModel, reply
from tests.cli_kit import EXAMPLE

pytestmark = pytest.mark.anyio

OTHER_BRANCH = "36fbeee7"  # an assistant message off the example's active path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def opened(tmp_path: Path) -> AgentSession:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    routes = SummaryRoutes(candidates=(ScriptedModel(["## Goal\nsummary"] * 8),))
    agent = ScriptedAgent([[reply("an answer")], [reply("another")]])
    return AgentSession.open(path, agent=agent, summarizer=routes)


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_runtime_that_turned_compacted_and_navigated_is_freed_by_reference_counting(
    tmp_path: Path,
) -> None:
    runtime = opened(tmp_path)
    await runtime.prompt("hello")
    await runtime.compact()
    await runtime.navigate(OTHER_BRANCH, summarize=True)
    await runtime.prompt("and now")
    session = weakref.ref(runtime.session)
    driver = weakref.ref(runtime.turn)
    navigator = weakref.ref(runtime.navigator)
    runtime.close()
    del runtime
    assert driver() is None
    assert navigator() is None
    assert session() is None


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_runtime_never_closed_is_freed_too(tmp_path: Path) -> None:
    runtime = opened(tmp_path)
    await runtime.prompt("hello")
    session = weakref.ref(runtime.session)
    del runtime
    assert session() is None


async def test_the_parts_still_call_back_while_the_runtime_lives(tmp_path: Path) -> None:
    # The parts hold the runtime's pieces weakly: as long as the runtime is held, every call
    # reaches them, whatever the collector does meanwhile.
    runtime = opened(tmp_path)
    try:
        gc.collect()
        await runtime.prompt("hello")
        gc.collect()
        outcome = await runtime.compact()
        assert outcome.entry is not None
        gc.collect()
        result = await runtime.navigate(OTHER_BRANCH, summarize=True)
        assert result.summary_entry is not None
        assert runtime.state == "idle"
    finally:
        runtime.close()


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_session_the_server_closes_is_freed_by_reference_counting(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "s.jsonl")
    routes = SummaryRoutes(candidates=(ScriptedModel(["## Goal\nsummary"] * 8),))
    hub = SessionHub(RuntimeOptions(root=tmp_path, summarizer=routes))
    rpc = Dispatcher(hub.methods())

    async def call(method: str, **params: Any) -> dict[str, Any]:
        answer = await rpc.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    session_id = (await call("session.open", path="s.jsonl"))["session_id"]
    await call("session.compress", session_id=session_id)
    await call(
        "session.tree.navigate", session_id=session_id, target_id=OTHER_BRANCH, summarize=True
    )
    await call("session.tree", session_id=session_id)
    session = weakref.ref(hub.runtime(session_id).session)
    await call("session.close", session_id=session_id)
    assert session() is None
