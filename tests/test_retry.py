"""Candidates and retries (D21), as the operation table decides them for one summary request."""

import math

import anyio
import pytest

from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._core.errors import (
    ContextOverflowError,
    EmptyReplyError,
    FatalModelError,
    ModelError,
    TransientModelError,
    TruncatedReplyError,
)
from orchestrator._core.model import Model, ModelResponse
from orchestrator._runtime.operation.retry import (
    NO_MODEL,
    AttemptRecord,
    RetryPolicy,
    check_summary_response,
)
from orchestrator._runtime.operation.runner import compact
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator.testing import FakeClock, ScriptedModel, summary_text
from tests.sessions import two_turns_plan

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def transient(retry_after: float | None = None) -> ModelError:
    return TransientModelError("503 Service Unavailable", retry_after=retry_after)


def a_plan() -> CompactionPlan:
    plan = two_turns_plan()  # one summary request: the history
    assert not plan.is_split_turn
    return plan


class Answer:
    """What a run returned: the summary text and the model that wrote it."""

    def __init__(self, text: str, model: Model | None) -> None:
        self.text = text
        self.model = model


async def run(
    *models: ScriptedModel,
    clock: FakeClock,
    policy: RetryPolicy | None = None,
    records: list[AttemptRecord] | None = None,
) -> tuple[Answer, Model | None, list[AttemptRecord]]:
    seen: list[AttemptRecord] = [] if records is None else records
    routes = SummaryRoutes(
        candidates=tuple(models),
        retry=policy or RetryPolicy(),
        sleep=clock.sleep,
        on_attempt=lambda record, _purpose: seen.append(record),
    )
    result = await compact(a_plan(), routes)
    chosen = next((m for m in models if m.name == result.model), None)
    return Answer(result.summary, chosen), chosen, seen


def outcomes(records: list[AttemptRecord]) -> list[tuple[str, int, str, int]]:
    return [(r.candidate, r.attempt, r.outcome, r.delay_ms) for r in records]


async def test_first_attempt_succeeds_without_waiting() -> None:
    clock = FakeClock()
    model = ScriptedModel([summary_text("summary")], name="a")
    response, chosen, records = await run(model, clock=clock)
    assert (response.text, chosen) == (summary_text("summary"), model)
    assert outcomes(records) == [("a", 1, "ok", 0)]
    assert clock.sleeps == []
    assert len(model.requests) == 1


async def test_backoff_is_2_4_8_seconds_then_the_last_error() -> None:
    clock = FakeClock()
    errors = [transient() for _ in range(4)]
    model = ScriptedModel(errors, name="a")
    with pytest.raises(ModelError) as caught:
        await run(model, clock=clock)
    assert (str(caught.value), caught.value.kind) == (str(errors[-1]), "transient")
    assert clock.sleeps == [2.0, 4.0, 8.0]
    assert clock.now == 14.0
    assert len(model.requests) == 4


async def test_every_attempt_is_recorded() -> None:
    clock = FakeClock()
    model = ScriptedModel([transient(), transient(), summary_text("done")], name="a")
    response, _, records = await run(model, clock=clock)
    assert response.text == summary_text("done")
    assert outcomes(records) == [
        ("a", 1, "retry", 2000),
        ("a", 2, "retry", 4000),
        ("a", 3, "ok", 0),
    ]
    assert all(r.error is not None for r in records[:2])
    assert records[2].error is None


async def test_retry_after_raises_the_delay() -> None:
    clock = FakeClock()
    model = ScriptedModel(
        [transient(retry_after=5.0), transient(retry_after=1.0), summary_text("ok")]
    )
    await run(model, clock=clock)
    # 5 s beats the 2 s backoff; the 4 s backoff beats a 1 s hint.
    assert clock.sleeps == [5.0, 4.0]


async def test_wait_over_30_seconds_switches_candidate() -> None:
    clock = FakeClock()
    first = ScriptedModel([transient(), transient(retry_after=31.0)], name="a")
    second = ScriptedModel([summary_text("from b")], name="b")
    response, chosen, records = await run(first, second, clock=clock)
    assert (response.text, chosen) == (summary_text("from b"), second)
    assert clock.sleeps == [2.0]
    assert outcomes(records) == [
        ("a", 1, "retry", 2000),
        ("a", 2, "next_candidate", 0),
        ("b", 1, "ok", 0),
    ]


async def test_last_candidate_may_wait_past_30_seconds_up_to_max_delay() -> None:
    clock = FakeClock()
    model = ScriptedModel([transient(retry_after=45.0), summary_text("ok")])
    await run(model, clock=clock)
    assert clock.sleeps == [45.0]
    too_long = ScriptedModel([transient(retry_after=61.0)])
    with pytest.raises(ModelError, match="503"):
        await run(too_long, clock=clock)
    assert clock.sleeps == [45.0]


async def test_overflow_is_never_retried_nor_passed_on() -> None:
    clock = FakeClock()
    overflow = ContextOverflowError("prompt is too long")
    first = ScriptedModel([overflow], name="a")
    second = ScriptedModel(["unused"], name="b")
    # Overflow is answered by halving the request (D14), on the same candidate, never by
    # waiting or passing it on; after three halvings the operation fails.
    first.push(overflow)
    first.push(overflow)
    first.push(overflow)
    records: list[AttemptRecord] = []
    with pytest.raises(ModelError) as caught:
        await run(first, second, clock=clock, records=records)
    assert (str(caught.value), caught.value.kind) == ("prompt is too long", "overflow")
    assert outcomes(records) == [("a", 1, "failed", 0)] * 4
    assert second.requests == []
    assert clock.sleeps == []


@pytest.mark.parametrize("kind", ["fatal", "empty", "truncated"])
async def test_non_retryable_error_moves_to_next_candidate(kind: str) -> None:
    clock = FakeClock()
    first = ScriptedModel([ModelError("no", kind=kind)], name="a")
    second = ScriptedModel([summary_text("ok")], name="b")
    _, chosen, records = await run(first, second, clock=clock)
    assert chosen is second
    assert outcomes(records) == [("a", 1, "next_candidate", 0), ("b", 1, "ok", 0)]


async def test_all_candidates_fail_raises_last_error_and_records_all() -> None:
    clock = FakeClock()
    a = ScriptedModel([transient(), ModelError("a is down")], name="a")
    b = ScriptedModel([transient(), transient(), transient()], name="b")
    last = transient()
    b.push(last)
    records: list[AttemptRecord] = []
    with pytest.raises(ModelError) as caught:
        await run(a, b, clock=clock, records=records)
    assert str(caught.value) == str(last)
    assert outcomes(records) == [
        ("a", 1, "retry", 2000),
        ("a", 2, "next_candidate", 0),
        ("b", 1, "retry", 2000),
        ("b", 2, "retry", 4000),
        ("b", 3, "retry", 8000),
        ("b", 4, "failed", 0),
    ]
    assert clock.sleeps == [2.0, 2.0, 4.0, 8.0]


async def test_disabled_policy_makes_one_attempt_per_candidate() -> None:
    clock = FakeClock()
    a = ScriptedModel([transient()], name="a")
    b = ScriptedModel([summary_text("ok")], name="b")
    _, chosen, records = await run(a, b, clock=clock, policy=RetryPolicy(enabled=False))
    assert chosen is b
    assert clock.sleeps == []
    assert outcomes(records) == [("a", 1, "next_candidate", 0), ("b", 1, "ok", 0)]


async def test_custom_policy_numbers() -> None:
    clock = FakeClock()
    model = ScriptedModel([transient(), transient(), summary_text("ok")])
    await run(model, clock=clock, policy=RetryPolicy(max_retries=2, base_delay_ms=100))
    assert clock.sleeps == [0.1, 0.2]


async def test_no_candidates() -> None:
    with pytest.raises(ModelError, match=NO_MODEL):
        await run(clock=FakeClock())


async def test_empty_and_truncated_replies_count_as_failures() -> None:
    clock = FakeClock()
    a = ScriptedModel(["   \n"], name="a")
    b = ScriptedModel([ModelResponse(text="half", stop_reason="length")], name="b")
    with pytest.raises(ModelError) as caught:
        await run(a, b, clock=clock)
    assert caught.value.kind == "truncated"


async def test_cancelling_during_a_retry_wait_interrupts_it() -> None:
    clock = FakeClock()
    model = ScriptedModel([transient(), "never reached"])
    with anyio.CancelScope() as scope:

        def cancel_on_retry(record: AttemptRecord) -> None:
            if record.outcome == "retry":
                # A deadline in the past cancels like scope.cancel(); I use it because
                # anyio 4.16's trio backend calls trio<0.25's cancel() with an argument
                # it does not take.
                scope.deadline = -math.inf

        routes = SummaryRoutes(
            candidates=(model,),
            sleep=clock.sleep,
            on_attempt=lambda record, _purpose: cancel_on_retry(record),
        )
        await compact(a_plan(), routes)
    assert scope.cancelled_caught
    assert len(model.requests) == 1
    assert clock.sleeps == []
    assert clock.now == 0.0
    assert model.remaining == 1


def test_check_summary_response() -> None:
    ok = ModelResponse(text="fine")
    assert check_summary_response(ok) is ok
    for response, failure, kind in [
        (ModelResponse(text=""), EmptyReplyError, "empty"),
        (ModelResponse(text=" \t\n"), EmptyReplyError, "empty"),
        (ModelResponse(text="cut", stop_reason="length"), TruncatedReplyError, "truncated"),
        (ModelResponse(text="x", stop_reason="error"), FatalModelError, "fatal"),
        (ModelResponse(text="x", stop_reason="aborted"), FatalModelError, "fatal"),
    ]:
        with pytest.raises(failure) as caught:
            check_summary_response(response)
        assert caught.value.kind == kind


async def test_a_candidate_whose_window_is_too_small_is_passed_over_unpaid() -> None:
    # Building the request refuses (nothing useful fits the window, D14): that is this
    # candidate's failed attempt, and the table moves on to the next one (D21) instead of
    # ending the call. The refused candidate is never called.
    clock = FakeClock()
    tiny = ScriptedModel(["unused"], name="tiny", context_window=600)
    roomy = ScriptedModel([summary_text("from roomy")], name="roomy")
    response, chosen, records = await run(tiny, roomy, clock=clock)
    assert (response.text, chosen) == (summary_text("from roomy"), roomy)
    assert tiny.requests == []
    assert outcomes(records) == [("tiny", 1, "next_candidate", 0), ("roomy", 1, "ok", 0)]
    assert records[0].error is not None
    assert str(records[0].error).startswith("Summarization refused: ")
    assert clock.sleeps == []
    # The last candidate's refusal ends the call with it, still without a request.
    with pytest.raises(ModelError, match="^Summarization refused: .*larger window"):
        await run(ScriptedModel(["unused"], name="tiny", context_window=600), clock=clock)


def test_a_summary_far_over_its_budget_is_refused() -> None:
    # A remote endpoint is told no budget; one that answered 3 MB was committed, and the
    # compacted context came out hundreds of thousands of tokens larger than before.
    budget = 1000
    at_the_limit = ModelResponse(text="x" * (4 * 2 * budget))  # 2,000 tokens, estimated
    assert check_summary_response(at_the_limit, budget) is at_the_limit
    assert check_summary_response(ModelResponse(text="x" * 10_000_000)) is not None  # no budget
    over = ModelResponse(text="x" * (4 * 2 * budget + 1))
    with pytest.raises(ModelError) as caught:
        check_summary_response(over, budget)
    assert caught.value.kind == "fatal"  # the next candidate, else failed: nothing applied
    assert str(caught.value) == (
        "Summarization failed: the summary is about 2001 tokens, more than 2 times its budget "
        "of 1000"
    )
    # Measured as every estimate is (UTF-16 units / 4): an astral character counts 2.
    astral = ModelResponse(text="\U0001f600" * (4 * budget + 1))
    with pytest.raises(ModelError):
        check_summary_response(astral, budget)
