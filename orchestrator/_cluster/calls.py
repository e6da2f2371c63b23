"""What the session workflow and its activities exchange (issue 10).

The workflow's side of :mod:`~orchestrator._cluster.contract` (whose theory of operation covers
both): each activity's argument and report, the journal lines they carry, and the ids the
workflow fixes before an activity writes. They are apart from the client's records because no
client ever sees them: they only travel between the workflow and a worker. An activity reads the
session from the shared store itself, at the tail the operation planned from
(:attr:`Op.expect_last_id`), so every activity of one operation sees the same session whatever
worker runs it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from orchestrator._cluster.contract import NavigateRequest
from orchestrator._lifecycle.names import ReportOutcome
from orchestrator._runtime.driver import Report
from orchestrator._runtime.turn.replies import Verdict

STORE_UNAVAILABLE = "StoreUnavailable"
"""The failure type of an activity whose store connection failed under it (retryable)."""


def entry_id_for(operation_id: str) -> str:
    """The id of the entry an operation commits, derived from the operation id.

    The workflow fixes it before the commit activity runs, so a commit retried after a crash
    finds its own entry instead of appending a second one.
    """
    return derived_id(operation_id, "commit")


def derived_id(operation_id: str, what: str) -> str:
    """The id of the entry ``what`` an operation or navigation writes, derived from its id.

    Fixed by the workflow before the activity that writes it runs: a write delivered again
    after a worker crash finds its own entry and does not write a second one.
    """
    return hashlib.sha256(f"{operation_id}:{what}".encode()).hexdigest()[:8]


def message_id_for(key: str) -> str:
    """The id of a message a turn appends, derived from the turn's run, call and position.

    The workflow fixes it before the append activity runs, so an append delivered again after
    a worker died finds the messages it already wrote instead of appending them twice.
    """
    return hashlib.sha256(f"{key}:message".encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalLine:
    """One machine step, as the workflow hands it to an activity to journal.

    Attributes:
        seq: The step's number in its operation, from 0 (a resent line is written once).
        source: State before.
        event: Event fired.
        dest: State after.
        effects: The row's effects.
        facts: What the guards read (only the fields that differ from the defaults).
        data: Small facts (entry id, reason, error, model).
        machine: The machine that stepped (``operation`` or ``navigation``).
    """

    seq: int
    source: str
    event: str
    dest: str
    effects: list[str]
    facts: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    machine: str = "operation"


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operation, as every activity of it sees it.

    Attributes:
        session_id: The session.
        operation_id: The operation's id (journal, idempotent commit).
        reason: ``manual``, ``threshold`` or ``overflow``.
        focus: The user's instructions.
        expect_last_id: The id of the last stored entry when the operation planned.
        expect_length: The stored length then (the conditional append's other half, D27).
        planned: Whether the plan was made (``expect_*`` are meaningful).
        additional_context: Lines a ``session.compacting`` hook added.
        prompt_override: A hook's prompt.
        preserve_data: Hook data to carry.
        supplied: A compaction a ``session_before_compact`` hook supplied (its JSON).
        kind: ``compaction``, ``branch_summary`` (a navigation's summary of the branch it
            leaves; then ``reason`` is ``navigation`` and the ``branch`` fields say which), or
            ``prune`` (old tool outputs before a threshold compaction, D23).
        branch: The branch summary's navigation (``kind == "branch_summary"``).
    """

    session_id: str
    operation_id: str
    reason: str = "manual"
    focus: str | None = None
    expect_last_id: str | None = None
    expect_length: int = 0
    planned: bool = False
    additional_context: list[str] = field(default_factory=list)
    prompt_override: str | None = None
    preserve_data: dict[str, Any] | None = None
    supplied: dict[str, Any] | None = None
    kind: str = "compaction"
    branch: Nav | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """An activity's argument: the operation, the steps to journal first, and the effect's own.

    Attributes:
        op: The operation.
        journal: Steps not yet journaled, in order (written before the effect performs).
        resend: Some of ``journal`` may already be written (an earlier activity was lost):
            the writer skips the lines whose ``seq`` it finds.
        part: The summary request's index (``call_model``).
        candidate: The candidate model's index (``call_model``).
        halvings: Times the request was halved (``call_model``, D14).
        feedback: What the gate refused in this candidate's last answer (``call_model``, D32).
        offline: The request goes to the offline fallback (``call_model``, D32).
        texts: The summary texts so far, by purpose.
        models: The models that wrote them, by purpose (``commit``).
        written: Each request's provenance, by purpose (``commit``, D32).
        entry_id: The entry the commit appends (``commit``).
        status: The final state (``finish``).
        compact_failed: ``session_compact_failed``'s payload, when the compaction's ending
            tells that hook (``finish``; :mod:`~orchestrator._runtime.operation.compact_hooks`).
        early: Also start the first attempt of every later independent request (a split turn's
            prefix) alongside this one, as one process does (``call_model``, the operation's
            first call).
        turn: The steps of the turn that started the operation not yet journaled, written
            first (``prepare``), so no activity of their own is needed.
    """

    op: Op
    journal: list[JournalLine] = field(default_factory=list)
    resend: bool = False
    part: int = 0
    candidate: int = 0
    halvings: int = 0
    feedback: str = ""
    offline: bool = False
    texts: dict[str, str] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    entry_id: str | None = None
    status: str | None = None
    compact_failed: dict[str, Any] | None = None
    early: bool = False
    turn: TurnCall | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What the workflow needs from the worker's routes to decide (recorded in the history).

    Attributes:
        enabled: Retries are on.
        max_retries: Retries per candidate.
        base_delay_ms: The first wait.
        switch_after_ms: A longer wait moves to the next candidate (D21).
        max_delay_ms: On the last candidate, a longer wait fails.
        timeout_s: Per model call to a route that answers in one piece (``None``: no limit);
            recorded, as the worker's activity applies it.
        deadline_s: Per operation (``None``: no limit); it also bounds a model call activity.
        gate: Summaries are checked before they are committed (D32). The worker always
            reports its routes' setting (on unless turned off); the default is off because a
            history recorded before the gate has no such field and must replay as it ran.
        fallback: The offline summarizer is the last resort after refusals (D32).
    """

    enabled: bool = True
    max_retries: int = 3
    base_delay_ms: int = 2000
    switch_after_ms: int = 30_000
    max_delay_ms: int = 60_000
    timeout_s: float | None = None
    deadline_s: float | None = None
    gate: bool = False
    fallback: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """``prepare``'s report: the start event, and where the session ended.

    Attributes:
        event: The start event (``prepared``).
        facts: Its facts (non-default fields).
        data: What the journal records with it.
        expect_last_id: The last stored entry's id.
        expect_length: The stored length.
        policy: The worker's retry policy and time limits.
        routes: Candidates per summary request, when no hooks will say (a branch summary).
        pruned_ids: The entries a prune rewrites (journaled before it does, D24).
    """

    event: str
    facts: dict[str, Any]
    data: dict[str, Any]
    expect_last_id: str | None
    expect_length: int
    policy: Policy
    routes: list[int] = field(default_factory=list)
    pruned_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    """An effect's report (the cluster form of :class:`~orchestrator._runtime.driver.Report`).

    Attributes:
        outcome: ``ok``, ``transient``, ``overflow``, ``conflict``, ``done``, ``supplied`` ...
        retry_after: A provider's retry-after hint, seconds.
        error: The failure as one line.
        data: Small facts for the journal.
        text: The summary text (``call_model``, ``ok``).
        purpose: The summary request's purpose (``call_model``).
        routes: Candidates per summary request (``run_hooks``).
        op: The operation as the hooks shaped it (``run_hooks``).
        result: The committed compaction's fields (``commit``).
        tokens_saved: Context tokens the prune saved (``rewrite``).
        gate: What the summary is checked against (``call_model``, ``ok``; D32).
        early: The first attempts of later requests started alongside (``call_model`` with
            ``early``), by the request's index.
    """

    outcome: str
    retry_after: float | None = None
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    purpose: str = ""
    routes: list[int] = field(default_factory=list)
    op: Op | None = None
    result: dict[str, Any] | None = None
    tokens_saved: int = 0
    gate: dict[str, Any] | None = None
    early: dict[str, Reported] = field(default_factory=dict)

    @classmethod
    def of(cls, report: Report, **extra: Any) -> Reported:
        """The cluster form of ``report``, with the ``extra`` fields of this effect."""
        return cls(
            outcome=report.outcome,
            retry_after=report.retry_after,
            error=report.error,
            data=dict(report.data),
            **extra,
        )

    def report(self) -> Report:
        """The :class:`~orchestrator._runtime.driver.Report` the tables' translation reads."""
        return Report(
            outcome=ReportOutcome(self.outcome),
            retry_after=self.retry_after,
            error=self.error,
            data=self.data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnPolicy:
    """What the workflow needs from the worker's settings to decide a turn (recorded).

    Attributes:
        has_agent: The worker has an agent (else a prompt is refused, as without ``--model``).
        compaction_enabled: Automatic compaction is on.
        auto_continue: A threshold compaction continues the turn (D20).
        max_retries: Agent retries for a transient error (0: retries off).
        base_delay_ms: The first retry wait.
        continue_text: The auto-continue message's text (D20).
        prune: Prune old tool outputs before a threshold compaction (D23).
        context_window: The window the threshold is measured against.
        reserve_tokens: The threshold's reserve (``contextWindow - reserveTokens``).
        threshold_percent: The threshold as a percent of the window, when set (D5).
        threshold_tokens: The threshold in tokens, when set (D5; wins over the percent).
    """

    has_agent: bool
    compaction_enabled: bool = True
    auto_continue: bool = True
    max_retries: int = 3
    base_delay_ms: int = 2000
    continue_text: str = ""
    prune: bool = False
    context_window: int = 0
    reserve_tokens: int = 16384
    # Absent from histories recorded before they existed: ``None`` there, as the worker's
    # default, so those histories replay to the same decisions.
    threshold_percent: float | None = None
    threshold_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEntry:
    """An entry a turn appends, its id fixed by the workflow.

    Attributes:
        entry_id: The derived id (:func:`message_id_for`).
        message: A ``message`` entry's message, as JSON text (Temporal's converter sorts an
            object's keys; the text keeps the agent's order, so both hosts store the same bytes).
        custom_type: A ``custom_message`` entry's type (then ``content`` and ``display``).
        content: The custom message's content.
        display: Whether the custom message is shown.
        omits: A ``context_edit`` entry's target: the entry it omits from the context
            (``replacement: null``, D18).
    """

    entry_id: str
    message: str | None = None
    custom_type: str | None = None
    content: str = ""
    display: bool = False
    omits: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCall:
    """A turn activity's argument: the session, the turn steps to journal first, its own.

    Attributes:
        session_id: The session.
        run_id: The turn run whose steps ``journal`` holds.
        journal: Turn steps not yet journaled, in order.
        resend: Some of ``journal`` may already be written (an earlier activity was lost).
        entries: What ``append`` appends, in order.
        dropped: Entry ids the agent's context leaves out. Only a call an older worker scheduled
            (before a retry wrote its omission, D21) carries any; the field stays so that such
            a call still decodes and means what it meant.
        compact_failed: ``session_compact_failed``'s payload for ``journal_turn`` to tell the
            worker's hooks (overflow recovery giving up, D18).
    """

    session_id: str
    run_id: str = ""
    journal: list[JournalLine] = field(default_factory=list)
    resend: bool = False
    entries: list[NewEntry] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    compact_failed: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentReported:
    """``call_agent``'s report: the run's messages (not yet appended) and what the reply means.

    Attributes:
        outcome: ``ok``, ``overflow``, ``truncated``, ``transient`` or ``fatal``; ``stopped``
            when the workflow cancelled the run (then only ``messages`` is meaningful).
        error: The failure as one line.
        messages: The messages the agent yielded, in order, each as JSON text.
        over_threshold: The context is over the compaction threshold after the reply.
        context_full: A truncated reply came back with the context full.
        retries_ended: No longer read (the turn table's rows end a retry streak); kept so the
            histories recorded with it still decode.
    """

    outcome: str
    error: str = ""
    messages: list[str] = field(default_factory=list)
    over_threshold: bool = False
    context_full: bool = False
    retries_ended: bool | None = None

    @classmethod
    def judged(cls, verdict: Verdict, messages: list[str]) -> AgentReported:
        """The report of a run whose last reply ``verdict`` judged."""
        return cls(messages=messages, **verdict.fields())

    def verdict(self) -> Verdict:
        """What the reply means, as the turn core reads it."""
        return Verdict(
            **{k: getattr(self, k) for k in Verdict.__dataclass_fields__},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Nav:
    """One navigation, as every activity of it sees it.

    Attributes:
        session_id: The session.
        navigation_id: The navigation's id (journal, the ids of the entries it writes).
        request: What was asked (hooks may change instructions and label).
        old_leaf_id: The leaf when the navigation started.
        new_leaf_id: Where the leaf goes (``None``: before the first entry).
        editor_text: Text for the editor (a user or custom message target).
        expect_last_id: The last stored entry's id when the navigation started (D27).
        expect_length: The stored length then.
        ancestor_id: The common ancestor of the old leaf and the target.
        entry_count: How many entries the abandoned branch holds.
        supplied: A summary a ``session_before_tree`` hook supplied (its JSON).
    """

    session_id: str
    navigation_id: str
    request: NavigateRequest
    old_leaf_id: str | None = None
    new_leaf_id: str | None = None
    editor_text: str | None = None
    expect_last_id: str | None = None
    expect_length: int = 0
    ancestor_id: str | None = None
    entry_count: int = 0
    supplied: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NavCall:
    """A navigation activity's argument.

    Attributes:
        nav: The navigation.
        journal: Steps not yet journaled (written before the effect performs).
        resend: Some of ``journal`` may already be written (see :class:`Call`).
        entry_id: The entry the activity writes, when it writes one (fixed by the workflow).
        with_summary: The switch attaches the summary a hook supplied (else it only moves).
        label_id: The label entry's id (``emit``).
        summary_entry_id: The branch summary attached, if any (``emit``).
        from_extension: That summary came from a hook (``emit``).
    """

    nav: Nav
    journal: list[JournalLine] = field(default_factory=list)
    resend: bool = False
    entry_id: str | None = None
    with_summary: bool = False
    label_id: str | None = None
    summary_entry_id: str | None = None
    from_extension: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NavReported:
    """A navigation activity's report.

    Attributes:
        outcome: ``ok``, or the hooks' ``done`` / ``supplied`` / ``cancelled``.
        nav: The navigation as the activity completed it (position, hooks' changes).
        leaf_id: The leaf after the activity's write (``emit``).
        short_summary: The summary entry's short summary (``emit``).
    """

    outcome: str
    nav: Nav | None = None
    leaf_id: str | None = None
    short_summary: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkCall:
    """The ``fork`` activity's argument.

    Attributes:
        session_id: The session forked.
        entry_id: The user message to fork before.
        new_session_id: The new session's id.
    """

    session_id: str
    entry_id: str
    new_session_id: str
