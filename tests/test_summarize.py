"""Execution: compact() and summarize_branch() against scripted models and the local provider."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator._core.branch_plan import plan_branch_summary, prepare_branch_entries
from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction
from orchestrator._core.errors import (
    ContextOverflowError,
    FatalModelError,
    ModelError,
    TransientModelError,
)
from orchestrator._core.model import Model, ModelRequest, ModelResponse, Usage
from orchestrator._core.summary_request import PromptBudget, history_request
from orchestrator._core.tokens import CompactionSettings
from orchestrator._models.remote import RemoteSummaryModel
from orchestrator._runtime.operation.retry import AttemptRecord, RetryPolicy
from orchestrator._runtime.operation.runner import compact, summarize_branch
from orchestrator._runtime.operation.summarize import (
    NO_BRANCH_CONTENT,
    SummaryRoutes,
    combined_usage,
)
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import RuntimeSettings
from orchestrator._store.session import Session
from orchestrator.testing import (
    FakeClock,
    FunctionModel,
    Hang,
    LocalProvider,
    Reply,
    ScriptedModel,
    summary_text,
)
from tests.runtime_kit import until
from tests.sessions import SessionBuilder, split_turn, usage

pytestmark = pytest.mark.anyio

SETTINGS = CompactionSettings(keep_recent_tokens=150, adaptive_keep=False)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def conversation(previous: bool = False) -> SessionBuilder:
    s = SessionBuilder()
    s.user("Fix the parser. Never change the public API.")
    s.assistant("Reading.", calls=[("read", {"path": "src/parser.py"})], usage=usage(500))
    s.tool_result("def parse(): ...")
    s.assistant("Editing.", calls=[("edit", {"path": "src/parser.py"})], usage=usage(900))
    s.tool_result("ok")
    if previous:
        first = s.user("x" * 400)
        s.assistant("y" * 400, usage=usage(1200))
        s.compaction("## Goal\nOLD SUMMARY", first_kept=first)
    s.user("Now the tests, please. " + "z" * 400)
    s.assistant("Done with the tests. " + "w" * 400, usage=usage(2000))
    return s


def the_plan(s: SessionBuilder, settings: CompactionSettings = SETTINGS) -> CompactionPlan:
    plan = plan_compaction(s.path(), settings)
    assert isinstance(plan, CompactionPlan)
    if settings is SETTINGS:
        assert not plan.is_split_turn  # one model call per summary in these tests
    return plan


def summarizer(*models: Model, **kwargs: Any) -> SummaryRoutes:
    return SummaryRoutes(
        candidates=tuple(models),
        reserve_tokens=2000,
        sleep=FakeClock().sleep,
        **kwargs,
    )


async def test_plain_compaction_sends_the_conversation_and_adds_file_tags() -> None:
    # The focus must be named for the gate (D32) to pass the summary.
    fixed = summary_text("Fix the parser; keep the API promise.")
    model = ScriptedModel([fixed])
    plan = the_plan(conversation())
    result = await compact(plan, summarizer(model), focus="the API promise")
    request = model.requests[0]
    assert request.prompt.startswith("<conversation>\n[User]: Fix the parser.")
    assert "<previous-summary>" not in request.prompt
    assert request.prompt.endswith("Additional focus: the API promise")
    assert request.max_tokens == 1600  # 80 % of the reserve
    assert result.summary.startswith(fixed + "\n\n<modified-files>\nsrc/parser.py")
    assert result.details["readFiles"] == []
    assert result.details["modifiedFiles"] == ["src/parser.py"]
    assert result.details["provenance"]["gatePassedFirstTime"] is True
    assert result.first_kept_entry_id == plan.first_kept_entry_id
    assert result.model == "scripted/model"


async def test_update_of_a_previous_summary_uses_the_update_prompt() -> None:
    model = ScriptedModel([summary_text("Updated.")])
    plan = the_plan(conversation(previous=True))
    assert plan.previous_summary == "## Goal\nOLD SUMMARY"
    await compact(plan, summarizer(model))
    prompt = model.requests[0].prompt
    assert "<previous-summary>\n## Goal\nOLD SUMMARY\n</previous-summary>" in prompt


async def test_split_turn_summaries_run_concurrently() -> None:
    active = peak = 0

    async def answer(request: ModelRequest) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        active -= 1
        return summary_text(f"summary for {request.purpose}", purpose=request.purpose)

    s = split_turn()
    plan = the_plan(s, CompactionSettings(keep_recent_tokens=150, adaptive_keep=False))
    assert plan.is_split_turn
    assert plan.messages_to_summarize
    assert plan.turn_prefix_messages
    model = FunctionModel(answer)
    result = await compact(plan, summarizer(model))
    assert peak == 2
    assert sorted(r.purpose for r in model.requests) == ["history", "turn_prefix"]
    assert (
        summary_text("summary for history")
        + "\n\n---\n\n**Turn Context (split turn):**\n\n"
        + summary_text("summary for turn_prefix", purpose="turn_prefix")
        in result.summary
    )


async def test_both_halves_of_a_split_turn_failing_raise_one_model_error() -> None:
    async def fail(request: ModelRequest) -> str:
        raise FatalModelError(f"{request.purpose} down")

    s = split_turn()
    plan = the_plan(s, CompactionSettings(keep_recent_tokens=150, adaptive_keep=False))
    with pytest.raises(ModelError, match="down"):
        await compact(plan, summarizer(FunctionModel(fail)))


async def test_d11_split_turn_without_older_history_keeps_the_previous_summary() -> None:
    s = SessionBuilder()
    s.user("one long turn " + "c" * 100)
    for n in range(3):
        s.assistant("step " + "d" * 400, calls=[("read", {"path": f"f{n}.py"})], usage=usage(1500))
        s.tool_result("e" * 400)
    s.assistant("tail", usage=usage(2000))
    plan = the_plan(s, CompactionSettings(keep_recent_tokens=150, adaptive_keep=False))
    assert plan.is_split_turn
    assert not plan.messages_to_summarize
    # The executor's edge path: a previous summary and nothing older than the split turn.
    plan = dataclasses.replace(plan, previous_summary="## Goal\nKEEP ME")
    model = ScriptedModel([summary_text("prefix summary", purpose="turn_prefix")])
    result = await compact(plan, summarizer(model))
    assert result.summary.startswith("## Goal\nKEEP ME\n\n---\n\n**Turn Context (split turn):**")
    assert "No prior history." not in result.summary
    assert [r.purpose for r in model.requests] == ["turn_prefix"]
    without = await compact(
        dataclasses.replace(plan, previous_summary=None),
        summarizer(ScriptedModel([summary_text("prefix summary", purpose="turn_prefix")])),
    )
    assert without.summary.startswith("No prior history.")


def long_conversation() -> SessionBuilder:
    s = SessionBuilder()
    for n in range(12):
        s.user(f"Step {n} of the parser work. " + "z" * 300)
        s.assistant(f"Done with step {n}. " + "w" * 300, usage=usage(100 * (n + 1)))
    return s


async def test_d14_summarizer_overflow_halves_the_request() -> None:
    plan = the_plan(long_conversation())
    whole = history_request(plan.messages_to_summarize, reserve_tokens=2000)
    # The window leaves room for the whole prompt once, not for it halved.
    room = math.ceil((len(whole.system) + len(whole.prompt)) / 4) + 10
    window = next(
        w
        for w in itertools.count(room)
        if PromptBudget(context_window=w).prompt_tokens(1600) >= room
    )
    model = ScriptedModel(
        [ContextOverflowError("context_length_exceeded"), summary_text("OK")],
        context_window=window,
    )
    result = await compact(plan, summarizer(model))
    assert result.summary.startswith(summary_text("OK"))
    first, second = (r.prompt for r in model.requests)
    assert "elided" not in first
    assert len(second) < len(first)
    assert "earlier characters elided to fit the summarizer's context window" in second


async def test_d14_gives_up_after_three_halvings() -> None:
    overflow = ContextOverflowError("context_length_exceeded")
    model = ScriptedModel([overflow] * 4)
    with pytest.raises(ModelError, match="context_length_exceeded"):
        await compact(the_plan(conversation()), summarizer(model))
    assert len(model.requests) == 4


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (ModelResponse(text="   "), "empty"),
        (ModelResponse(text="cut", stop_reason="length"), "truncated"),
    ],
)
async def test_d15_empty_or_truncated_summaries_are_failures(
    reply: ModelResponse, kind: str
) -> None:
    model = ScriptedModel([reply])
    with pytest.raises(ModelError) as caught:
        await compact(the_plan(conversation()), summarizer(model))
    assert caught.value.kind == kind


async def test_retries_and_candidate_switch_are_reported() -> None:
    attempts: list[tuple[str, str]] = []
    first = ScriptedModel(
        [TransientModelError("503"), TransientModelError("503", retry_after=45)],
        name="first",
    )
    second = ScriptedModel([summary_text("from the second")], name="second")
    s = summarizer(
        first,
        second,
        retry=RetryPolicy(max_retries=3, base_delay_ms=2000),
        on_attempt=lambda r, p: attempts.append((r.candidate, r.outcome)),
    )
    result = await compact(the_plan(conversation()), s)
    assert result.model == "second"
    assert attempts == [("first", "retry"), ("first", "next_candidate"), ("second", "ok")]


async def test_all_candidates_failing_raise_the_last_error() -> None:
    records: list[AttemptRecord] = []
    a = ScriptedModel([FatalModelError("bad key")], name="a")
    b = ScriptedModel([FatalModelError("also down")], name="b")
    with pytest.raises(ModelError, match="also down"):
        await compact(
            the_plan(conversation()), summarizer(a, b, on_attempt=lambda r, p: records.append(r))
        )
    assert [(r.candidate, r.outcome) for r in records] == [("a", "next_candidate"), ("b", "failed")]


async def test_remote_endpoint_takes_the_history_summary() -> None:
    with LocalProvider((Reply.remote(summary_text("From the endpoint")),)) as provider:
        remote = RemoteSummaryModel(provider.url + "/summary")
        result = await compact(
            the_plan(conversation()), summarizer(ScriptedModel([]), remote=remote)
        )
        [request] = provider.requests
    assert result.summary.startswith(summary_text("From the endpoint"))
    assert set(request.body) == {"systemPrompt", "prompt"}
    assert request.body["prompt"].startswith("<conversation>")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply.error(500, "boom"), "Remote compaction failed (500"),
        (Reply.remote(summary=None), "Remote compaction response missing summary"),
    ],
)
async def test_remote_endpoint_failures(reply: Reply, message: str) -> None:
    with LocalProvider((reply,) * 4) as provider:
        remote = RemoteSummaryModel(provider.url + "/summary")
        s = summarizer(ScriptedModel([]), remote=remote, retry=RetryPolicy(max_retries=0))
        with pytest.raises(ModelError, match=message.replace("(", r"\(")):
            await compact(the_plan(conversation()), s)


async def test_cancellation_mid_call_leaves_the_file_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = Session.open(path)
    for entry in conversation().entries:
        session.add_entry(dict(entry))
    session.flush()
    before = path.read_bytes()
    model = ScriptedModel([Hang()])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            runtime = AgentSession(
                session,
                summarizer=summarizer(model),
                settings=RuntimeSettings(compaction=SETTINGS),
            )
            group.start_soon(runtime.compact)
            await until(lambda: bool(model.requests))
            scope.cancel()
    assert scope.cancelled_caught
    assert path.read_bytes() == before
    session.close()


async def test_branch_summary_with_preamble_and_no_call_when_nothing_to_summarize() -> None:
    s = SessionBuilder()
    s.user("try the other approach")
    s.assistant("editing", calls=[("write", {"path": "b.py"})], usage=usage(100))
    s.tool_result("ok")
    plan = prepare_branch_entries(s.entries, 0)
    explored = summary_text("Explored b.py")
    model = ScriptedModel([explored])
    result = await summarize_branch(plan, summarizer(model), instructions="note files")
    assert result.summary.split("\n")[0].startswith("Before coming back to this point")
    assert f"\n\n{explored}\n\n<modified-files>\nb.py\n</modified-files>" in result.summary
    assert model.requests[0].prompt.endswith("Additional focus: note files")
    assert model.requests[0].max_tokens == 2048
    empty = prepare_branch_entries([], 0)
    assert (await summarize_branch(empty, summarizer(model))).summary == NO_BRANCH_CONTENT
    assert len(model.requests) == 1


async def test_the_entry_records_what_its_summary_calls_cost() -> None:
    # pi 1.x writes the summary call's usage on the entry (it counts in session totals); a split
    # turn's two calls are summed, as pi's combineUsage sums them.
    spent = Usage(input=1000, output=200, cache_read=50, total=1250)

    async def answer(request: ModelRequest) -> ModelResponse:
        text = summary_text(f"summary for {request.purpose}", purpose=request.purpose)
        return ModelResponse(text=text, usage=spent)

    plan = the_plan(split_turn(), CompactionSettings(keep_recent_tokens=150, adaptive_keep=False))
    assert plan.is_split_turn
    result = await compact(plan, summarizer(FunctionModel(answer)))
    assert result.usage is not None
    assert result.usage["input"] == 2000
    assert result.usage["output"] == 400
    assert result.usage["cacheRead"] == 100
    assert result.usage["totalTokens"] == 2500
    assert result.entry_fields()["usage"] == result.usage
    session = split_turn()
    branch = plan_branch_summary(session.tree(), session.path()[-1]["id"], None)
    assert branch.messages
    summary = await summarize_branch(branch, summarizer(FunctionModel(answer)))
    assert summary.usage is not None
    assert summary.usage["input"] == 1000
    assert combined_usage({}) is None
