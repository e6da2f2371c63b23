"""The names a machine table may use: guards and effects.

A table in ``machines/*.toml`` never holds an expression. Its rows name guards and effects, and
this module is the registry those names resolve against, so a table cannot
run code we did not write and a typo fails at load instead of at the worst moment.

*Guards* are pure predicates over the frozen facts record the caller passes with each event, one
record type per machine (:class:`TurnFacts`, :class:`OperationFacts`, :class:`NavigationFacts`,
:class:`SessionFacts`). They read nothing else: no clock, no file, no session. That keeps the
machines deterministic, so a recorded trace replays through them, and so they could run unchanged
inside a durable-workflow engine.

*Effects* are only names here. The engine returns the effect names of the transition it took and
the runtime driver performs them, in order. Each machine has its own vocabulary, with one line per
effect saying what the driver is expected to do.

Each machine has its own record and its own guard registry (:data:`GUARDS`, by machine name).
One flat record for every machine was simpler to write, but it let a driver set a field no guard
of its machine reads (the fact was silently ignored) and a table name a guard of another machine
(it would read a default that nothing ever sets). Split, a driver builds only the facts its table
can read, mypy checks each guard against its machine's fields, the loader refuses a table that
names another machine's guard, and the engine refuses facts of the wrong machine at the step. Two
names mean the same thing in two machines and are registered in both (``retries_left`` in the
turn and the operation, ``turn_running`` in the navigation and the session); each record carries
its own copy of the fields they read. A property test still draws every field of a record at
random with ``hypothesis.strategies.builds``.

A field keeps its name in every record that has it, and its default: journals and traces record
the facts as the fields that differ from the defaults, so a journal written when the record was
one flat ``Facts`` reads back unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

# D14: halve the summary request at most this many times.
MAX_SHRINK_ATTEMPTS = 3

# D32: a candidate whose summary the gate refused is asked again once, told why.
MAX_REFUSALS_PER_CANDIDATE = 1

# D19: at most one automatic compaction per user turn.
MAX_AUTO_COMPACTIONS_PER_TURN = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFacts:
    """What the turn driver knows when it fires an event (``machines/turn.toml``).

    Attributes:
        compaction_enabled: Automatic compaction is switched on (D5: ``enabled=false`` turns every
            automatic path off).
        over_threshold: The context is over the compaction threshold, measured after the reply
            (or after pruning, or after an automatic compaction committed, when the driver
            re-measures).
        context_full: A reply stopped by the length limit came back with the context full, which
            D18 treats as an overflow.
        overflow_attempted: Overflow recovery already ran in this user turn (D18).
        auto_compactions: Automatic compactions already run in this user turn (D19).
        retry_attempt: Agent retries already made for the current transient error streak.
        max_retries: The retry budget (``retry.maxRetries``).
        will_retry: The compaction in progress was started to retry the turn after an overflow.
        auto_continue: After a threshold compaction, continue with the D20 custom message.
    """

    compaction_enabled: bool = True
    over_threshold: bool = False
    context_full: bool = False
    overflow_attempted: bool = False
    auto_compactions: int = 0
    retry_attempt: int = 0
    max_retries: int = 3
    will_retry: bool = False
    auto_continue: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationFacts:
    """What the operation driver knows when it fires an event (``machines/operation.toml``).

    Attributes:
        has_work: Preparation found something to compact or summarize (D12).
        retryable: The failed summarizer attempt is a transient error worth retrying (D21).
        retry_attempt: Retries already made with the current candidate model.
        max_retries: The retry budget (``retry.maxRetries``).
        delay_ms: The delay the next retry would wait (``baseDelayMs * 2^attempt``, raised to any
            retry-after hint).
        max_delay_ms: Above this delay, move to the next candidate model instead (D21: 30 s).
        delay_cap_ms: On the last candidate, a wait longer than this fails instead (60 s).
        more_candidates: Another candidate model remains untried (D21).
        shrink_attempts: Times the summary request was halved after a summarizer overflow (D14).
        needs_model: The operation has at least one summary to ask a model for (a branch with
            no messages, or a split turn with nothing older, commits fixed text instead).
        more_parts: Another summary request of the same operation is still to be made (the
            turn prefix of a split turn, the short summary).
        gate_enabled: Summaries are checked before they are committed (D32). Off by default, so
            a journal written before the gate replays through the rows it took.
        refused_check: The gate check the summary failed (D32). No guard reads it: it rides
            with the step so the journal and the trace say which check refused.
        refusals: Times the gate already refused this candidate's answer to this request.
        fallback_left: The offline summarizer is configured and not yet asked (D32).
        entry_present: On reopen, the operation's committed entry is already in the file (D24).
    """

    has_work: bool = True
    retryable: bool = False
    retry_attempt: int = 0
    max_retries: int = 3
    delay_ms: int = 0
    max_delay_ms: int = 30_000
    delay_cap_ms: int = 60_000
    more_candidates: bool = False
    shrink_attempts: int = 0
    needs_model: bool = True
    more_parts: bool = False
    gate_enabled: bool = False
    refused_check: str = ""
    refusals: int = 0
    fallback_left: bool = False
    entry_present: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigationFacts:
    """What the navigation driver knows when it fires an event (``machines/navigation.toml``).

    Attributes:
        same_position: The navigation target is the current leaf.
        wants_summary: The user asked for a branch summary.
        has_entries: The abandoned branch holds entries to summarize.
        turn_running: An agent turn (or a manual compaction) is in progress.
    """

    same_position: bool = False
    wants_summary: bool = False
    has_entries: bool = False
    turn_running: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionFacts:
    """What a host knows when it asks the session machine to admit a request (``session.toml``).

    Attributes:
        turn_running: An agent turn (or a manual compaction) is in progress.
        compaction_running: A manual compaction is in progress.
        navigation_running: A tree navigation is in progress.
        session_open: The server has the session open as its own.
    """

    turn_running: bool = False
    compaction_running: bool = False
    navigation_running: bool = False
    session_open: bool = False


Facts = TurnFacts | OperationFacts | NavigationFacts | SessionFacts
"""Any machine's facts record (what the engine steps with; a machine takes only its own)."""

F = TypeVar("F", TurnFacts, OperationFacts, NavigationFacts, SessionFacts)

Guard = Callable[[Any], bool]
"""A guard as the engine calls it; each registry below types its guards on its own record."""


class GuardSet(Mapping[str, Callable[[F], bool]], Generic[F]):
    """One machine's guard registry: guard name to predicate, and the facts record they read.

    Args:
        machine: The machine these guards belong to.
        facts: The record type its guards read (the engine refuses any other).
        guards: Guard name to predicate.
    """

    __slots__ = ("_guards", "facts", "machine")
    machine: str
    facts: type[F]
    _guards: Mapping[str, Callable[[F], bool]]

    def __init__(self, machine: str, facts: type[F], guards: Mapping[str, Callable[[F], bool]]):
        self.machine = machine
        self.facts = facts
        self._guards = MappingProxyType(dict(guards))

    def __getitem__(self, name: str) -> Callable[[F], bool]:
        return self._guards[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._guards)

    def __len__(self) -> int:
        return len(self._guards)

    def __repr__(self) -> str:
        return f"GuardSet({self.machine!r}, {self.facts.__name__}, {sorted(self._guards)})"


# The facts of an event whose rows read none: one shared value per record, so a trace or a
# journal sees at once that there is no delta to record.
NO_TURN_FACTS = TurnFacts()
NO_OPERATION_FACTS = OperationFacts()
NO_NAVIGATION_FACTS = NavigationFacts()
NO_SESSION_FACTS = SessionFacts()


def _may_auto_compact(facts: TurnFacts) -> bool:
    return facts.compaction_enabled and facts.auto_compactions < MAX_AUTO_COMPACTIONS_PER_TURN


def _may_recover_overflow(facts: TurnFacts) -> bool:
    # D18: one overflow recovery per user turn. D19: at most one automatic compaction per turn,
    # whatever its reason; an overflow after this turn's threshold compaction ends the turn with
    # guidance rather than compacting a second time (no compaction loops).
    return (
        facts.compaction_enabled
        and not facts.overflow_attempted
        and facts.auto_compactions < MAX_AUTO_COMPACTIONS_PER_TURN
    )


def _turn_retries_left(f: TurnFacts) -> bool:
    return f.retry_attempt < f.max_retries


def _operation_retries_left(f: OperationFacts) -> bool:
    return f.retry_attempt < f.max_retries


TURN_GUARDS: GuardSet[TurnFacts] = GuardSet(
    "turn",
    TurnFacts,
    {
        "auto_continue": lambda f: f.auto_continue,
        "compaction_enabled": lambda f: f.compaction_enabled,
        "context_full": lambda f: f.context_full,
        "may_auto_compact": _may_auto_compact,
        "may_recover_overflow": _may_recover_overflow,
        "over_threshold": lambda f: f.over_threshold,
        "retries_left": _turn_retries_left,
        "will_retry": lambda f: f.will_retry,
    },
)

OPERATION_GUARDS: GuardSet[OperationFacts] = GuardSet(
    "operation",
    OperationFacts,
    {
        "delay_within_cap": lambda f: f.delay_ms <= f.delay_cap_ms,
        "delay_within_limit": lambda f: f.delay_ms <= f.max_delay_ms,
        "entry_present": lambda f: f.entry_present,
        "fallback_left": lambda f: f.fallback_left,
        "gate_enabled": lambda f: f.gate_enabled,
        "has_work": lambda f: f.has_work,
        "may_ask_again": lambda f: f.refusals < MAX_REFUSALS_PER_CANDIDATE,
        "may_shrink": lambda f: f.shrink_attempts < MAX_SHRINK_ATTEMPTS,
        "more_candidates": lambda f: f.more_candidates,
        "more_parts": lambda f: f.more_parts,
        "needs_model": lambda f: f.needs_model,
        "retries_left": _operation_retries_left,
        "retryable": lambda f: f.retryable,
    },
)

NAVIGATION_GUARDS: GuardSet[NavigationFacts] = GuardSet(
    "navigation",
    NavigationFacts,
    {
        "has_entries": lambda f: f.has_entries,
        "same_position": lambda f: f.same_position,
        "turn_running": lambda f: f.turn_running,
        "wants_summary": lambda f: f.wants_summary,
    },
)

SESSION_GUARDS: GuardSet[SessionFacts] = GuardSet(
    "session",
    SessionFacts,
    {
        "compaction_running": lambda f: f.compaction_running,
        "navigation_running": lambda f: f.navigation_running,
        "session_open": lambda f: f.session_open,
        "turn_running": lambda f: f.turn_running,
    },
)

GUARDS: Mapping[str, GuardSet[Any]] = MappingProxyType(
    {
        "turn": TURN_GUARDS,
        "operation": OPERATION_GUARDS,
        "navigation": NAVIGATION_GUARDS,
        "session": SESSION_GUARDS,
    }
)
"""Each machine's guard registry, by machine name: the guards its table may name."""


_TURN_EFFECTS = {
    "start_turn": "append the user message and reset the per-turn facts (D18, D19)",
    "call_agent": "run the agent (model call and tools) on the current context",
    "stop_agent": "cancel the agent run and wait until it has settled (D22)",
    "omit_failed_attempt": "write context_edits omitting the failed reply and its tool results",
    "prune_tool_outputs": "prune old tool outputs, then re-measure the context (D23)",
    "start_threshold_compaction": "emit auto_compaction_start(threshold), run one compaction (D19)",
    "start_overflow_compaction": "emit auto_compaction_start(overflow), compact to retry (D18)",
    "cancel_compaction": "cancel the compaction operation and wait until it has settled (D22)",
    "emit_compaction_end": "emit auto_compaction_end (skipped, with its reason, when it was)",
    "emit_compaction_still_over": "emit auto_compaction_end with stillOverThreshold (D19)",
    "emit_compaction_aborted": "emit auto_compaction_end with aborted=true",
    "emit_compaction_failed": "emit auto_compaction_end with 'Auto-compaction failed: ...'",
    "emit_recovery_failed": "emit auto_compaction_end with 'Context overflow recovery failed: ...'",
    "emit_overflow_failed": "emit auto_compaction_end: recovery failed after one attempt (D18)",
    "emit_retry_start": "emit auto_retry_start with attempt, delay and error",
    "emit_retry_end": "emit auto_retry_end with the final error",
    "end_retry_streak": "a reply came back: the retry streak, if one is open, ends (success=true)",
    "fail_retry_streak": "the retry streak, if one is open, ends with the reply's error",
    "sleep_retry": "wait before retrying the agent (cancellable, D22)",
    "cancel_retry_wait": "cancel the retry wait only (D22)",
    "append_continue_message": "append the 'auto-continue' custom_message entry (D20)",
    "resume_turn": "report that the agent may go on; the 'resume' row calls it (D18, D20)",
    "start_manual_compaction": "run one manual compaction operation; the turn is not resumed",
    "report_manual_result": "hand the manual compaction's outcome (or error) to its caller",
    "close_session": "release the session (flush, unlock)",
}

_OPERATION_EFFECTS = {
    "run_hooks": "run session_before_compact and session.compacting handlers (D25)",
    "call_model": "ask the current candidate model for the current summary request",
    "next_candidate": "move to the next candidate model and reset the retry count (D21)",
    "next_part": "move to the operation's next summary request (first candidate, no retries)",
    "shrink_request": "halve the summary request's prompt allowance after an overflow (D14)",
    "check_summary": "run the summary gate on the answer; report passed, or the failed check (D32)",
    "check_hook_summary": "run the summary gate on a hook's summary, as a hook's text (D32)",
    "drop_hook_result": "set the hook's refused summary aside: summarize as without the hook",
    "ask_again": "ask the same candidate again, the refused check named in the prompt (D32)",
    "use_fallback": "move the request to the offline summarizer, the last resort (D32)",
    "sleep_retry": "wait before the next attempt (cancellable, D22)",
    "stop_work": "cancel the model call or wait in flight and wait until it settled (D22)",
    "append_entry": "append the compaction or branch_summary entry (D24); a dry run reports it",
    "rewrite_entries": "rewrite the pruned tool results in place, atomically (D23)",
    "rebuild_context": "rebuild the live context from the new leaf",
    "emit_result": "report the operation's outcome to the caller, the hooks and listeners",
}

_NAVIGATION_EFFECTS = {
    "collect_entries": "collect the abandoned branch's entries (collectEntriesForBranchSummary)",
    "run_hooks": "run session_before_tree handlers (D25)",
    "stop_hooks": "cancel the session_before_tree handlers in flight and wait until they settled",
    "start_summary": "run one branch-summary operation (operation.toml)",
    "cancel_summary": "cancel the branch-summary operation; the session is untouched (D22)",
    "switch_leaf": "move the leaf (branch or resetLeaf)",
    "switch_leaf_with_summary": "attach the branch_summary under the new position (D17)",
    "rebuild_context": "rebuild the live context from the new leaf",
    "emit_session_tree": "apply any label, run the session_tree hook, emit session_tree",
}

_SESSION_EFFECTS = {
    "refuse_prompt_while_navigating": "refuse the prompt: a navigation runs (BusyError)",
    "refuse_second_compaction": "refuse the compaction: a manual one runs (BusyError)",
    "refuse_compaction_while_navigating": "refuse the compaction: a navigation runs (BusyError)",
    "refuse_navigation_while_working": "refuse the navigation: a turn or compaction runs",
    "refuse_second_navigation": "refuse the navigation: another one runs (BusyError)",
    "refuse_hosted_on_open_session": "refuse pi's summary: the server has the session open",
    "refuse_close_while_busy": "refuse to close: a turn or a compaction runs (BusyError)",
    "refuse_close_while_navigating": "refuse to close: a navigation runs (BusyError)",
}

EFFECTS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "turn": MappingProxyType(_TURN_EFFECTS),
        "operation": MappingProxyType(_OPERATION_EFFECTS),
        "navigation": MappingProxyType(_NAVIGATION_EFFECTS),
        "session": MappingProxyType(_SESSION_EFFECTS),
    }
)
"""Each machine's effect vocabulary: effect name to what the driver does for it."""

INTERRUPTS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "turn": frozenset({"abort", "manual_compact"}),
        "operation": frozenset({"cancel", "deadline_passed"}),
        "navigation": frozenset({"cancel", "deadline_passed"}),
        "session": frozenset(),
    }
)
"""The events a machine's host may request while an effect is in flight (``interrupt``)."""

STOPPING: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "turn": frozenset({"stop_agent", "cancel_compaction", "cancel_retry_wait"}),
        "operation": frozenset({"stop_work"}),
        "navigation": frozenset({"stop_hooks"}),
        "session": frozenset(),
    }
)
"""The effects that cancel the work in flight (a row with one always stops it).

``cancel_summary`` is not one: it asks the branch-summary operation to cancel through its own
table and waits for it to settle, which may still commit.
"""
