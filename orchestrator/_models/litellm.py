"""The litellm route: any provider litellm knows, behind the one-method ``Model`` interface.

Theory of operation: ``import litellm`` takes seconds and, left to itself, fetches a price table
from the internet. A library must do neither unasked, so I import it on the first call only,
after setting ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (its switch for the bundled table). Its import
also reads a ``.env`` file from the working directory into ``os.environ`` unless ``LITELLM_MODE``
is ``PRODUCTION``: a library must not change its caller's environment from a file it never named,
so the import runs with that mode unless the caller chose one. Every
call makes exactly one HTTP attempt (``max_retries=0, num_retries=0``): retries and candidate
switching are ours (D21, ``_retry.py``). Provider exceptions become ``ModelError`` through the
classifier, chained with ``from exc``. Cancellation (anyio or asyncio) is a ``BaseException``
and is never caught here, so cancelling the caller's scope ends the HTTP request. A bug is not a
provider failure either: a plain ``TypeError``, ``AttributeError``, ``NameError``,
``AssertionError`` or ``NotImplementedError`` (the builtin classes, not a library's subclass)
propagates as it is, so it is seen as a bug instead of being retried or written into the session
as the provider's error reply. litellm maps what fails inside its own call to its own exception
classes, so these can only come from the way it was called.

I do not judge the reply: an empty text or a ``length`` stop is reported as it is, and the
caller decides whether that is a failure (D15, ``check_summary_response``).

Summaries stream (``stream=True``, with ``stream_options.include_usage`` so the last chunk
carries the usage). A local model may need minutes for a summary, and a large one streams for
minutes over a long history: a total time limit either cuts them or is too long to notice a
provider that says nothing. Streaming, liveness is measured instead: the call fails as a
``timeout`` when no chunk comes for the request's ``idle_timeout_s`` (one ``asyncio.timeout``
moved on at each chunk, from the request on), and the runtime gives the route no total limit
(``streams = True``). litellm's own ``timeout`` (the route's ``timeout``) stays its HTTP
client's: a silence that long between bytes fails the call as ``transient``. I assemble the
text, the reasoning, the finish reason and the usage from the chunks. A chat turn (a request
with tools) is still answered in one piece, its tool calls whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from types import ModuleType
from typing import Any

from orchestrator._core.classify import classify_exception
from orchestrator._core.errors import (
    EmptyReplyError,
    ModelTimeoutError,
    TransientModelError,
)
from orchestrator._core.model import ModelRequest, ModelResponse, ToolCall, Usage
from orchestrator._core.redact import remember_secret

# Builtin exceptions that mean a bug in the call, not a provider failure (see the module doc).
_BUGS = frozenset({TypeError, AttributeError, NameError, AssertionError, NotImplementedError})

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "toolUse",
    "function_call": "toolUse",
    "content_filter": "error",
}

_litellm: ModuleType | None = None


def _load_litellm() -> ModuleType:
    """Import and configure litellm once, without network access at import."""
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        chosen_mode = os.environ.get("LITELLM_MODE")
        if chosen_mode is None:
            os.environ["LITELLM_MODE"] = "PRODUCTION"
        try:
            import litellm
        finally:
            # Restored, so the caller's environment is as it was (no .env values, no mode).
            if chosen_mode is None:
                os.environ.pop("LITELLM_MODE", None)

        # Its "Give Feedback / Get Help" banner goes to stdout on every error; a library
        # must not print.
        litellm.suppress_debug_info = True
        # Its own logger writes warnings about its internal logging worker to stderr (e.g.
        # "event loop changed" when a process runs a second event loop). Failures reach our
        # callers as ModelError; its chatter should not reach their terminal.
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
        _litellm = litellm
    return _litellm


def _known_window(model: str) -> int:
    # litellm's bundled map (LITELLM_LOCAL_MODEL_COST_MAP keeps it offline); unknown models
    # raise, and then the window is simply unknown.
    try:
        info = _load_litellm().get_model_info(model=model)
    except Exception:  # noqa: BLE001 - an unknown model is not an error here
        return 0
    return int(info.get("max_input_tokens") or info.get("max_tokens") or 0)


def _known_output_limit(model: str) -> int:
    try:
        info = _load_litellm().get_model_info(model=model)
    except Exception:  # noqa: BLE001 - an unknown model's limit is simply unknown
        return 0
    return int(info.get("max_output_tokens") or 0)


def _known_reasoning(model: str) -> bool:
    try:
        return bool(_load_litellm().supports_reasoning(model=model))
    except Exception:  # noqa: BLE001 - an unknown model does not reason, as far as we know
        return False


def _remember_keys(api_key: str | None) -> None:
    """Redact the key this route sends wherever error text is written (``redact.py``, rule 1).

    Without one of its own, litellm sends the provider's usual variable (``OPENAI_API_KEY``,
    ``ANTHROPIC_API_KEY``...): every ``*_API_KEY`` variable is remembered then, as finding the
    one litellm will pick means asking litellm's provider tables.
    """
    if api_key is not None:
        remember_secret(api_key)
        return
    for name, value in os.environ.items():
        if name.upper().endswith("_API_KEY"):
            remember_secret(value)


class LiteLLMModel:
    """A :class:`~orchestrator.Model` backed by ``litellm.acompletion`` (asyncio only).

    Args:
        model: litellm's model id, ``provider/model`` (e.g. ``"openai/gpt-4o-mini"``).
        api_key: Key for the provider; litellm reads its usual variables when ``None``.
        api_base: Base URL, for proxies and local servers.
        context_window: The model's window in tokens; ``None`` asks litellm's bundled model map
            (no network), and 0 means unknown.
        reasoning_supported: Whether to pass ``reasoning_effort`` when a request asks for it;
            ``None`` asks litellm's bundled model map.
        timeout: Seconds before litellm gives up on the HTTP call (for its HTTP client, a
            silence between bytes); for a summary, which streams, also the idle timeout when
            the request sets none.
    """

    # litellm leaves a coroutine un-awaited when its call runs under a cancel scope that has a
    # deadline: the per-call timeout uses a sibling timer task for this route (outcomes.within).
    needs_sibling_timer = True
    # Summaries stream, and this route fails one that goes silent (the module's doc).
    streams = True

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
        context_window: int | None = 0,
        reasoning_supported: bool | None = False,
        timeout: float = 120.0,
    ) -> None:
        self._model = model
        self._api_key = api_key
        _remember_keys(api_key)
        self._api_base = api_base
        self._context_window = context_window
        self._output_limit: int | None = None
        self._reasoning_supported = reasoning_supported
        self._timeout = timeout
        # Importing litellm takes seconds. I do it when a route is made rather than at its first
        # call, so that a summary's timeout and deadline measure the provider, not our start-up
        # (``import orchestrator`` still loads no litellm).
        _load_litellm()

    @property
    def name(self) -> str:
        """The litellm model id."""
        return self._model

    @property
    def context_window(self) -> int:
        """The context window: as configured, or from litellm's model map (0 when unknown)."""
        if self._context_window is None:
            self._context_window = _known_window(self._model)
        return self._context_window

    @property
    def output_limit(self) -> int:
        """The model's output limit from litellm's model map (0 when unknown)."""
        if self._output_limit is None:
            self._output_limit = _known_output_limit(self._model)
        return self._output_limit

    def _supports_reasoning(self) -> bool:
        if self._reasoning_supported is None:
            self._reasoning_supported = _known_reasoning(self._model)
        return self._reasoning_supported

    def arguments(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments passed to ``litellm.acompletion`` for ``request``."""
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(request.messages)
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "timeout": self._timeout,
            "max_retries": 0,
            "num_retries": 0,
        }
        if self._api_key is not None:
            kwargs["api_key"] = self._api_key
        if self._api_base is not None:
            kwargs["api_base"] = self._api_base
        if request.reasoning and self._supports_reasoning():
            kwargs["reasoning_effort"] = request.reasoning
        if request.tools:
            kwargs["tools"] = list(request.tools)
        return kwargs

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Make one call through litellm.

        Returns:
            The reply, with pi's stop reason and usage.

        Raises:
            ModelError: the provider failed: a :class:`ContextOverflowError`,
                :class:`TransientModelError` (:class:`ModelTimeoutError` for a silent stream) or
                :class:`FatalModelError`.
        """
        litellm = _load_litellm()
        if not request.tools:
            return await self._streamed(litellm, request)
        try:
            raw = await litellm.acompletion(**self.arguments(request))
        except Exception as exc:  # only Exception: cancellation must pass through untouched
            if type(exc) in _BUGS:
                raise
            raise classify_exception(exc) from exc
        return response_from_litellm(raw, fallback_model=self._model)

    async def _streamed(self, litellm: ModuleType, request: ModelRequest) -> ModelResponse:
        idle = request.idle_timeout_s if request.idle_timeout_s is not None else self._timeout
        arguments = self.arguments(request)
        arguments.update(stream=True, stream_options={"include_usage": True})
        pieces = _Pieces(self._model)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(idle) as quiet:
                stream = await litellm.acompletion(**arguments)
                pieces.provider = str(getattr(stream, "custom_llm_provider", "") or "")
                async with stream:
                    async for chunk in stream:
                        quiet.reschedule(loop.time() + idle)
                        pieces.add(chunk)
        except TimeoutError:  # ours (asyncio.timeout's); the caller's cancellation passes
            raise _silent(self._model, idle) from None
        except Exception as exc:  # only Exception: cancellation must pass through untouched
            if type(exc) in _BUGS:
                raise
            raise classify_exception(exc) from exc
        return pieces.response()


def _silent(model: str, idle: float) -> ModelTimeoutError:
    return ModelTimeoutError(f"{model}: nothing received for {idle:g} s")


class _Pieces:
    """A streamed reply as it comes: its text, reasoning, finish reason and usage."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.provider = ""
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.heard = False  # a chunk of the provider's own, not one litellm made up at the end

    def add(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage
            self.heard = True
        for choice in getattr(chunk, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            content = getattr(delta, "content", None)
            thinking = getattr(delta, "reasoning_content", None) or ""
            self.heard = self.heard or content is not None or bool(getattr(delta, "role", None))
            self.text.append(_text_of(content))
            self.thinking.append(thinking)
            if choice.finish_reason:
                self.finish_reason = str(choice.finish_reason)

    def response(self) -> ModelResponse:
        """The assembled reply.

        Raises:
            TransientModelError: the stream carried nothing of the provider's (a body
                that is not server-sent events: litellm then makes up an empty ``stop``).
        """
        if not self.heard:
            raise TransientModelError(f"{self.model}: the provider's stream carried no answer")
        return ModelResponse(
            text="".join(self.text),
            stop_reason=_FINISH_REASONS.get(str(self.finish_reason), "stop"),
            usage=_usage_of(self.usage),
            model=self.model,
            provider=self.provider,
            thinking="".join(self.thinking),
        )


def response_from_litellm(raw: Any, *, fallback_model: str = "") -> ModelResponse:
    """Map a litellm ``ModelResponse`` (OpenAI chat shape) to ours.

    Returns:
        A :class:`ModelResponse`; ``input`` excludes cached prompt tokens, as pi counts them.

    Raises:
        EmptyReplyError: the provider answered without a choice (``"choices": []``) or a
            message, which is the provider's failure, not a bug here to surface as IndexError.
    """
    choices = getattr(raw, "choices", None) or ()
    choice = choices[0] if choices else None
    message = getattr(choice, "message", None)
    if choice is None or message is None:
        model = getattr(raw, "model", None) or fallback_model
        raise EmptyReplyError(f"{model}: the provider answered with no message (no choices)")
    hidden = getattr(raw, "_hidden_params", None) or {}
    return ModelResponse(
        text=_text_of(getattr(message, "content", None)),
        stop_reason=_FINISH_REASONS.get(str(choice.finish_reason), "stop"),
        usage=_usage_of(getattr(raw, "usage", None)),
        model=getattr(raw, "model", None) or fallback_model,
        provider=str(hidden.get("custom_llm_provider") or ""),
        thinking=getattr(message, "reasoning_content", None) or "",
        tool_calls=tuple(_tool_call(call) for call in getattr(message, "tool_calls", None) or ()),
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some providers return content blocks
        return "\n".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return ""


def _usage_of(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    output = int(getattr(usage, "completion_tokens", 0) or 0)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    cache_write = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
    # litellm folds cache reads (and, for Anthropic, cache writes) into prompt_tokens; pi keeps
    # them apart, and the silent-overflow rule adds them back up.
    return Usage(
        input=max(prompt - cached - cache_write, 0),
        output=output,
        cache_read=cached,
        cache_write=cache_write,
        total=int(getattr(usage, "total_tokens", 0) or 0),
    )


def _tool_call(call: Any) -> ToolCall:
    function = call.function
    try:
        arguments = json.loads(function.arguments or "{}")
    except ValueError:
        arguments = {"_raw": function.arguments}
    if not isinstance(arguments, dict):
        arguments = {"_value": arguments}
    return ToolCall(id=str(call.id), name=str(function.name), arguments=arguments)
