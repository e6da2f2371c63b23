"""The turn's activities: the agent, the appends and the turn journal (issue 10).

Theory of operation. Each activity performs one effect of the turn table and reports; none
decides anything (:mod:`orchestrator._cluster.turn.flow` steps the table):

* ``turn_policy``: what the workflow's guards need from this worker's settings, and whether it
  has an agent at all (a worker without ``--model`` refuses prompts, as ``serve`` without one).
* ``call_agent``: one run of the worker's agent on the live context, made once (the table
  decides about retries), heartbeating while it waits. It appends nothing: it reports the
  messages the agent yielded and what the last reply means
  (:func:`~orchestrator._runtime.turn.replies.classify`, on this worker's window and thresholds).
  Cancelled by the workflow (abort, compress), it reports the messages completed so far
  (outcome ``stopped``) instead of failing, so that they are kept as in one process; an agent
  that raises fails the activity with its exception's type and message.
* ``append``: appends the turn's messages (and the ``context_edit`` entries that omit a failed
  attempt, D18) under the ids the workflow derived for them; an id
  already stored means an earlier delivery appended it (its worker died before saying so), so
  it is skipped. Delivered again after a lost worker, it never appends twice.
* ``journal_turn``: the turn steps not yet written (they also ride with every turn activity),
  and ``session_compact_failed`` on this worker's hooks when overflow recovery gave up (D18).

Store and journal work is blocking I/O, so it runs in a thread; the agent is async.

Reading little. Both read the session through the worker's cache
(:meth:`~orchestrator._cluster.stores.WorkerStores.session`: a cached parse is used only while
the store's stamp is unchanged). The appends are conditional on the session as read, so the
worker can keep the session with the new entries when the store tells the stamp its write left
(PostgreSQL); an append that finds another writer first goes after it, on the session read
again, as one process appends (at the end), and the cache forgets that session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from orchestrator._cluster.calls import AgentReported, NewEntry, TurnCall, TurnPolicy
from orchestrator._cluster.contract import NO_AGENT, NO_AGENT_TYPE
from orchestrator._cluster.delivery import redelivered, store_work
from orchestrator._cluster.heartbeat import heartbeating
from orchestrator._cluster.journaling import write_lines
from orchestrator._cluster.stores import WorkerStores
from orchestrator._core.context import SessionContext
from orchestrator._core.entries import CONTEXT_EDIT, Entry, Message
from orchestrator._core.errors import ConflictError
from orchestrator._core.prompts import render
from orchestrator._runtime.agent import Agent, AgentInput
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.turn.replies import classify
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.session import Session, wall_clock_ms


class TurnActivities:
    """The turn activities a worker offers, over its store, settings and agent.

    Args:
        stores: The worker's way to its sessions (pooled connections; see
            :class:`~orchestrator._cluster.stores.WorkerStores`).
        settings: The window, thresholds and retry policy the turns are decided with.
        agent_factory: Makes the agent of a turn (``None``: prompts are refused).
        hooks: The worker's hooks (``journal_turn`` tells ``session_compact_failed``).
    """

    def __init__(
        self,
        stores: WorkerStores,
        settings: RuntimeSettings,
        agent_factory: Callable[[], Agent] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.stores = stores
        self.settings = settings
        self.agent_factory = agent_factory
        self.hooks = hooks or Hooks()

    def all(self) -> Sequence[Callable[..., Any]]:
        """Every turn activity, for the worker."""
        return (self.turn_policy, self.call_agent, self.append, self.journal_turn)

    @activity.defn(name="turn_policy")
    async def turn_policy(self) -> TurnPolicy:
        """This worker's turn settings, and whether it has an agent."""
        s = self.settings
        return TurnPolicy(
            has_agent=self.agent_factory is not None,
            compaction_enabled=s.compaction.enabled,
            auto_continue=s.compaction.auto_continue,
            max_retries=s.retry.max_retries if s.retry.enabled else 0,
            base_delay_ms=s.retry.base_delay_ms,
            continue_text=render("auto_continue"),
            prune=s.prune,
            context_window=s.context_window,
            reserve_tokens=s.compaction.reserve_tokens,
            threshold_percent=s.compaction.threshold_percent,
            threshold_tokens=s.compaction.threshold_tokens,
        )

    @activity.defn(name="call_agent")
    async def call_agent(self, call: TurnCall) -> AgentReported:
        """Run the agent once on the live context; report its messages and what they mean."""
        if self.agent_factory is None:
            raise ApplicationError(NO_AGENT, type=NO_AGENT_TYPE, non_retryable=True)
        agent = self.agent_factory()
        context, messages = await store_work(self._context, call)
        turn = AgentInput(
            messages=messages,
            model=context.model,
            thinking_level=context.thinking_level,
            now_ms=wall_clock_ms,
        )
        yielded: list[Message] = []
        try:
            async with heartbeating():
                async for message in agent.run(turn):
                    yielded.append(message)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is None or not details.cancel_requested:
                raise  # the worker stops: the workflow hears of a lost run, as from a crash
            # The workflow stopped the run (abort, compress): the messages it completed are
            # reported, and appended as one process keeps them; the one being made is not.
            return AgentReported(outcome="stopped", messages=_as_json(yielded))
        reply = next((m for m in reversed(yielded) if m.get("role") == "assistant"), None)
        verdict = classify(reply, self.settings, stale=_stale(reply, context))
        return AgentReported.judged(verdict, _as_json(yielded))

    @activity.defn(name="append")
    async def append(self, call: TurnCall) -> None:
        """Append the turn's entries once each, under the ids the workflow fixed."""
        await store_work(self._append, redelivered(call))

    @activity.defn(name="journal_turn")
    async def journal_turn(self, call: TurnCall) -> None:
        """Write the turn steps not yet written; tell ``session_compact_failed`` if asked."""
        await store_work(self.write_journal, redelivered(call))
        if call.compact_failed is not None:
            await self.hooks.run(
                "session_compact_failed",
                {"type": "session_compact_failed", **call.compact_failed},
                lambda _name, _error: None,
            )

    # -- the work ---------------------------------------------------------------------------------

    def _context(self, call: TurnCall) -> tuple[SessionContext, list[Message]]:
        self.write_journal(call)
        session, _ = self.stores.session(call.session_id)
        with contextlib.closing(session.store):
            context = session.context()
        dropped = set(call.dropped)
        messages = [
            m for m, i in zip(context.messages, context.entry_ids, strict=True) if i not in dropped
        ]
        return context, messages

    def _append(self, call: TurnCall) -> None:
        self.write_journal(call)
        next_id = [""]
        session, cached = self.stores.session(call.session_id, random_hex=lambda: next_id[0])
        with contextlib.closing(session.store):
            base = session.tail()
            try:
                # Conditional on the session as read, so the cache may keep it with them.
                added = _append_new(session, call.entries, next_id, conditional=True)
            except ConflictError:
                added = None
            session.store.sync()
        if added is not None:
            self.stores.remember(call.session_id, session, cached, added, base)
            return
        # Another writer appended since the read: the messages go after what it wrote, on the
        # session read again, as one process appends them (at the end, not conditionally).
        self.stores.cache.drop(call.session_id)
        session, _ = self.stores.session(call.session_id, random_hex=lambda: next_id[0])
        with contextlib.closing(session.store):
            _append_new(session, call.entries, next_id, conditional=False)
            session.store.sync()
        self.stores.cache.drop(
            call.session_id
        )  # an unconditional write: its stamp vouches for nothing

    def write_journal(self, call: TurnCall) -> None:
        if not call.journal:
            return
        with self.stores.journal(call.session_id) as journal:
            write_lines(
                journal,
                "turn",
                call.journal,
                resend=call.resend,
                mine=lambda r: r.machine == "turn" and r.data.get("turn") == call.run_id,
                data={"turn": call.run_id},
                line_data=False,
            )


def _as_json(messages: list[Message]) -> list[str]:
    return [json.dumps(m, ensure_ascii=False) for m in messages]


def _stale(reply: Message | None, context: SessionContext) -> bool:
    # A reply from before the latest compaction measured a context that no longer exists.
    messages = context.messages
    if reply is None or not messages or messages[0].get("role") != "compactionSummary":
        return False
    return int(reply.get("timestamp") or 0) <= int(messages[0].get("timestamp") or 0)


def _append_new(
    session: Session, entries: Sequence[NewEntry], next_id: list[str], *, conditional: bool
) -> list[Entry]:
    """Append the entries not stored yet, each under its id; returns those appended.

    An id already stored means an earlier delivery appended it (its worker died before saying
    so): it is skipped. ``conditional``: each append only where the previous one ended (D27).
    """
    added: list[Entry] = []
    for new in entries:
        found = session.tree.by_id.get(new.entry_id)
        if found is not None:
            _same_or_refuse(found, new)
            continue
        next_id[0] = new.entry_id
        expect = session.tail() if conditional else None
        if new.message is not None:
            entry = session.append_message(json.loads(new.message), expect=expect)
        elif new.omits is not None:
            fields = {"targetId": new.omits, "replacement": None}
            entry = session.append_entry(CONTEXT_EDIT, fields, expect=expect)
        else:
            entry = session.append_custom_message(
                str(new.custom_type), new.content, display=new.display, expect=expect
            )
        added.append(entry)
    return added


def _same_or_refuse(found: Entry, new: NewEntry) -> None:
    """The entry stored under ``new``'s id must be ``new``, appended by an earlier delivery."""
    if new.message is not None:
        same = found.get("message") == json.loads(new.message)
    elif new.omits is not None:
        same = found.get("type") == CONTEXT_EDIT and found.get("targetId") == new.omits
    else:
        same = found.get("customType") == new.custom_type
    if not same:
        raise ApplicationError(
            f"entry {new.entry_id}: the id this turn derived is taken by another entry",
            type="IdTaken",
            non_retryable=True,
        )
