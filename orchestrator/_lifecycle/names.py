"""Each machine's states and events as types, checked against its table when the table loads.

The tables in ``machines/*.toml`` are the source of truth for what a machine does; these enums
are what the Python code may *say* about it. A driver that compares a state or fires an event
writes ``OperationState.COMMITTED`` rather than ``"committed"``, so a typo is a type error, and
:func:`check_vocabulary` (run by the loader) fails a table that names a state or an event the code
does not know, or that drops a state the code still names. Events may be missing from a table (a
mutated test table without a row, say): an event nobody answers is refused at run time as any
other refused event is.

What an effect reports before its machine translates it into an event is one more enum,
:class:`ReportOutcome`, shared by the machines (it names no table word, so the loader does not
check it; each driver's translation maps it to its events).

Members are :class:`enum.StrEnum`, so each equals its name as a plain string: the journal, the
traces, the JSON-RPC answers and the Temporal payloads keep the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class TurnState(StrEnum):
    """The states of ``machines/turn.toml``."""

    IDLE = "idle"
    RUNNING = "running"
    PRUNING = "pruning"
    COMPACTING = "compacting"
    RETRYING = "retrying"
    CONTINUING = "continuing"
    MANUAL_COMPACTING = "manual_compacting"
    CLOSED = "closed"


class TurnEvent(StrEnum):
    """The events ``machines/turn.toml`` answers."""

    USER_PROMPT = "user_prompt"
    FOLLOW_UP = "follow_up"
    MANUAL_COMPACT = "manual_compact"
    CLOSE = "close"
    AGENT_DONE = "agent_done"
    OVERFLOW = "overflow"
    REPLY_TRUNCATED = "reply_truncated"
    TRANSIENT_ERROR = "transient_error"
    FATAL_ERROR = "fatal_error"
    ABORT = "abort"
    PRUNED = "pruned"
    RETRY_WAIT_DONE = "retry_wait_done"
    COMPACTION_DONE = "compaction_done"
    COMPACTION_SKIPPED = "compaction_skipped"
    COMPACTION_FAILED = "compaction_failed"
    COMPACTION_CANCELLED = "compaction_cancelled"
    RESUME = "resume"
    ACTIVITY_FAILED = "activity_failed"


class OperationState(StrEnum):
    """The states of ``machines/operation.toml``."""

    PREPARING = "preparing"
    CONSULTING_HOOKS = "consulting_hooks"
    SUMMARIZING = "summarizing"
    CHECKING = "checking"
    CHECKING_HOOK = "checking_hook"
    WAITING_RETRY = "waiting_retry"
    COMMITTING = "committing"
    COMMITTED = "committed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    SKIPPED = "skipped"
    CONFLICT = "conflict"


class OperationEvent(StrEnum):
    """The events ``machines/operation.toml`` answers."""

    PREPARED = "prepared"
    HOOKS_DONE = "hooks_done"
    HOOK_SUPPLIED = "hook_supplied"
    HOOKS_CANCELLED = "hooks_cancelled"
    BRANCH_PLANNED = "branch_planned"
    PRUNE_PLANNED = "prune_planned"
    SUMMARY_READY = "summary_ready"
    ATTEMPT_FAILED = "attempt_failed"
    SUMMARY_OVERFLOW = "summary_overflow"
    SUMMARY_PASSED = "summary_passed"
    SUMMARY_REFUSED = "summary_refused"
    WAIT_DONE = "wait_done"
    ENTRY_APPENDED = "entry_appended"
    APPEND_CONFLICT = "append_conflict"
    APPEND_FAILED = "append_failed"
    CANCEL = "cancel"
    DEADLINE_PASSED = "deadline_passed"
    REOPENED = "reopened"


class NavigationState(StrEnum):
    """The states of ``machines/navigation.toml``."""

    IDLE = "idle"
    COLLECTING = "collecting"
    CONSULTING_HOOKS = "consulting_hooks"
    SUMMARIZING = "summarizing"
    SWITCHING_LEAF = "switching_leaf"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"
    REFUSED = "refused"


class NavigationEvent(StrEnum):
    """The events ``machines/navigation.toml`` answers."""

    NAVIGATE = "navigate"
    COLLECTED = "collected"
    HOOKS_CANCELLED = "hooks_cancelled"
    HOOK_SUPPLIED = "hook_supplied"
    HOOKS_DONE = "hooks_done"
    SUMMARY_COMMITTED = "summary_committed"
    SUMMARY_SKIPPED = "summary_skipped"
    SUMMARY_CANCELLED = "summary_cancelled"
    SUMMARY_FAILED = "summary_failed"
    CANCEL = "cancel"
    DEADLINE_PASSED = "deadline_passed"
    SWITCHED = "switched"


class SessionState(StrEnum):
    """The states of ``machines/session.toml``."""

    ASKED = "asked"
    ADMITTED = "admitted"
    REFUSED = "refused"


class SessionEvent(StrEnum):
    """The requests ``machines/session.toml`` admits or refuses."""

    PROMPT = "prompt"
    COMPACT = "compact"
    NAVIGATE = "navigate"
    FORK = "fork"
    HOSTED = "hosted"
    CLOSE = "close"


class ReportOutcome(StrEnum):
    """What an effect reports (``Report.outcome``): its result in words, never a state.

    Each machine's driver translates an outcome into one of its events (``outcomes.py``,
    ``operation/driver.py``, ``navigation/core.py``); the words are shared by the machines, so
    they are one type. A model failure's outcome is its error class's kind
    (:data:`~orchestrator._core.errors.MODEL_ERRORS`).
    """

    OK = "ok"
    TRANSIENT = "transient"
    TIMEOUT = "timeout"
    OVERFLOW = "overflow"
    TRUNCATED = "truncated"
    EMPTY = "empty"
    FATAL = "fatal"
    REFUSED = "refused"
    CANCELLED = "cancelled"
    CONFLICT = "conflict"
    FAILED = "failed"
    DONE = "done"
    SUPPLIED = "supplied"
    PASSED = "passed"
    STOPPED = "stopped"
    COMMITTED = "committed"
    SKIPPED = "skipped"


VOCABULARY: Mapping[str, tuple[type[StrEnum], type[StrEnum]]] = MappingProxyType(
    {
        "turn": (TurnState, TurnEvent),
        "operation": (OperationState, OperationEvent),
        "navigation": (NavigationState, NavigationEvent),
        "session": (SessionState, SessionEvent),
    }
)
"""Each machine's (states, events) enums, by machine name."""


def vocabulary_problem(
    machine: str, states: tuple[str, ...], events: tuple[str, ...]
) -> str | None:
    """Say how a table's names disagree with the code's enums, or return None when they agree.

    A machine with no enums registered (a table a test or an extension made up) is not checked.
    """
    known = VOCABULARY.get(machine)
    if known is None:
        return None
    state_type, event_type = known
    state_names = {s.value for s in state_type}
    event_names = {e.value for e in event_type}
    unknown_states = [s for s in states if s not in state_names]
    if unknown_states:
        return f"state {unknown_states[0]!r} is not a {state_type.__name__} the code knows"
    missing = [s for s in state_names if s not in states]
    if missing:
        return f"[states] does not declare {sorted(missing)[0]!r}, which the code still names"
    unknown_events = [e for e in events if e not in event_names]
    if unknown_events:
        return f"event {unknown_events[0]!r} is not a {event_type.__name__} the code knows"
    return None
