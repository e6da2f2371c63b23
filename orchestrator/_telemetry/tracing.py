"""OpenTelemetry tracing of the lifecycle: turn, operation and model-call spans, steps as events.

Theory of operation
-------------------

Tracing is an observer: the runtime driver opens a span around each turn,
each operation (compaction, branch summary, prune) and each model call, and hands every machine
:class:`~orchestrator._lifecycle.machine.Step` to :meth:`LifecycleTracer.on_step`, which adds one
``transition`` event (``machine``, ``from``, ``to``, ``trigger``, ``effects``) to the innermost
open span of *that* machine: operation steps land on the operation span even while a model-call
span is open inside it. A step whose machine has no open span lands on the current span, if any.

The open spans per machine live in a :class:`contextvars.ContextVar`, not on the tracer: anyio
tasks each see their own copy of the context, so two sessions driven concurrently by one tracer
never put events on each other's spans.

I never touch the global ``TracerProvider``: a library that sets it fights its host. The tracer
takes a provider, or ``None`` for a no-op tracer that costs almost nothing. Model-call spans carry
the GenAI semantic-convention attribute names, defined here as our own constants because the
semconv package keeps them in a private, deprecated module.

Beside them every span carries the OpenInference attributes that LLM dashboards such as Arize
Phoenix read where the GenAI names differ: ``openinference.span.kind`` (a turn is an ``AGENT``, an
operation or a navigation a ``CHAIN``, a model call an ``LLM``), ``llm.model_name``,
``llm.token_count.prompt/completion/total``, ``session.id``, and ``input.value`` /
``output.value``. An operation's input and output are its own facts (kind, reason; outcome, token
counts), as JSON. A model call's input and output are the prompt and the reply, which are session
content: they are recorded only when content capture is on (``capture_content=True``, or the
GenAI convention's ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).

Exporters (the end of this module): JSON lines into a folder (the ``traces/`` convention, with
:func:`read_trace` to compare recordings), the console, and OTLP over HTTP configured by the
standard ``OTEL_*`` variables. :func:`make_tracer_provider` wires one up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracer,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
)
from opentelemetry.util.types import AttributeValue

from orchestrator._core.errors import Cancelled, ModelError, error_name
from orchestrator._core.model import ModelRequest, ModelResponse
from orchestrator._core.redact import redact
from orchestrator._lifecycle.guards import (
    NO_NAVIGATION_FACTS,
    NO_OPERATION_FACTS,
    NO_SESSION_FACTS,
    NO_TURN_FACTS,
    Facts,
)
from orchestrator._lifecycle.machine import Step

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ERROR_TYPE = "error.type"

OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
LLM_MODEL_NAME = "llm.model_name"
LLM_PROVIDER = "llm.provider"
LLM_INVOCATION_PARAMETERS = "llm.invocation_parameters"
LLM_TOKEN_COUNT_PROMPT = "llm.token_count.prompt"
LLM_TOKEN_COUNT_COMPLETION = "llm.token_count.completion"
LLM_TOKEN_COUNT_TOTAL = "llm.token_count.total"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
SESSION_ID = "session.id"
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_JSON = "application/json"
_TEXT = "text/plain"

TRANSITION_EVENT = "transition"
TRACER_NAME = "orchestrator"

_ACTIVE: ContextVar[Mapping[str, Span]] = ContextVar(
    "orchestrator_machine_spans", default=MappingProxyType({})
)


@dataclass(frozen=True, slots=True)
class SpanHandle:
    """An open span and the attribute prefix of its kind (``orchestrator.operation.`` ...).

    Attributes:
        span: The OpenTelemetry span.
        prefix: Prepended to the keys given to :meth:`set`.
    """

    span: Span
    prefix: str

    def set(self, **attrs: Any) -> None:
        """Set attributes under this span's prefix; ``None`` values are skipped."""
        set_attributes(self, **attrs)


@dataclass(frozen=True, slots=True)
class ModelCall(SpanHandle):
    """The span of one model call; record the reply with :meth:`record_response`.

    Attributes:
        capture_content: Record the reply's text as ``output.value``.
    """

    capture_content: bool = False

    def record_response(self, response: ModelResponse) -> None:
        """Set the response attributes: finish reason (pi's vocabulary), usage, model.

        GenAI names, plus OpenInference's token counts (the total includes cache reads and
        writes, as pi's ``totalTokens`` does) and, with content capture on, the reply.
        """
        if not self.span.is_recording():
            return  # nothing would keep the attributes
        usage = response.usage
        total = usage.total or usage.input + usage.output + usage.cache_read + usage.cache_write
        attributes: dict[str, AttributeValue] = {
            GEN_AI_RESPONSE_FINISH_REASONS: (response.stop_reason,),
            GEN_AI_USAGE_INPUT_TOKENS: usage.input,
            GEN_AI_USAGE_OUTPUT_TOKENS: usage.output,
            LLM_TOKEN_COUNT_PROMPT: usage.input,
            LLM_TOKEN_COUNT_COMPLETION: usage.output,
            LLM_TOKEN_COUNT_TOTAL: total,
        }
        if response.model:
            attributes[GEN_AI_RESPONSE_MODEL] = response.model
        if response.provider:
            attributes[LLM_PROVIDER] = response.provider
        if self.capture_content:
            attributes[OUTPUT_VALUE] = response.text
            attributes[OUTPUT_MIME_TYPE] = _TEXT
        self.span.set_attributes(attributes)


# What the spans of a tracer without a provider yield: handles on the invalid span, which
# records nothing.
_OFF_HANDLES = {
    kind: SpanHandle(INVALID_SPAN, f"orchestrator.{kind}.")
    for kind in ("turn", "operation", "navigation")
}
_OFF_MODEL_CALL = ModelCall(INVALID_SPAN, "orchestrator.model.")


def set_attributes(target: SpanHandle | Span, **attrs: Any) -> None:
    """Set attributes on a handle (keys get its prefix) or on a bare span (keys as given).

    Values that OpenTelemetry cannot hold are turned into strings; sequences become tuples;
    ``None`` is skipped, because "unknown" is better shown by absence than by a fake value.

    Args:
        target: A :class:`SpanHandle` or a span.
        **attrs: The attributes, e.g. ``tokens_before=1200, outcome="committed"``.
    """
    span, prefix = (target.span, target.prefix) if isinstance(target, SpanHandle) else (target, "")
    for key, value in attrs.items():
        if value is not None:
            span.set_attribute(prefix + key, _attribute(value))


def _attribute(value: Any) -> AttributeValue:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        # OpenTelemetry wants one primitive type per sequence; mixed ones become strings.
        if len({type(v) for v in value}) == 1 and isinstance(value[0], str | bool | int | float):
            return tuple(value)
        return tuple(str(v) for v in value)
    return str(value)


_BLANK_FACTS: dict[type, Facts] = {
    type(blank): blank
    for blank in (NO_TURN_FACTS, NO_OPERATION_FACTS, NO_NAVIGATION_FACTS, NO_SESSION_FACTS)
}
_FACT_DEFAULTS = {
    kind: tuple((f.name, getattr(blank, f.name)) for f in dataclasses.fields(blank))
    for kind, blank in _BLANK_FACTS.items()
}
"""Each facts record's fields with their defaults, read once (every machine step asks)."""


def facts_delta(facts: Facts) -> dict[str, Any]:
    """The fields of ``facts`` that differ from its record's defaults.

    The field names are the same in every record that has them, so a journal line reads the same
    as when all machines shared one flat record.
    """
    kind = type(facts)
    if facts is _BLANK_FACTS[kind]:
        return {}  # most steps of an operation: no field to compare
    return {
        name: value
        for name, default in _FACT_DEFAULTS[kind]
        if (value := getattr(facts, name)) != default
    }


def capture_content_from_env() -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for message content."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def _operation_output(span: Span, prefix: str) -> str | None:
    # The outcome attributes the runtime set through the handle, as one JSON object: what a
    # dashboard shows as the operation's output. Only SDK spans can be read back.
    attributes = getattr(span, "attributes", None)
    if not attributes:
        return None
    facts = {
        key.removeprefix(prefix): value
        if isinstance(value, str | bool | int | float)
        else list(value)
        for key, value in attributes.items()
        if key.startswith(prefix) and key.removeprefix(prefix) not in ("kind", "id", "reason")
    }
    return json.dumps(facts, sort_keys=True) if facts else None


class LifecycleTracer:
    """Opens lifecycle spans and turns machine steps into span events.

    Args:
        provider: Where spans go; ``None`` makes every method a no-op.
        capture_content: Record prompts and replies on model-call spans (``input.value``,
            ``output.value``). ``None`` reads the environment variable
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``; off by default, because they
            are the session's content.
    """

    def __init__(
        self, provider: TracerProvider | None, *, capture_content: bool | None = None
    ) -> None:
        self._tracer: Tracer = (
            NoOpTracer() if provider is None else provider.get_tracer(TRACER_NAME)
        )
        # Without a provider nothing is built: no attributes, no span, no context change (a
        # span the caller opened stays current and gets no events from us; issue 9).
        self._off = provider is None
        self.capture_content = (
            capture_content_from_env() if capture_content is None else capture_content
        )

    @contextmanager
    def turn_span(self, session_id: str, turn_no: int) -> Iterator[SpanHandle]:
        """Open the span of one agent turn; turn steps go on it.

        Yields:
            Its handle; attributes set through it get the ``orchestrator.turn.`` prefix.
        """
        if self._off:
            yield _OFF_HANDLES["turn"]
            return
        attrs: dict[str, AttributeValue] = {
            "orchestrator.session.id": session_id,
            "orchestrator.turn.number": turn_no,
            OPENINFERENCE_SPAN_KIND: "AGENT",
            SESSION_ID: session_id,
        }
        with self._span("turn", "orchestrator.turn", attrs, machine="turn") as handle:
            yield handle

    @contextmanager
    def operation_span(
        self, kind: str, operation_id: str, reason: str | None = None
    ) -> Iterator[SpanHandle]:
        """Open the span of one compaction, branch summary or prune; operation steps go on it.

        Set ``tokens_before``, ``tokens_after``, ``summarized``, ``kept``, ``attempts``,
        ``model`` and ``outcome`` through the handle as they become known.

        Yields:
            Its handle; attributes get the ``orchestrator.operation.`` prefix.
        """
        if self._off:
            yield _OFF_HANDLES["operation"]
            return
        attrs: dict[str, AttributeValue] = {
            "orchestrator.operation.kind": kind,
            "orchestrator.operation.id": operation_id,
            OPENINFERENCE_SPAN_KIND: "CHAIN",
            INPUT_VALUE: json.dumps({"kind": kind, "operation_id": operation_id, "reason": reason}),
            INPUT_MIME_TYPE: _JSON,
        }
        if reason is not None:
            attrs["orchestrator.operation.reason"] = reason
        with self._span("operation", f"orchestrator.{kind}", attrs, machine="operation") as handle:
            try:
                yield handle
            finally:
                output = _operation_output(handle.span, handle.prefix)
                if output is not None:
                    handle.span.set_attributes({OUTPUT_VALUE: output, OUTPUT_MIME_TYPE: _JSON})

    @contextmanager
    def navigation_span(self, session_id: str, target_id: str | None) -> Iterator[SpanHandle]:
        """Open the span of one tree navigation; navigation steps go on it.

        Yields:
            Its handle; attributes get the ``orchestrator.navigation.`` prefix.
        """
        if self._off:
            yield _OFF_HANDLES["navigation"]
            return
        attrs: dict[str, AttributeValue] = {
            "orchestrator.session.id": session_id,
            OPENINFERENCE_SPAN_KIND: "CHAIN",
            SESSION_ID: session_id,
        }
        if target_id is not None:
            attrs["orchestrator.navigation.target_id"] = target_id
        with self._span(
            "navigation", "orchestrator.navigation", attrs, machine="navigation"
        ) as handle:
            yield handle

    @contextmanager
    def model_span(self, request: ModelRequest, model_name: str) -> Iterator[ModelCall]:
        """Open the span of one model call, with the GenAI and OpenInference request attributes.

        With content capture on, the request's prompt (its last user message) is ``input.value``.

        A :class:`~orchestrator.ModelError` escaping the block marks the span as an error with
        ``error.type`` set to the error's kind, and is re-raised.

        Yields:
            A :class:`ModelCall`; call :meth:`ModelCall.record_response` with the reply.
        """
        if self._off:
            yield _OFF_MODEL_CALL
            return
        operation = "chat" if request.purpose == "chat" else "summarize"
        attrs: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_REQUEST_MODEL: model_name,
            GEN_AI_REQUEST_MAX_TOKENS: request.max_tokens,
            "orchestrator.model.purpose": request.purpose,
            OPENINFERENCE_SPAN_KIND: "LLM",
            LLM_MODEL_NAME: model_name,
            LLM_INVOCATION_PARAMETERS: json.dumps({"max_tokens": request.max_tokens}),
        }
        if self.capture_content:
            attrs[INPUT_VALUE] = request.prompt
            attrs[INPUT_MIME_TYPE] = _TEXT
        with self._tracer.start_as_current_span(
            f"{operation} {model_name}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            with _failures(span):
                yield ModelCall(span, "orchestrator.model.", self.capture_content)

    def on_step(self, step: Step) -> None:
        """Add a ``transition`` event to the innermost open span of the step's machine.

        Args:
            step: The step a machine took (give this method to ``Runner.subscribe``).
        """
        if self._off:
            return
        span = _ACTIVE.get().get(step.machine) or get_current_span()
        if not span.is_recording():
            return  # nothing would keep the event (tracing off): build nothing (issue 9)
        attributes: dict[str, AttributeValue] = {
            "machine": step.machine,
            "from": step.source,
            "to": step.dest,
            "trigger": step.event,
            "effects": step.effects,
        }
        if step.facts is not None:
            # Only the facts that differ from their defaults, as JSON: enough to replay the
            # step through the table and short enough to read.
            attributes["facts"] = json.dumps(facts_delta(step.facts), sort_keys=True)
        span.add_event(TRANSITION_EVENT, attributes)

    @contextmanager
    def _span(
        self, kind: str, name: str, attrs: Mapping[str, AttributeValue], *, machine: str
    ) -> Iterator[SpanHandle]:
        with self._tracer.start_as_current_span(
            name, attributes=attrs, record_exception=False, set_status_on_exception=False
        ) as span:
            token = _ACTIVE.set(MappingProxyType({**_ACTIVE.get(), machine: span}))
            try:
                with _failures(span):
                    yield SpanHandle(span, f"orchestrator.{kind}.")
            finally:
                _ACTIVE.reset(token)


@contextmanager
def _failures(span: Span) -> Iterator[None]:
    """Record an escaping error on ``span``; a cancellation is marked, not called an error."""
    try:
        yield
    except Cancelled:
        span.set_attribute("orchestrator.cancelled", True)
        raise
    except Exception as exc:
        # The stack trace holds the provider's own exception (a ModelError is raised from it),
        # whose text may echo the key: message and trace are redacted (redact.py).
        stack = "".join(traceback.format_exception(exc))
        redacted = {"exception.message": redact(str(exc)), "exception.stacktrace": redact(stack)}
        span.record_exception(exc, attributes=redacted)
        kind = exc.kind if isinstance(exc, ModelError) else type(exc).__name__
        span.set_attribute(ERROR_TYPE, kind)
        span.set_status(Status(StatusCode.ERROR, redact(f"{error_name(exc)}: {exc}")))
        raise
    except BaseException:
        # anyio/trio cancellation and KeyboardInterrupt are not failures of the traced work.
        span.set_attribute("orchestrator.cancelled", True)
        raise
