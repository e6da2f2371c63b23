"""A model route wrapped in a model-call span (GenAI attributes)."""

from __future__ import annotations

from orchestrator._core.model import Model, ModelRequest, ModelResponse
from orchestrator._telemetry.tracing import LifecycleTracer


class TracedModel:
    """Delegates to ``model``; every call runs inside :meth:`LifecycleTracer.model_span`.

    Args:
        model: The route to wrap.
        tracer: Where spans go.
    """

    def __init__(self, model: Model, tracer: LifecycleTracer) -> None:
        self.inner = model
        self._tracer = tracer

    @property
    def name(self) -> str:
        """The wrapped route's name."""
        return self.inner.name

    @property
    def context_window(self) -> int:
        """The wrapped route's window."""
        return self.inner.context_window

    @property
    def needs_sibling_timer(self) -> bool:
        """Whether the wrapped route must be timed by a sibling task (see ``LiteLLMModel``)."""
        return bool(getattr(self.inner, "needs_sibling_timer", False))

    @property
    def streams(self) -> bool:
        """Whether the wrapped route streams and keeps its own idle timeout (``Model``)."""
        return bool(getattr(self.inner, "streams", False))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the wrapped route inside a model span.

        Raises:
            ModelError: as the wrapped route raises it (the span is marked as an error).
        """
        with self._tracer.model_span(request, self.inner.name) as call:
            response = await self.inner.complete(request)
            call.record_response(response)
            return response
