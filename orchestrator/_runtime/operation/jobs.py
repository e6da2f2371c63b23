"""What each kind of operation plans, asks the hooks, and commits.

The operation machine (``machines/operation.toml``) is shared by compactions, branch summaries and
prunes; each starts with its own event (``prepared``, ``branch_planned``, ``prune_planned``) and
only meets the rows that follow from it. A job holds the kind-specific parts of the effects: the
planning that happens in ``preparing`` (pure), the hooks a compaction consults, the summary requests
(:class:`~orchestrator._runtime.operation.summarize.Part`), the entry the commit appends, and the
payload of the result. The driver in :mod:`orchestrator._runtime.operation.run` decides nothing here
either: a job answers questions, the table chooses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.branch_plan import BranchPlan
from orchestrator._core.compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from orchestrator._core.context import window
from orchestrator._core.entries import BRANCH_SUMMARY, COMPACTION, Entry, Message
from orchestrator._core.gate import GateSpec
from orchestrator._core.prune import PrunePlan, apply_prune, plan_prune
from orchestrator._core.serialize import serialize_conversation
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.guards import OperationFacts
from orchestrator._lifecycle.names import OperationEvent, ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.hook_results import compacting_shape, supplied_compaction
from orchestrator._runtime.operation.compact_hooks import retries_after
from orchestrator._runtime.operation.summarize import (
    BranchSummaryResult,
    CompactionInputs,
    CompactionResult,
    Part,
    SummaryRoutes,
    branch_parts,
    branch_result,
    compaction_parts,
    compaction_result,
)
from orchestrator._runtime.ports import Ports
from orchestrator._store.protocol import Tail
from orchestrator._store.session import Session, branch_summary_fields


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    """The event an operation starts with, once planned (pure).

    Attributes:
        event: ``prepared``, ``branch_planned`` or ``prune_planned``.
        facts: What the guards of that event read.
        data: What the journal records with it.
    """

    event: str
    facts: OperationFacts
    data: Mapping[str, Any] = field(default_factory=dict)


def starts_early(parts: Sequence[Part]) -> bool:
    """Whether an operation of these requests starts a later one with the first (_start_early)."""
    return any(part.independent and part.routes for part in parts[1:])


def kept_messages(session: Session, plan: CompactionPlan) -> Sequence[Message]:
    """The messages a compaction keeps (for the short summary and the after-estimate).

    The plan holds them: a window on the context it was planned from, whose list only grows
    (a compaction starts a new one), so the window never changes and is returned as it is. A
    copy was a fifth of a compaction's start with most of the context kept (issue 9). The
    messages are the context's own, as a copy's would be. ``session`` is not read.
    """
    del session  # the plan is enough; the parameter stays for the callers
    return plan.kept_messages


class CompactionJob:
    """A compaction of the active branch (or of a given plan, without a session).

    Args:
        ports: The runtime's ports (``session`` may be ``None`` with ``plan`` given).
        routes: The summary routes (candidates already chosen for the reason, D21).
        reason: ``threshold``, ``overflow`` or ``manual``.
        settings: Compaction settings for planning.
        focus: The user's instructions.
        plan: A plan made elsewhere (then no planning happens here).
        kept: The kept messages, when ``plan`` is given without a session.
    """

    kind = "compaction"

    def __init__(
        self,
        ports: Ports,
        routes: SummaryRoutes,
        *,
        reason: str,
        settings: CompactionSettings,
        focus: str | None = None,
        plan: CompactionPlan | None = None,
        kept: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.ports = ports
        self.routes = routes
        self.reason = reason
        self.focus = focus
        self.skip_reason: str | None = None
        self._path: Sequence[Entry] = []
        session = ports.session
        if plan is None:
            assert session is not None, "a compaction without a plan needs a session"
            context = session.context()  # first: the path then comes from its builder
            index = context.index
            # The builder's path only grows, so a window on it is the path, without the O(n)
            # copy (issue 9); the list is made only if something reads `path`.
            self._path = (
                window(index.path, 0, index.path_length) if index is not None else session.path()
            )
            planned = plan_compaction(self._path, settings, context=context)
            if isinstance(planned, NothingToCompact):
                self.skip_reason = planned.reason
            else:
                plan = planned
        self.plan = plan
        if plan is not None and session is not None and not kept:
            kept = kept_messages(session, plan)
        self.inputs = CompactionInputs(focus=focus, kept_messages=kept)
        self.supplied: CompactionResult | None = None
        self.parts: tuple[Part, ...] = ()

    def starts_early(self) -> bool:
        """Whether a later summary request may start alongside the first (a split turn's).

        Known before the hooks shape the requests: they change the prompts, not which
        requests there are (the parts are made here the way consulting the hooks makes them).
        """
        if self.plan is None:
            return False
        return starts_early(compaction_parts(self.plan, self.routes, self.inputs))

    @property
    def path(self) -> list[Entry]:
        """The active path the plan was made from, root first (empty with a given plan)."""
        if not isinstance(self._path, list):
            self._path = list(self._path)
        return self._path

    @path.setter
    def path(self, value: list[Entry]) -> None:
        self._path = value

    def start(self) -> Start:
        """``prepared``, with or without work (D12)."""
        if self.plan is None:
            return Start(
                event=OperationEvent.PREPARED,
                facts=OperationFacts(has_work=False),
                data={"reason": self.skip_reason},
            )
        return Start(
            event=OperationEvent.PREPARED,
            facts=OperationFacts(has_work=True),
            data={
                "firstKeptEntryId": self.plan.first_kept_entry_id,
                "tokensBefore": self.plan.tokens_before,
            },
        )

    def hooks_wait(self) -> bool:
        """Whether consulting the hooks may wait: a handler is registered for one of them."""
        hooks = self.ports.hooks
        return hooks.handles("session_before_compact") or hooks.handles("session.compacting")

    async def consult_hooks(self) -> Report:
        """Run ``session_before_compact`` then ``session.compacting`` (D25)."""
        assert self.plan is not None
        if not self.hooks_wait():
            # Nobody listens: no payload to build, and the summary requests as they are.
            self.parts = compaction_parts(self.plan, self.routes, self.inputs)
            return Report(outcome=ReportOutcome.DONE)
        hook = await self.ports.run_hook(
            "session_before_compact",
            {
                "type": "session_before_compact",
                "preparation": self.plan.as_json(),
                "branchEntries": self.path,
                "customInstructions": self.focus,
                "reason": self.reason,
                "willRetry": retries_after(self.reason),
            },
        )
        if hook and hook.get("cancel"):
            return Report(outcome=ReportOutcome.CANCELLED, data={"reason": "Compaction cancelled"})
        session = self.ports.session
        offered = hook.get("compaction") if hook else None
        # The id a supplied compaction keeps from must be on the branch it was planned from.
        branch = None
        if offered is not None and session is not None:
            branch = {entry["id"] for entry in self.path}
        checked = supplied_compaction(offered, self.plan, branch)
        self.ports.hook_result_problems("session_before_compact", checked.problems)
        self.supplied = checked.value
        if self.supplied is not None:
            # The requests as without the hook: the table may refuse its summary (D32) and
            # have a model write one instead.
            self.parts = compaction_parts(self.plan, self.routes, self.inputs)
            return Report(outcome=ReportOutcome.SUPPLIED)
        messages = list(self.plan.messages_to_summarize) + list(self.plan.turn_prefix_messages)
        shaping = await self.ports.run_hook(
            "session.compacting",
            {
                "type": "session.compacting",
                "sessionId": session.session_id if session is not None else None,
                "messages": messages,
            },
        )
        shape = compacting_shape(shaping)
        self.ports.hook_result_problems("session.compacting", shape.problems)
        self.inputs = CompactionInputs(
            focus=self.focus,
            additional_context=shape.value["context"],
            prompt_override=shape.value["prompt"],
            preserve_data=shape.value["preserveData"],
            kept_messages=self.inputs.kept_messages,
        )
        self.parts = compaction_parts(self.plan, self.routes, self.inputs)
        return Report(outcome=ReportOutcome.DONE)

    def hook_summary(self) -> tuple[str, GateSpec]:
        """The summary a hook supplied, and what the gate checks it against (D32)."""
        assert self.supplied is not None
        assert self.plan is not None
        plan = self.plan
        messages = [*plan.messages_to_summarize, *plan.turn_prefix_messages]
        replaced = serialize_conversation(messages) + (plan.previous_summary or "")
        return self.supplied.summary, GateSpec(purpose="hook", input_chars=len(replaced))

    def result(
        self,
        texts: Mapping[str, str],
        models: Mapping[str, str],
        written: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> CompactionResult:
        """The result to commit: the hook's, or the one the parts' texts make.

        ``written``: what each request's attempt reported (its provenance, D32).
        """
        if self.supplied is not None:
            return self.supplied
        assert self.plan is not None
        return compaction_result(self.plan, texts, models, self.inputs, written)

    def entry(self, session: Session, result: Any) -> Entry:
        """The compaction entry that commits ``result`` (built, not added)."""
        return session.new_entry(COMPACTION, result.entry_fields())

    @staticmethod
    def append(session: Session, entry: Entry, expect: Tail | None, *, flush: bool = True) -> None:
        """The commit: one appended, flushed entry (D24), conditional on the planned tail (D27).

        ``flush=False`` leaves the flush (the fsync) to the caller, which runs it off the loop.
        """
        session.add_entry(entry, expect=expect)
        if flush:
            session.flush()


class BranchJob:
    """A branch summary attached at the navigation's new position (D17).

    The navigation consulted ``session_before_tree`` already, so this job asks no hooks.
    """

    kind = "branch_summary"
    reason = "navigation"

    def __init__(
        self,
        routes: SummaryRoutes,
        plan: BranchPlan,
        *,
        new_leaf_id: str | None,
        old_leaf_id: str | None,
        instructions: str | None,
        replace_instructions: bool,
    ) -> None:
        self.plan = plan
        self.new_leaf_id = new_leaf_id
        self.old_leaf_id = old_leaf_id
        self.parts = branch_parts(
            plan, routes, instructions=instructions, replace_instructions=replace_instructions
        )

    def starts_early(self) -> bool:
        """Whether a later summary request may start alongside the first (never, for now)."""
        return starts_early(self.parts)

    def start(self) -> Start:
        """``branch_planned``; a branch without messages needs no model."""
        return Start(
            event=OperationEvent.BRANCH_PLANNED,
            facts=OperationFacts(needs_model=bool(self.parts)),
            data={"oldLeafId": self.old_leaf_id},
        )

    async def consult_hooks(self) -> Report:  # pragma: no cover - no row leads here
        """Branch summaries have no hooks of their own (the navigation asked them)."""
        raise AssertionError("a branch summary consults no hooks")

    def result(
        self,
        texts: Mapping[str, str],
        models: Mapping[str, str],
        written: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> BranchSummaryResult:
        """The branch summary from the model's text (``written``: its provenance, D32)."""
        return branch_result(self.plan, texts, models, written)

    def entry(self, session: Session, result: Any) -> Entry:
        """The branch_summary entry under the new position, ``fromId`` the old leaf (D17)."""
        return session.new_entry(
            BRANCH_SUMMARY,
            branch_summary_fields(
                summary=result.summary,
                from_id=self.old_leaf_id,
                details=result.details,
                short_summary=result.short_summary,
                usage=result.usage,
            ),
            parent_id=self.new_leaf_id,
        )

    @staticmethod
    def append(session: Session, entry: Entry, expect: Tail | None, *, flush: bool = True) -> None:
        """The commit: move the leaf and append the summary there (conditional, D27).

        ``flush=False`` leaves the flush (the fsync) to the caller, which runs it off the loop.
        """
        session.attach_branch_summary(entry, expect=expect)
        if flush:
            session.flush()


class PruneJob:
    """Pruning old tool outputs (D23): one atomic rewrite, no model."""

    kind = "prune"
    reason = "threshold"
    parts: tuple[Part, ...] = ()

    def __init__(self, session: Session) -> None:
        self.session = session
        self.path = session.path()
        self.plan: PrunePlan = plan_prune(self.path)
        self.tokens_saved = 0

    def starts_early(self) -> bool:
        """No summary request: nothing starts early."""
        return False

    def start(self) -> Start:
        """``prune_planned``, with or without candidates."""
        if not self.plan.candidates:
            return Start(
                event=OperationEvent.PRUNE_PLANNED,
                facts=OperationFacts(has_work=False),
                data={"reason": "nothing to prune"},
            )
        return Start(
            event=OperationEvent.PRUNE_PLANNED,
            facts=OperationFacts(has_work=True),
            data={"tokensSaved": self.plan.tokens_saved},
        )

    def pruned(self, now_ms: int) -> list[Entry]:
        """The replacement entries (pure)."""
        return apply_prune(self.plan, self.path, now_ms)

    def rewrite(self, pruned: Sequence[Entry], expect: Tail | None) -> None:
        """The commit: swap the entries and rewrite the file atomically (D4, D27)."""
        self.session.replace_entries(pruned, expect=expect)
        live = set(self.session.context().entry_ids)
        self.tokens_saved = sum(c.savings for c in self.plan.candidates if c.entry_id in live)
