"""Plan a compaction without calling a model (pi's prepareCompaction; D6, D7, D8, D11, D12).

Theory of operation. :func:`plan_compaction` is pi's ``prepareCompaction``: it reads the active
path and decides what the summary covers and what stays verbatim. It returns a frozen
:class:`CompactionPlan`, or :class:`NothingToCompact` with the exact reason a manual request
reports. The executor takes the plan plus a model; nothing here awaits, reads a clock or a file.

The *window* is the part of the path the next compaction is responsible for. pi starts it just
after the previous compaction entry, so the entries that compaction had kept (from its
``firstKeptEntryId`` up to it) fall outside: neither summarized nor kept, they vanish (pi#2608).
D8 starts the window at the previous compaction's first kept entry instead. The previous
compaction entry then sits inside the window; it is never a cut point, never counted, and never a
message to summarize: its summary travels as ``previous_summary`` and the summarizer updates it.

Inside the window the path splits into three consecutive parts, with nothing lost:

``[window start, history end)``  summarized into the history summary,
``[turn start, first kept)``     the split turn's prefix, summarized separately (may be empty),
``[first kept, end of path)``    kept verbatim.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from orchestrator._core.context import (
    ContextIndex,
    SessionContext,
    build_context,
    chosen,
    window,
)
from orchestrator._core.cut_point import Projection, find_cut_point
from orchestrator._core.entries import COMPACTION, Entry, Message
from orchestrator._core.file_ops import (
    FileOperations,
    compute_file_lists,
    file_ops_from_details,
)
from orchestrator._core.tokens import (
    CompactionSettings,
    calculate_prompt_tokens,
    compaction_threshold,
    should_compact,
    valid_usage,
)
from orchestrator._core.window import ComparesAsTuple, Window

_ID = operator.itemgetter("id")

ALREADY_COMPACTED = "Already compacted"
NOTHING_TO_COMPACT = "Nothing to compact (session too small)"


@dataclass(frozen=True, slots=True, kw_only=True)
class NothingToCompact:
    """Why there is no compaction to make (D12): no model is called.

    Attributes:
        reason: :data:`ALREADY_COMPACTED` or :data:`NOTHING_TO_COMPACT`.
    """

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPlan:
    """What a compaction summarizes and keeps (pi ``CompactionPreparation``).

    Attributes:
        first_kept_entry_id: The new compaction's ``firstKeptEntryId``.
        is_split_turn: The cut falls inside a turn whose start is summarized as a turn prefix.
        turn_start_entry_id: The entry opening the split turn, else ``None``.
        summarize_entry_ids: Entries of ``messages_to_summarize``, one per message, path order.
        turn_prefix_entry_ids: Entries of ``turn_prefix_messages``, one per message, path order.
        messages_to_summarize: Messages for the history summary (with their serialized lengths
            when planned from a context's index: a :class:`MeasuredMessages`).
        turn_prefix_messages: Messages for the turn-prefix summary (empty unless split).
            These four are read-only windows on the context's lists when planned from a context
            (O(1), not copies; :class:`~orchestrator._core.window.Window`): they compare equal
            to the tuples of their items.
        kept_entry_ids: Every entry from the first kept one to the end of the path.
        kept_messages: The context messages of those entries (a window, when planned from a
            context: the short summary reads them, and the after-estimate counts them).
        tokens_before: Context tokens before compacting (D6: last usage + trailing estimate).
        previous_summary: The previous compaction's summary, to be updated. With a split turn
            and nothing else to summarize it must survive, not become "No prior history." (D11).
        previous_compaction_id: The previous compaction entry on the path, if any.
        read_files: Files read and never modified (sorted, cumulative).
        modified_files: Files written or edited (sorted, cumulative).
        keep_recent_tokens: As configured.
        effective_keep_recent_tokens: After the measured-ratio adaptation (D7).
        previous_preserve_data: The previous compaction's ``preserveData`` (OMP), if any.
    """

    first_kept_entry_id: str
    is_split_turn: bool
    turn_start_entry_id: str | None
    summarize_entry_ids: Sequence[str] = field(repr=False)
    turn_prefix_entry_ids: Sequence[str] = field(repr=False)
    messages_to_summarize: Sequence[Message] = field(repr=False)
    turn_prefix_messages: Sequence[Message] = field(repr=False)
    kept_entry_ids: Sequence[str] = field(repr=False)
    kept_messages: Sequence[Message] = field(repr=False)
    tokens_before: int
    previous_summary: str | None
    previous_compaction_id: str | None
    read_files: tuple[str, ...]
    modified_files: tuple[str, ...]
    keep_recent_tokens: int
    effective_keep_recent_tokens: int
    previous_preserve_data: Mapping[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        """The ``compaction`` object of ``orchestrator plan --json`` (inspection-json.md)."""
        return {
            "firstKeptEntryId": self.first_kept_entry_id,
            "isSplitTurn": self.is_split_turn,
            "turnStartEntryId": self.turn_start_entry_id,
            "summarizeEntryIds": list(self.summarize_entry_ids),
            "turnPrefixEntryIds": list(self.turn_prefix_entry_ids),
            "tokensBefore": self.tokens_before,
            "previousSummary": self.previous_summary,
            "readFiles": list(self.read_files),
            "modifiedFiles": list(self.modified_files),
        }


def last_compaction_index(path: Sequence[Entry]) -> int:
    """Index of the last ``compaction`` entry on the path, ``-1`` if none."""
    for i in range(len(path) - 1, -1, -1):
        if path[i].get("type") == COMPACTION:
            return i
    return -1


def window_start(path: Sequence[Entry], previous_index: int) -> int:
    """First index the next compaction covers (D8): the previous compaction's first kept entry.

    When that entry is not on the path before the compaction, the context kept nothing before it
    (pi's buildSessionContext), so the window starts just after the compaction.
    """
    if previous_index < 0:
        return 0
    kept_id = path[previous_index].get("firstKeptEntryId")
    for i in range(previous_index):
        if path[i].get("id") == kept_id:
            return i
    return previous_index + 1


def effective_keep_recent_tokens(
    path: Sequence[Entry], settings: CompactionSettings, context: SessionContext | None = None
) -> int:
    """``keep_recent_tokens`` adapted to the measured usage/estimate ratio (D7, as oh-my-pi does).

    When the provider counts more tokens than chars/4 says, keeping N *estimated* tokens keeps
    more than N real ones, so I keep proportionally fewer. The ratio compares the last valid
    usage's prompt tokens with the estimate of exactly what that request sent: the context
    messages before it. OMP divides by the estimate of the whole window, including the reply and
    what followed, which understates the ratio. A usage measured before the last compaction
    described a context that no longer exists, so it does not count.

    Returns:
        The budget to keep, at least 1; the configured value when adaptation is off, there is no
        usable usage, or the ratio is at most 1.
    """
    keep = settings.keep_recent_tokens
    if not settings.adaptive_keep:
        return keep
    context, view = _indexed(path, context)
    index = context.tokens().last_usage_index
    if index is None:
        return keep
    previous = view.last_compaction
    if previous >= 0:
        # Stale: the usage's entry is not on the path after the last compaction.
        at = view.position_of(context.entry_ids[index])
        if at is None or at <= previous:
            return keep
    usage = valid_usage(context.messages[index])
    estimate = view.estimate_before(index)
    if usage is None or estimate <= 0:
        return keep
    ratio = calculate_prompt_tokens(usage) / estimate
    if not math.isfinite(ratio) or ratio <= 1:
        return keep
    return max(1, math.floor(keep / ratio))


def _indexed(
    path: Sequence[Entry], context: SessionContext | None
) -> tuple[SessionContext, ContextIndex]:
    """The context of ``path`` with its planning index: the caller's when it fits, else built."""
    if context is not None and context.index is not None and context.index.matches(path):
        return context, context.index
    built = build_context(path)
    assert built.index is not None  # the builder always indexes
    return built, built.index


def plan_compaction(
    path: Sequence[Entry],
    settings: CompactionSettings,
    *,
    context: SessionContext | None = None,
) -> CompactionPlan | NothingToCompact:
    """Decide what a compaction of ``path`` summarizes and keeps (pi's prepareCompaction).

    Args:
        path: The active path, root first (``SessionTree.path()``).
        settings: Compaction settings (``keep_recent_tokens``, ``adaptive_keep``).
        context: The context built from ``path``, when the caller already has it.

    Returns:
        The plan, or :class:`NothingToCompact` when the last entry is already a compaction, or
        when nothing would be summarized (D12: then no model may be called).
    """
    if path and path[-1].get("type") == COMPACTION:
        return NothingToCompact(reason=ALREADY_COMPACTED)
    # The caller may pass the path's context when it already has it (a live session keeps it
    # incrementally); rebuilding it is most of the planning cost on a long session. Everything
    # below reads the context's index, so planning walks only the kept part and the summarized
    # range's file operations, never the whole window.
    context, view = _indexed(path, context)
    previous_index = view.last_compaction
    start, end = _window_start(path, view), len(path)
    keep = effective_keep_recent_tokens(path, settings, context)
    spent_at = view.budget_position(keep)
    projection = Projection(path, view, context.messages)
    cut = find_cut_point(path, start, end, keep, spent_at=spent_at, projection=projection)
    first_kept = path[cut.first_kept_index] if cut.first_kept_index < end else None
    if first_kept is None or not first_kept.get("id"):
        return NothingToCompact(reason=NOTHING_TO_COMPACT)
    history_end = cut.turn_start_index if cut.is_split_turn else cut.first_kept_index
    lo, history_hi = view.messages_between(start, history_end)
    prefix_lo, hi = view.messages_between(history_end, cut.first_kept_index)
    # System messages are prompt state, not conversation: never summarized (pi 1.x).
    history = view.conversation(lo, history_hi)
    prefix = view.conversation(prefix_lo, hi)
    if not history and not prefix:
        return NothingToCompact(reason=NOTHING_TO_COMPACT)
    previous = path[previous_index] if previous_index >= 0 else None
    seed = file_ops_from_details(previous) if previous is not None else FileOperations()
    found = view.file_operations(lo, hi)
    read_files, modified_files = compute_file_lists(
        seed.union(
            FileOperations(
                read=frozenset(found["read"]),
                written=frozenset(found["write"]),
                edited=frozenset(found["edit"]),
            )
        )
    )
    summary = previous.get("summary") if previous is not None else None
    preserve = previous.get("preserveData") if previous is not None else None
    return CompactionPlan(
        first_kept_entry_id=first_kept["id"],
        is_split_turn=cut.is_split_turn,
        turn_start_entry_id=path[cut.turn_start_index]["id"] if cut.is_split_turn else None,
        summarize_entry_ids=chosen(context.entry_ids, history),
        turn_prefix_entry_ids=chosen(context.entry_ids, prefix),
        messages_to_summarize=view.measured(context.messages, history),
        turn_prefix_messages=view.measured(context.messages, prefix),
        kept_entry_ids=_KeptIds(Window(path, cut.first_kept_index, end - cut.first_kept_index)),
        # Every kept entry is in the context (the cut is inside the window), in path order from
        # `hi`; the previous compaction, if kept, gives no message there either.
        kept_messages=window(context.messages, hi, view.count),
        tokens_before=context.tokens().tokens,
        previous_summary=summary if isinstance(summary, str) else None,
        previous_compaction_id=previous["id"] if previous is not None else None,
        read_files=read_files,
        modified_files=modified_files,
        keep_recent_tokens=settings.keep_recent_tokens,
        effective_keep_recent_tokens=keep,
        previous_preserve_data=preserve if isinstance(preserve, dict) else None,
    )


class _KeptIds(ComparesAsTuple[str]):
    """The ids of a window of path entries, read when asked.

    A plan keeps most of a long path, and reading every kept entry's id at planning touched
    each of them, cold (issue 9); what reads them (a trace's count, the tests) is rarer.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Window[Entry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return tuple(map(_ID, self._entries[index]))
        return str(self._entries[index]["id"])

    def __iter__(self) -> Iterator[str]:
        return map(_ID, self._entries)


def _window_start(path: Sequence[Entry], view: ContextIndex) -> int:
    """:func:`window_start`, read from the index: where the context's entries begin (D8)."""
    return view.context_start if view.last_compaction >= 0 else 0


def plan_report(
    path: Sequence[Entry],
    settings: CompactionSettings,
    context_window: int | None,
    *,
    context: SessionContext | None = None,
) -> dict[str, Any]:
    """The whole ``orchestrator plan --json`` object (inspection-json.md).

    Args:
        path: The active path, root first.
        settings: Compaction settings.
        context_window: The model's window; ``None`` leaves ``threshold`` and
            ``shouldCompact`` null.
        context: The context built from ``path``, when the caller has it (a lean one: see
            :mod:`~orchestrator._core.lean`); otherwise built here.

    Returns:
        A JSON-ready dict with camelCase keys.
    """
    context, _ = _indexed(path, context)
    counted = context.tokens()
    plan = plan_compaction(path, settings, context=context)
    # D29: a usage from before the latest compaction never triggers one; the estimate decides.
    trusted = counted.trusted_tokens
    return {
        "leafId": path[-1]["id"] if path else None,
        "keepRecentTokens": settings.keep_recent_tokens,
        "effectiveKeepRecentTokens": effective_keep_recent_tokens(path, settings, context),
        "contextTokens": counted.tokens,
        "threshold": (
            compaction_threshold(context_window, settings) if context_window is not None else None
        ),
        "shouldCompact": (
            None if context_window is None else should_compact(trusted, context_window, settings)
        ),
        "compaction": plan.as_json() if isinstance(plan, CompactionPlan) else None,
        "reason": plan.reason if isinstance(plan, NothingToCompact) else None,
        "staleUsage": counted.stale_usage,
        "estimatedTokens": counted.estimated_tokens,
        "staleUsageTokens": counted.stale_usage_tokens,
    }
