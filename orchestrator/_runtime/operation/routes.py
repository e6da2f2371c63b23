"""Model routes from plain settings: which models summaries go to.

The command line, the RPC server and the runtime all build their :class:`SummaryRoutes` here, so
the rule is in one place: models named by the user become litellm routes (in the order given,
the first is the current model, D21); a remote endpoint takes history summaries; and with no
model at all, the built-in offline summarizer answers, so everything works with no key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator._core.model import Model, Purpose
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._runtime.operation.retry import AttemptRecord, RetryPolicy
from orchestrator._runtime.operation.summarize import SummaryRoutes


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSettings:
    """How to reach the summarizer.

    Attributes:
        models: litellm model ids, best first; empty means the offline summarizer.
        api_base: Base URL for every litellm route (a proxy or a local server).
        api_key: Key for every litellm route (``None``: litellm's usual variables).
        context_window: The summarizer's window (0: unknown).
        remote_url: The remote summary endpoint, if any.
        reserve_tokens: The compaction reserve.
        retry: Retry policy.
        short_summary: Also write a one-or-two sentence short summary.
        offline_fallback: After the summary gate refused every candidate, the offline
            summarizer writes the summary (D32); off, the operation fails.
    """

    models: Sequence[str] = ()
    api_base: str | None = None
    api_key: str | None = None
    context_window: int = 0
    remote_url: str | None = None
    reserve_tokens: int = 16384
    retry: RetryPolicy = RetryPolicy()
    short_summary: bool = False
    offline_fallback: bool = True


def candidate_models(settings: RouteSettings) -> tuple[Model, ...]:
    """The candidate routes for ``settings`` (the offline summarizer when none are named)."""
    if not settings.models:
        return (OfflineSummarizer(),)
    from orchestrator._models.litellm import LiteLLMModel

    return tuple(
        LiteLLMModel(
            name,
            api_base=settings.api_base,
            api_key=settings.api_key,
            # Not given: litellm's bundled model map knows the window and reasoning support of
            # the common models (D14 budgets the summary request with it).
            context_window=settings.context_window or None,
            reasoning_supported=None,
        )
        for name in settings.models
    )


async def close_routes(routes: SummaryRoutes) -> None:
    """Close what the routes hold open (the remote route's HTTP client); safe to call twice."""
    for model in (*routes.candidates, routes.remote):
        aclose = getattr(model, "aclose", None)
        if aclose is not None:
            await aclose()


def build_summarizer(
    settings: RouteSettings, *, on_attempt: Callable[[AttemptRecord, Purpose], None] | None = None
) -> SummaryRoutes:
    """The :class:`SummaryRoutes` for ``settings``."""
    remote: Model | None = None
    if settings.remote_url:
        from orchestrator._models.remote import RemoteSummaryModel

        remote = RemoteSummaryModel(settings.remote_url, context_window=settings.context_window)
    return SummaryRoutes(
        candidates=candidate_models(settings),
        reserve_tokens=settings.reserve_tokens,
        retry=settings.retry,
        remote=remote,
        on_attempt=on_attempt,
        short_summary=settings.short_summary,
        gate=True,
        # With no model named, the offline summarizer is the candidate already.
        fallback=OfflineSummarizer() if settings.offline_fallback and settings.models else None,
    )
