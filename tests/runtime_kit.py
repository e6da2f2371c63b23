"""Shared pieces for runtime tests: a session, an agent, a summarizer and an event log."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from orchestrator._core.model import ModelResponse
from orchestrator._core.tokens import CompactionSettings
from orchestrator._rpc.hub import RpcHub
from orchestrator._rpc.protocol import Dispatcher, Peer
from orchestrator._runtime.events import Event
from orchestrator._runtime.operation.retry import RetryPolicy
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.journal import Journal
from orchestrator._store.session import Session
from orchestrator.testing import FakeClock, ScriptedAgent, ScriptedModel
from tests.cli_kit import either_part

# anyio's backend for an asyncio run on uvloop's event loop, beside the plain "asyncio" and "trio".
UVLOOP = ("asyncio", {"use_uvloop": True})

# A summary the gate (D32) passes as a history or a turn prefix: a split turn's two requests
# take the scripted replies in arrival order.
SUMMARY = either_part("Ship it.")


def settings(**compaction: Any) -> RuntimeSettings:
    base: dict[str, Any] = {"reserve_tokens": 1000, "keep_recent_tokens": 300}
    base.update(compaction)
    return RuntimeSettings(
        context_window=10_000,
        compaction=CompactionSettings(**base),
        retry=RetryPolicy(max_retries=3, base_delay_ms=2000),
    )


class Kit:
    """A runtime over an in-memory session with scripted agent and summarizer."""

    def __init__(
        self,
        turns: Sequence[Sequence[Any]] = (),
        summaries: Sequence[Any] = (),
        *,
        runtime_settings: RuntimeSettings | None = None,
        session: Session | None = None,
        journal: Journal | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        counter = itertools.count(1)
        self.clock = FakeClock()
        self.ms = itertools.count(1_767_225_600_000, 1000)
        self.session = session or Session.in_memory(
            clock=lambda: next(self.ms), random_hex=lambda: f"{next(counter):08x}" + "0" * 24
        )
        self.agent = ScriptedAgent(turns)
        self.model = ScriptedModel(summaries, name="scripted/summarizer", clock=self.clock)
        self.summarizer = SummaryRoutes(
            candidates=(self.model,),
            reserve_tokens=1000,
            retry=RetryPolicy(max_retries=2, base_delay_ms=1000),
            sleep=self.clock.sleep,
        )
        self.journal = journal or Journal.in_memory(clock=lambda: 0)
        self.runtime = AgentSession(
            self.session,
            agent=self.agent,
            summarizer=self.summarizer,
            settings=runtime_settings or settings(),
            journal=self.journal,
            sleep=sleep or self.clock.sleep,
            clock_ms=lambda: next(self.ms),
        )
        self.events: list[Event] = []
        self.runtime.events.subscribe(self.events.append)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.events if e.type == kind]

    def types(self) -> list[str]:
        return [e.type for e in self.events if e.type not in ("transition", "message")]

    def entry_types(self) -> list[str]:
        out = []
        for entry in self.session.tree.entries:
            role = entry.get("message", {}).get("role") if entry["type"] == "message" else None
            out.append(f"{entry['type']}:{role}" if role else entry["type"])
        return out

    def turn_path(self) -> list[tuple[str, str, str]]:
        return [(r.source, r.event, r.dest) for r in self.journal.records() if r.machine == "turn"]


def summary(text: str = SUMMARY) -> ModelResponse:
    return ModelResponse(text=text, model="summarizer", provider="scripted")


async def until(predicate: Any, steps: int = 10_000) -> None:
    """Yield to other tasks until ``predicate()`` holds (no real sleeping)."""
    import anyio.lowlevel

    for _ in range(steps):
        if predicate():
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("condition never became true")


H = TypeVar("H", bound=RpcHub)


class HubClient(Generic[H]):
    """Calls a hub's methods through a dispatcher, as a client would (no transport).

    ``peer``: the connection the calls come from (``None``: in-process). ``events``: every
    ``session.event`` notification the hub forwarded.
    """

    def __init__(self, hub: H, peer: Peer | None = None) -> None:
        self.hub = hub
        self.dispatcher = Dispatcher(hub.methods())
        self.ids = itertools.count(1)
        self.peer = peer
        self.events: list[dict[str, Any]] = []
        hub.listen(self.events.append)

    async def raw(self, method: str, **params: Any) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}
        answer = await self.dispatcher.handle(request, self.peer)
        assert isinstance(answer, dict)
        return answer

    async def call(self, method: str, **params: Any) -> Any:
        answer = await self.raw(method, **params)
        assert "error" not in answer, answer
        return answer["result"]

    async def error(self, method: str, **params: Any) -> dict[str, Any]:
        answer = await self.raw(method, **params)
        assert "result" not in answer, answer
        error: dict[str, Any] = answer["error"]
        return error

    def event_types(self) -> list[str]:
        return [m["params"]["event"]["type"] for m in self.events]


class HangingSleep:
    """A retry sleep that blocks until cancelled, recording the delays asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        import anyio

        self.delays.append(seconds)
        await anyio.Event().wait()


BIG = "x" * 2000  # 500 tokens of user text: enough for a cut with keep_recent_tokens=300
