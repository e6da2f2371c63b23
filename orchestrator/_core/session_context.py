"""The context a :class:`~orchestrator._core.context.ContextBuilder` hands out, and its count.

A :class:`SessionContext` is an immutable view of one moment of a builder: the messages, their
estimates, the model and thinking level the path selects, and the planning index. Its token
count is pi 1.x's (D6, D29). Kept apart from the builder, which makes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator._core.context_index import ContextIndex
from orchestrator._core.entries import Entry, Message
from orchestrator._core.system_prompt import current_system_message
from orchestrator._core.tokens import ContextTokens, estimate_context_tokens, estimate_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """The model a path selects: ``provider`` and ``modelId``."""

    provider: str
    model_id: str

    def as_json(self) -> dict[str, str]:
        """The inspection-JSON shape."""
        return {"provider": self.provider, "modelId": self.model_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionContext:
    """What the model sees: messages in order, with bookkeeping.

    Attributes:
        messages: Context messages (pi ``AgentMessage`` shapes, verbatim where stored).
        entry_ids: For each message, the id of the entry it came from.
        estimates: For each message, :func:`estimate_tokens`.
        thinking_level: Restored from the path (default ``"off"``).
        model: Restored from the path (last ``model_change`` or assistant wins).
        fresh_from: Index of the first message written after the latest compaction; the
            summary and the kept messages come before it (0 without a compaction).
        index: What planning needs, when a :class:`ContextBuilder` made this context.
    """

    messages: Sequence[Message]
    entry_ids: Sequence[str]
    estimates: Sequence[int]
    thinking_level: str
    model: ModelRef | None
    fresh_from: int = 0
    index: ContextIndex | None = field(default=None, repr=False, compare=False)

    def tokens(self) -> ContextTokens:
        """The context's token count, as pi 1.x projects it (D6, D29).

        The last valid provider usage anchors the count, and only what came after it is
        estimated, unless that usage was recorded at or before the latest compaction or context
        edit: it then measured a context that no longer exists, and the count is the estimate
        of every message (the current system prompt once, as the model receives it).
        ``stale_usage`` says a usage was set aside that way.
        """
        view = self.index
        counted = estimate_context_tokens(
            self.messages,
            self.estimates,
            fresh_from=self.fresh_from,
            prefix=view.prefix if view is not None else None,
        )
        if view is None:
            return counted
        estimate = _projected_estimate(self.messages, self.estimates, view)
        at = counted.last_usage_index
        if at is not None and view.positions[at] > view.last_invalidating:
            return ContextTokens(
                tokens=counted.tokens,
                usage_tokens=counted.usage_tokens,
                trailing_tokens=counted.trailing_tokens,
                last_usage_index=at,
                estimated_tokens=estimate,
            )
        return ContextTokens(
            tokens=estimate,
            usage_tokens=0,
            trailing_tokens=estimate,
            last_usage_index=None,
            stale_usage=at is not None,
            estimated_tokens=estimate,
            stale_usage_tokens=counted.tokens if at is not None else 0,
        )


def _projected_estimate(
    messages: Sequence[Message], estimates: Sequence[int], view: ContextIndex
) -> int:
    # Every message's estimate, but the system messages counted as their replay: one prompt.
    total = view.prefix[view.count] - view.prefix[0]
    if not view.system:
        return total
    total -= sum(estimates[k] for k in view.system)
    current = current_system_message(messages[k] for k in view.system)
    return total + (estimate_tokens(current) if current is not None else 0)


def model_from_change(entry: Entry) -> ModelRef | None:
    """The model a ``model_change`` entry selects, else ``None``.

    D1: both shapes. pi: provider + modelId. OMP: model "provider/id" with a role; only the
    default role selects the session's model.
    """
    provider, model_id = entry.get("provider"), entry.get("modelId")
    if isinstance(provider, str) and isinstance(model_id, str):
        return ModelRef(provider=provider, model_id=model_id)
    combined = entry.get("model")
    if isinstance(combined, str) and entry.get("role") in (None, "default"):
        provider, _, model_id = combined.partition("/")
        if model_id:
            return ModelRef(provider=provider, model_id=model_id)
    return None
