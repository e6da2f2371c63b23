"""The session machine (``machines/session.toml``) decides which requests run together.

The tables decide (D31) for this machine too: the hub and the Python API ask the table, so a
modified copy of it changes what a server admits and what an ``AgentSession`` call does, with no
change to the code.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from orchestrator._core.errors import BusyError
from orchestrator._core.resources import data_dir
from orchestrator._lifecycle.admission import (
    BUSY_COMPACTING,
    BUSY_NAVIGATING,
    CLOSE_WHILE_BUSY,
    COMPACT_WHILE_NAVIGATING,
    DIRECT_REFUSALS,
    HOSTED_ON_OPEN_SESSION,
    NAVIGATE_WHILE_WORKING,
    PROMPT_WHILE_NAVIGATING,
    REFUSALS,
    admit,
)
from orchestrator._lifecycle.guards import EFFECTS, SessionFacts
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine
from orchestrator._lifecycle.names import SessionEvent
from orchestrator._rpc.errors import BUSY
from orchestrator._rpc.hub import RuntimeOptions, SessionHub
from orchestrator._runtime.wiring import wire
from orchestrator.testing import Hang, reply
from tests.runtime_kit import BIG, HubClient, Kit, until
from tests.runtime_kit import settings as runtime_settings

pytestmark = pytest.mark.anyio

Rows = list[dict[str, Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def table(edit: Callable[[Rows], None]) -> MachineDef:
    """A copy of the shipped session table with ``edit`` applied to its rows."""
    data = tomllib.loads((data_dir("machines") / "session.toml").read_text(encoding="utf-8"))
    edit(data["transitions"])
    return build(data, source="modified session.toml", guards=None, effects=None)


def refusal(
    request: SessionEvent, facts: SessionFacts, defn: MachineDef | None = None
) -> str | None:
    try:
        admit(request, facts, table=defn, method="summary.compact", path="s.jsonl")
    except BusyError as refused:
        return str(refused)
    return None


def test_the_shipped_table_refuses_what_the_servers_refused() -> None:
    turn, nav = SessionFacts(turn_running=True), SessionFacts(navigation_running=True)
    manual = SessionFacts(turn_running=True, compaction_running=True)
    assert refusal(SessionEvent.PROMPT, turn) is None  # queued by the turn table
    assert refusal(SessionEvent.PROMPT, nav) == PROMPT_WHILE_NAVIGATING
    assert refusal(SessionEvent.COMPACT, turn) is None  # stops the turn (D22)
    assert refusal(SessionEvent.COMPACT, manual) == BUSY_COMPACTING
    assert refusal(SessionEvent.COMPACT, nav) == COMPACT_WHILE_NAVIGATING
    assert refusal(SessionEvent.NAVIGATE, turn) == NAVIGATE_WHILE_WORKING
    assert refusal(SessionEvent.NAVIGATE, nav) == BUSY_NAVIGATING
    assert refusal(SessionEvent.NAVIGATE, SessionFacts()) is None
    for facts in (turn, nav, manual, SessionFacts()):
        assert refusal(SessionEvent.FORK, facts) is None
    for facts in (turn, nav, SessionFacts(compaction_running=True)):
        assert refusal(SessionEvent.CLOSE, facts) == CLOSE_WHILE_BUSY
    assert refusal(SessionEvent.CLOSE, SessionFacts()) is None
    assert refusal(
        SessionEvent.HOSTED, SessionFacts(session_open=True)
    ) == HOSTED_ON_OPEN_SESSION.format(method="summary.compact", path="s.jsonl")
    assert refusal(SessionEvent.HOSTED, SessionFacts()) is None


def test_every_refusal_effect_has_its_words_and_every_event_its_rows() -> None:
    defn = load_machine("session")
    effects = {e for row in defn.rows for e in row.effects}
    assert effects == set(REFUSALS) == set(EFFECTS["session"])
    assert set(defn.events) == {e.value for e in SessionEvent}


def test_without_a_refusal_row_the_request_is_admitted() -> None:
    def drop_second_compaction(rows: Rows) -> None:
        rows[:] = [r for r in rows if r.get("guards") != ["compaction_running"]]

    manual = SessionFacts(turn_running=True, compaction_running=True)
    assert refusal(SessionEvent.COMPACT, manual) == BUSY_COMPACTING
    assert refusal(SessionEvent.COMPACT, manual, table(drop_second_compaction)) is None


async def fork_during_a_compaction(rules: MachineDef) -> dict[str, Any]:
    """``session.fork``'s answer while a manual compaction hangs, under ``rules``."""
    kit = Kit(
        turns=[[reply("first", tokens=2000)], [reply("second", tokens=100)]],
        summaries=[Hang()],
        runtime_settings=runtime_settings(adaptive_keep=False),
    )
    hub = SessionHub(RuntimeOptions(summarizer=kit.summarizer))
    hub.host.rules = rules
    client, sid = HubClient(hub), hub.add(kit.runtime)
    await kit.runtime.prompt(BIG)
    await kit.runtime.prompt(BIG)
    user = next(
        e["id"]
        for e in kit.session.tree.entries
        if e["type"] == "message" and e["message"]["role"] == "user"
    )

    async def compress() -> None:
        await client.raw("session.compress", session_id=sid)

    async with anyio.create_task_group() as group:
        group.start_soon(compress)
        await until(lambda: len(kit.model.requests) == 1)
        answer = await client.raw("session.fork", session_id=sid, entry_id=user)
        await client.call("session.abort", session_id=sid)
    hub.close_all()
    return answer


def no_fork_while(guard: str, effect: str) -> Callable[[Rows], None]:
    """An edit that adds a row refusing a fork while ``guard`` holds, before the fork's rows."""

    def edit(rows: Rows) -> None:
        first = next(i for i, r in enumerate(rows) if r["event"] == "fork")
        row = {"source": "asked", "event": "fork", "dest": "refused", "guards": [guard]}
        rows.insert(first, {**row, "effects": [effect]})

    return edit


async def test_a_row_added_to_the_table_refuses_a_fork_the_server_admitted() -> None:
    no_fork_while_compacting = no_fork_while("compaction_running", "refuse_second_compaction")

    shipped = await fork_during_a_compaction(load_machine("session"))
    modified = await fork_during_a_compaction(table(no_fork_while_compacting))
    answers = [shipped, modified]
    assert answers[0]["result"]["cancelled"] is False
    assert answers[1]["error"] == {"code": BUSY, "message": BUSY_COMPACTING}


def test_a_refusal_row_without_words_still_refuses() -> None:
    def silent(rows: Rows) -> None:
        for row in rows:
            if row["event"] == "compact" and row["dest"] == "refused":
                row.pop("effects", None)

    manual = SessionFacts(turn_running=True, compaction_running=True)
    assert refusal(SessionEvent.COMPACT, manual, table(silent)) == "compact: refused"


def test_a_host_answers_only_once_attached_to_a_hub() -> None:
    from orchestrator._rpc.local_host import LocalHost

    host = LocalHost(RuntimeOptions())
    with pytest.raises(RuntimeError, match="LocalHost: attach"):
        _ = host.outlet
    hub = SessionHub(host.options)
    assert hub.options is host.options
    assert hub.host.outlet is hub


async def while_navigating(rules: MachineDef, call: str) -> str | None:
    """What a direct ``AgentSession`` call answers while a branch summary hangs, under ``rules``.

    ``None`` when it ran; else the refusal's words.
    """
    kit = Kit(turns=[[reply("one")], [reply("two")]], summaries=[Hang()])
    runtime = kit.runtime
    ports = dataclasses.replace(
        runtime.ports, tables=lambda name: rules if name == "session" else load_machine(name)
    )
    runtime.ports, runtime.operations, runtime.turn, runtime.navigator = wire(
        ports, runtime.settings, runtime.turn
    )
    await runtime.prompt("first question")
    await runtime.prompt("second question")
    first = kit.session.tree.entries[0]["id"]
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "fork": lambda: runtime.fork(first),
        "compact": runtime.compact,
    }
    answer: list[str | None] = []

    async def interfere() -> None:
        await until(lambda: len(kit.model.requests) == 1)
        try:
            await calls[call]()
            answer.append(None)
        except BusyError as refused:  # a SessionError, as the Python API always raised
            answer.append(str(refused))
        runtime.abort_branch_summary()

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: runtime.navigate(first, summarize=True))
        group.start_soon(interfere)
    assert not runtime.is_navigating
    return answer[0]


async def test_a_row_added_to_the_table_refuses_a_direct_fork_that_ran() -> None:
    no_fork_while_navigating = no_fork_while("navigation_running", "refuse_second_navigation")

    assert await while_navigating(load_machine("session"), "fork") is None
    refused = await while_navigating(table(no_fork_while_navigating), "fork")
    assert refused == DIRECT_REFUSALS["refuse_second_navigation"]


async def test_the_python_api_keeps_its_words_for_the_same_refusal() -> None:
    def reworded(rows: Rows) -> None:
        row = next(
            r
            for r in rows
            if r["event"] == "compact" and "navigation_running" in r.get("guards", [])
        )
        row["effects"] = ["refuse_second_compaction"]  # the refusal the row names, not the code

    shipped = await while_navigating(load_machine("session"), "compact")
    assert shipped == "Cannot compact while a tree navigation is in progress"
    assert await while_navigating(table(reworded), "compact") == (
        "A manual compaction is already running"
    )
