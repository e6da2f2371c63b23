"""Plan and apply tool-output pruning without a model (oh-my-pi's pruneToolOutputs; decision D23).

Theory of operation. Old tool outputs are the cheapest tokens to give back: the assistant already
acted on them. Walking the path newest first, the newest ``protect_tokens`` of tool results stay
untouched, as do results of protected tools (``read`` output is what the agent edits against;
``skill`` output is instructions). Older results become candidates, and they are pruned only if
together they save at least ``minimum_savings`` tokens, so a rewrite of the file is never made for
a trifle.

Unlike OMP, pruning loses nothing (D23): the context shows the notice
``[Output truncated - N tokens]``, and the original content is kept in the entry under
``prunedContent``. :func:`apply_prune` builds new entry dicts and never mutates the old ones; the
caller swaps them in (``SessionTree.replace``) and rewrites the file atomically (D4).

Like OMP I scan the whole path, including entries before the last compaction, which are not in
the context: their savings are counted although the context does not shrink by them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator._core.entries import Entry, role_of
from orchestrator._core.tokens import estimate_tokens

PROTECT_TOKENS = 40_000
MINIMUM_SAVINGS = 20_000
PROTECTED_TOOLS = ("skill", "read")


def prune_notice(tokens: int) -> str:
    """The text a pruned tool result shows instead of its output."""
    return f"[Output truncated - {tokens} tokens]"


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneCandidate:
    """One tool result to prune.

    Attributes:
        entry_id: The ``message`` entry holding the tool result.
        tokens: Its estimated tokens before pruning (the number in the notice).
        savings: ``tokens`` minus the notice's own tokens, at least 0.
    """

    entry_id: str
    tokens: int
    savings: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunePlan:
    """What pruning would change. An empty plan changes nothing.

    Attributes:
        candidates: Results to prune, newest first (the walk's order).
        tokens_saved: Total savings; 0 when under ``minimum_savings``.
    """

    candidates: tuple[PruneCandidate, ...] = ()
    tokens_saved: int = 0

    @property
    def pruned_count(self) -> int:
        """How many results would be pruned."""
        return len(self.candidates)


def _savings(tokens: int) -> int:
    return max(0, tokens - math.ceil(len(prune_notice(tokens)) / 4))


def plan_prune(
    path: Sequence[Entry],
    protect_tokens: int = PROTECT_TOKENS,
    minimum_savings: int = MINIMUM_SAVINGS,
    protected_tools: Iterable[str] = PROTECTED_TOOLS,
) -> PrunePlan:
    """Choose the tool results to prune on ``path`` (as oh-my-pi's pruneToolOutputs).

    Args:
        path: The active path, root first.
        protect_tokens: Newest tool-result tokens never pruned.
        minimum_savings: Prune only when the candidates save at least this much.
        protected_tools: Tool names whose results are never pruned.

    Returns:
        The plan; empty when there is nothing worth pruning. Already pruned results count
        toward the protected tokens and are never pruned again.
    """
    protected = frozenset(protected_tools)
    accumulated = 0
    candidates: list[PruneCandidate] = []
    for entry in reversed(path):
        if role_of(entry) != "toolResult":
            continue
        message: Mapping[str, Any] = entry["message"]
        tokens = estimate_tokens(message)
        eligible = (
            message.get("prunedAt") is None
            and accumulated >= protect_tokens
            and message.get("toolName") not in protected
        )
        accumulated += tokens
        if eligible:
            candidates.append(
                PruneCandidate(entry_id=entry["id"], tokens=tokens, savings=_savings(tokens))
            )
    saved = sum(c.savings for c in candidates)
    if not candidates or saved < minimum_savings:
        return PrunePlan()
    return PrunePlan(candidates=tuple(candidates), tokens_saved=saved)


def apply_prune(plan: PrunePlan, path: Sequence[Entry], now_ms: int) -> list[Entry]:
    """Build the pruned versions of the plan's entries (D23).

    Args:
        plan: From :func:`plan_prune` on the same path.
        path: The path the plan was made for.
        now_ms: The ``prunedAt`` time, the same for every entry.

    Returns:
        New entry dicts, in path order, one per candidate: the message's ``content`` becomes the
        notice and gains ``prunedAt``; the entry keeps the original content in ``prunedContent``.
        The given entries are not modified.
    """
    tokens_by_id = {c.entry_id: c.tokens for c in plan.candidates}
    pruned: list[Entry] = []
    for entry in path:
        tokens = tokens_by_id.get(entry.get("id", ""))
        if tokens is None:
            continue
        message = dict(entry["message"])
        original = message.get("content")
        message["content"] = [{"type": "text", "text": prune_notice(tokens)}]
        message["prunedAt"] = now_ms
        pruned.append({**entry, "message": message, "prunedContent": original})
    return pruned
