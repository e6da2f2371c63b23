"""What an operation's effects report, turned into the operation table's events (D31).

Both hosts of the operation table use these: the anyio driver
(:mod:`orchestrator._runtime.operation`) and the Temporal workflow
(:mod:`orchestrator._cluster.flow`). An effect performs and reports an outcome; these pure
functions name the event that outcome fires and the facts its guards read, so the table makes
the same decision, and the journal reads the same, on either host. :func:`attempt_summary` is
the one model attempt both hosts make (the workflow makes it inside an activity).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TypeVar

import anyio

from orchestrator._core.errors import ModelError
from orchestrator._core.model import Model
from orchestrator._lifecycle.guards import Facts
from orchestrator._runtime.delays import retry_delay_ms
from orchestrator._runtime.driver import Report, cancel_scope
from orchestrator._runtime.retry import RetryPolicy, check_summary_response
from orchestrator._runtime.summarize import Part, request_for

T = TypeVar("T")

RETRYABLE = frozenset({"transient", "timeout"})
"""Failure kinds a wait and another attempt may cure (D21)."""
COMMIT_EVENTS: Mapping[str, str] = {
    "ok": "entry_appended",
    "conflict": "append_conflict",
    "failed": "append_failed",
}
"""The commit's outcome to its event."""
HOOK_EVENTS: Mapping[str, str] = {
    "done": "hooks_done",
    "supplied": "hook_supplied",
    "cancelled": "hooks_cancelled",
}
"""The hooks' outcome to its event."""


def call_event(
    report: Report,
    *,
    more_parts: bool,
    halvings: int,
    retries: int,
    more_candidates: bool,
    policy: RetryPolicy,
) -> tuple[str, Facts, int]:
    """The event a model attempt's report fires, its facts, and the wait a retry would take.

    Args:
        report: What ``call_model`` reported.
        more_parts: Another summary request of the operation follows this one.
        halvings: Times this request was halved so far (D14).
        retries: Retries made on this candidate so far.
        more_candidates: Another candidate model remains for this request (D21).
        policy: The retry policy of the routes.

    Returns:
        ``(event, facts, delay_ms)``; ``delay_ms`` is 0 unless the event is ``attempt_failed``.
    """
    if report.outcome == "ok":
        return "summary_ready", Facts(more_parts=more_parts), 0
    if report.outcome == "overflow":
        return "summary_overflow", Facts(shrink_attempts=halvings), 0
    max_retries = policy.max_retries if policy.enabled else 0
    delay_ms = retry_delay_ms(policy.base_delay_ms, retries, report.retry_after)
    facts = Facts(
        retryable=report.outcome in RETRYABLE,
        retry_attempt=retries,
        max_retries=max_retries,
        delay_ms=delay_ms,
        max_delay_ms=policy.switch_after_ms,
        delay_cap_ms=policy.max_delay_ms,
        more_candidates=more_candidates,
    )
    return "attempt_failed", facts, delay_ms


async def attempt_summary(
    part: Part,
    model: Model,
    halvings: int,
    texts: Mapping[str, str],
    timeout_s: float | None,
) -> tuple[Report, str]:
    """Make one attempt at one summary request and report it (no retry here: the table decides).

    Returns:
        The report (``ok`` with the model's name, or the failure's kind and text) and the
        summary text (empty unless ``ok``).
    """
    try:
        # Building the request may refuse (a window too small for anything useful): that is
        # a failure of this attempt like any other, and no model is paid for it.
        request = request_for(part, model, halvings, texts)
        response = await within(timeout_s, model.complete(request))
        if response is None:
            failure = f"{model.name}: no answer after {timeout_s:g} s"
            return Report(outcome="timeout", error=failure), ""
        response = check_summary_response(response)
    except ModelError as error:
        report = Report(outcome=error.kind, retry_after=error.retry_after, error=str(error))
        return report, ""
    return Report(outcome="ok", data={"model": model.name}), response.text.strip()


async def within(seconds: float | None, call: Awaitable[T]) -> T | None:
    """Await ``call``; give up after ``seconds`` (``None``: no limit) and return ``None``.

    I time the call with a sibling timer task rather than a deadline on the enclosing scope:
    litellm leaves a coroutine un-awaited when it runs under a scope that has a deadline.
    """
    if seconds is None:
        return await call
    box: list[T] = []
    errors: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def timer() -> None:
            await anyio.sleep(seconds)
            cancel_scope(group.cancel_scope)

        group.start_soon(timer)
        try:
            box.append(await call)
        except Exception as error:  # noqa: BLE001 - re-raised below, outside the group
            errors.append(error)
        cancel_scope(group.cancel_scope)
    if errors:
        raise errors[0]
    return box[0] if box else None
