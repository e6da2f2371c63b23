"""The summary quality gate (D32): what it refuses, what the table does next, and provenance."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction
from orchestrator._core.entries import Message
from orchestrator._core.gate import GateSpec, check_summary, layout_headings
from orchestrator._core.resources import data_dir
from orchestrator._core.summary_request import (
    branch_request,
    history_request,
    short_summary_request,
    turn_prefix_request,
)
from orchestrator._core.tokens import CompactionSettings
from orchestrator._lifecycle.load import build
from orchestrator._lifecycle.machine import MachineDef, load_machine
from orchestrator._models.offline import OfflineSummarizer, summarize
from orchestrator._runtime.operation.jobs import CompactionJob
from orchestrator._runtime.operation.retry import AttemptRecord, RetryPolicy
from orchestrator._runtime.operation.run import OperationRun
from orchestrator._runtime.operation.summarize import CompactionResult, SummaryRoutes
from orchestrator._runtime.ports import Ports
from orchestrator._store.session import Session
from orchestrator.testing import FakeClock, ScriptedModel, summary_text
from tests.sessions import two_turns_plan

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parent / "data" / "example-session.jsonl"
HISTORY = GateSpec(
    purpose="history",
    headings=layout_headings("compaction_summary"),
    input_chars=20_000,
    modified_files=("src/parser.py",),
)
GOOD = summary_text("Fix the parser.")

BAD = {
    "sections": "Well, we talked about many things and the parser came up a few times. " * 3,
    "truncated": GOOD.split("## Next Steps")[0] + "## Next Steps\n1. Make the parser accept the",
    "refusal": "I'm sorry, but I can't help with summarizing this conversation.",
    "error_text": "Error: upstream request failed (502 Bad Gateway)",
    "too_long": GOOD + "\n" + "- a detail worth keeping\n" * 1200,
}
"""One answer per check the operation tests walk, keyed by the check that refuses it."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the checks ---------------------------------------------------------------------------------


def test_the_layout_passes() -> None:
    assert check_summary(GOOD, HISTORY).passed


@pytest.mark.parametrize(("check", "text"), sorted(BAD.items()))
def test_each_bad_answer_is_refused_by_its_check(check: str, text: str) -> None:
    verdict = check_summary(text, HISTORY)
    assert verdict.check == check
    assert verdict.reason


@pytest.mark.parametrize(
    "text",
    [
        "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
        '{"error": {"message": "upstream connect error", "type": "server_error"}}',
        "503 Service Unavailable",
    ],
)
def test_provider_error_pages_and_objects_are_error_text(text: str) -> None:
    assert check_summary(text, HISTORY).check == "error_text"


def test_i_cannot_assist_is_a_refusal() -> None:
    assert check_summary("I cannot assist with that request.", HISTORY).check == "refusal"


def test_an_error_quoted_inside_the_summary_is_not_error_text() -> None:
    text = GOOD.replace("- (none)", "- Error: upstream request failed (502 Bad Gateway)", 1)
    assert check_summary(text, HISTORY).passed


def test_a_complete_layout_may_end_with_a_quotation() -> None:
    quoted = GOOD + "\n- The user's last words (verbatim): keep the tests and the"
    assert check_summary(quoted, HISTORY).passed


def test_an_empty_section_is_refused() -> None:
    text = GOOD.replace("## Next Steps\n1. Continue.\n", "## Next Steps\n")
    verdict = check_summary(text, HISTORY)
    assert (verdict.check, verdict.reason) == ("sections", "sections empty: Next Steps")


def test_a_stray_file_tag_is_refused_and_a_whole_block_is_replaced() -> None:
    mangled = GOOD + "\n\n<modified-files>\nsrc/parser.py"
    assert check_summary(mangled, HISTORY).check == "file_lists"
    whole = GOOD + "\n\n<modified-files>\nsrc/old.py\n</modified-files>"
    assert check_summary(whole, HISTORY).passed  # ours replace it (D16)


def test_the_focus_must_be_named() -> None:
    focused = GateSpec(purpose="history", headings=HISTORY.headings, focus="the API promise")
    assert check_summary(GOOD, focused).check == "focus"
    named = GOOD.replace("Fix the parser.", "Fix the parser; keep the API promise.")
    assert check_summary(named, focused).passed


def test_a_short_summary_has_its_own_shape() -> None:
    short = GateSpec(purpose="short")
    assert check_summary("I changed `src/parser.py` to fix the crash.", short).passed
    assert check_summary(GOOD, short).check == "short_shape"


def test_a_small_input_still_allows_the_layout() -> None:
    tiny = GateSpec(purpose="history", headings=HISTORY.headings, input_chars=40)
    assert check_summary(GOOD, tiny).passed


def test_turn_prefix_and_branch_prompts_have_their_own_headings() -> None:
    assert layout_headings("turn_prefix") == (
        "Original Request",
        "Early Progress",
        "Context for Suffix",
    )
    assert "Goal" in layout_headings("branch_summary")
    prefix = GateSpec(purpose="turn_prefix", headings=layout_headings("turn_prefix"))
    assert check_summary(GOOD, prefix).check == "sections"
    assert check_summary(summary_text("x", purpose="turn_prefix"), prefix).passed


# -- the offline summary passes the gate ---------------------------------------------------------


def test_the_offline_summary_of_the_example_session_passes() -> None:
    session = Session.open(EXAMPLE)
    plan = plan_compaction(
        session.path(), CompactionSettings(keep_recent_tokens=200), context=session.context()
    )
    assert isinstance(plan, CompactionPlan)
    request = history_request(plan.messages_to_summarize, reserve_tokens=16384, focus="VAT")
    text = summarize(request)
    spec = GateSpec(
        purpose="history",
        headings=layout_headings("compaction_summary"),
        input_chars=len(str(request.messages[0]["content"])),
        focus="VAT",
        read_files=tuple(plan.read_files),
        modified_files=tuple(plan.modified_files),
    )
    assert check_summary(text, spec).passed


_WORDS = st.sampled_from(
    "fix the parser test run failed because config path src/app.py error passed and "
    "please check VAT rounding module done next".split()
)
_TEXT = st.lists(_WORDS, min_size=1, max_size=25).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(lambda t: {"role": "user", "content": t}, _TEXT),
            st.builds(
                lambda t: {"role": "assistant", "content": [{"type": "text", "text": t}]}, _TEXT
            ),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["history", "turn_prefix", "short", "branch"]),
)
def test_the_offline_summary_of_generated_sessions_passes(
    messages: list[Message], purpose: str
) -> None:
    builders: dict[str, Callable[[], Any]] = {
        "history": lambda: history_request(messages, reserve_tokens=2000),
        "turn_prefix": lambda: turn_prefix_request(messages, reserve_tokens=2000),
        "short": lambda: short_summary_request(messages, summary="S", reserve_tokens=2000),
        "branch": lambda: branch_request(messages),
    }
    request = builders[purpose]()
    prompt = {"history": "compaction_summary", "branch": "branch_summary"}.get(purpose, purpose)
    headings = () if purpose == "short" else layout_headings(prompt)
    spec = GateSpec(
        purpose=purpose, headings=headings, input_chars=len(str(request.messages[0]["content"]))
    )
    verdict = check_summary(summarize(request), spec)
    assert verdict.passed, verdict


# -- the table: ask again, next candidate, the offline fallback ----------------------------------

Rows = list[dict[str, Any]]


def table(edit: Callable[[Rows], None] | None = None) -> MachineDef:
    if edit is None:
        return load_machine("operation")
    data = tomllib.loads((data_dir("machines") / "operation.toml").read_text(encoding="utf-8"))
    edit(data["transitions"])
    return build(data, source="modified operation.toml", guards=None, effects=None)


def drop(event: str, effect: str) -> Callable[[Rows], None]:
    def edit(rows: Rows) -> None:
        rows[:] = [r for r in rows if not (r["event"] == event and effect in r.get("effects", []))]

    return edit


async def compact_with(
    *models: ScriptedModel,
    defn: MachineDef | None = None,
    fallback: bool = True,
    attempts: list[AttemptRecord] | None = None,
    gate: bool = True,
) -> Any:
    clock = FakeClock()
    routes = SummaryRoutes(
        candidates=models,
        retry=RetryPolicy(),
        sleep=clock.sleep,
        gate=gate,
        fallback=OfflineSummarizer() if fallback else None,
        on_attempt=(lambda record, _purpose: attempts.append(record))
        if attempts is not None
        else None,
    )
    tables = (lambda _name: defn) if defn is not None else load_machine
    ports = Ports(session=None, routes=routes, sleep=clock.sleep, tables=tables)
    job = CompactionJob(
        ports, routes, reason="manual", settings=CompactionSettings(), plan=two_turns_plan()
    )
    return await OperationRun(ports, job, routes=routes, dry_run=True).run()


@pytest.mark.parametrize(("check", "bad"), sorted(BAD.items()))
async def test_refused_twice_then_the_next_candidate_is_committed(check: str, bad: str) -> None:
    a = ScriptedModel([bad, bad], name="scripted/a")
    b = ScriptedModel([GOOD], name="scripted/b")
    attempts: list[AttemptRecord] = []
    outcome = await compact_with(a, b, attempts=attempts)
    assert outcome.status == "committed"
    assert isinstance(outcome.result, CompactionResult)
    assert outcome.result.model == "scripted/b"
    assert outcome.result.summary.startswith(GOOD)
    # Asked again once, told what was wrong.
    assert len(a.requests) == 2
    assert f"Your previous answer was refused ({check})" in a.requests[1].prompt
    assert "refused" not in a.requests[0].prompt
    assert [(r.candidate, r.outcome, r.check) for r in attempts] == [
        ("scripted/a", "retry", check),
        ("scripted/a", "next_candidate", check),
        ("scripted/b", "ok", None),
    ]
    assert outcome.result.details["provenance"]["gatePassedFirstTime"] is False


async def test_the_gate_is_on_by_default_and_gate_false_is_the_opt_out() -> None:
    assert SummaryRoutes(candidates=()).gate is True
    placeholder = "summary"  # none of the sections the prompt asks for
    checked = await compact_with(ScriptedModel([placeholder] * 2, name="scripted/a"))
    assert checked.result.model == "offline/extractive"
    # Ungated on purpose: the explicit opt-out commits any answer not empty and not cut off (D15).
    a = ScriptedModel([placeholder], name="scripted/a")
    unchecked = await compact_with(a, gate=False)
    assert unchecked.status == "committed"
    assert unchecked.result.model == "scripted/a"
    assert unchecked.result.summary == placeholder
    assert unchecked.result.details["provenance"]["gatePassedFirstTime"] is None
    assert len(a.requests) == 1


async def test_asked_again_the_same_candidate_may_pass() -> None:
    a = ScriptedModel([BAD["refusal"], GOOD], name="scripted/a")
    outcome = await compact_with(a)
    assert outcome.status == "committed"
    assert outcome.result.model == "scripted/a"


async def test_a_session_whose_only_model_fails_the_gate_gets_the_offline_summary() -> None:
    a = ScriptedModel([BAD["sections"]] * 2, name="scripted/a")
    outcome = await compact_with(a)
    assert outcome.status == "committed"
    assert outcome.result.model == "offline/extractive"
    assert outcome.result.summary.startswith("_Extractive summary generated offline")


async def test_without_the_fallback_it_fails_naming_the_check() -> None:
    a = ScriptedModel([BAD["refusal"]] * 2, name="scripted/a")
    outcome = await compact_with(a, fallback=False)
    assert outcome.status == "failed"
    assert outcome.error_kind == "refused"
    assert "refusal" in (outcome.error or "") or "refused" in (outcome.error or "")


async def test_without_the_ask_again_row_the_next_candidate_is_asked_at_once() -> None:
    a = ScriptedModel([BAD["refusal"], GOOD], name="scripted/a")
    b = ScriptedModel([GOOD], name="scripted/b")
    shipped = await compact_with(a, b)
    assert shipped.result.model == "scripted/a"
    a = ScriptedModel([BAD["refusal"], GOOD], name="scripted/a")
    b = ScriptedModel([GOOD], name="scripted/b")
    modified = await compact_with(a, b, defn=table(drop("summary_refused", "ask_again")))
    assert modified.result.model == "scripted/b"
    assert len(a.requests) == 1


async def test_without_the_fallback_row_a_refused_summary_fails() -> None:
    a = ScriptedModel([BAD["sections"]] * 2, name="scripted/a")
    modified = await compact_with(a, defn=table(drop("summary_refused", "use_fallback")))
    assert modified.status == "failed"


async def test_with_a_stricter_gate_guard_the_rambling_summary_is_committed() -> None:
    def only_between_parts(rows: Rows) -> None:
        for row in rows:
            if row["event"] == "summary_ready" and row["dest"] == "checking":
                row["guards"] = ["gate_enabled", "more_parts"]  # one request: never taken

    a = ScriptedModel([BAD["sections"]], name="scripted/a")
    modified = await compact_with(a, defn=table(only_between_parts))
    assert modified.status == "committed"
    assert modified.result.model == "scripted/a"


# -- a session on disk: unchanged when it fails, provenance when it commits ----------------------


async def run_on(path: Path, *models: ScriptedModel, fallback: bool) -> Any:
    session = Session.open(path)
    clock = FakeClock()
    routes = SummaryRoutes(
        candidates=models,
        sleep=clock.sleep,
        gate=True,
        fallback=OfflineSummarizer() if fallback else None,
    )
    ports = Ports(session=session, routes=routes, sleep=clock.sleep)
    settings_ = CompactionSettings(keep_recent_tokens=200)
    job = CompactionJob(ports, routes, reason="manual", settings=settings_, focus=None)
    try:
        return await OperationRun(ports, job, routes=routes).run()
    finally:
        session.close()


async def test_with_the_fallback_disabled_the_file_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    before = path.read_bytes()
    a = ScriptedModel([BAD["error_text"]] * 2, name="scripted/a")
    outcome = await run_on(path, a, fallback=False)
    assert outcome.status == "failed"
    assert path.read_bytes() == before


async def test_the_entry_records_its_provenance_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLE, path)
    a = ScriptedModel(
        [summary_text("Fix the rounding."), summary_text("p", purpose="turn_prefix")] * 2,
        name="scripted/a",
    )
    outcome = await run_on(path, a, fallback=True)
    assert outcome.status == "committed"
    last = json.loads(path.read_text(encoding="utf-8").splitlines()[-1])
    assert last["type"] == "compaction"
    details = last["details"]
    assert set(details) == {"readFiles", "modifiedFiles", "provenance"}
    origin = details["provenance"]
    assert origin["model"] == "scripted/a"
    assert len(origin["promptHash"]) == len(origin["inputHash"]) == 16
    assert origin["gatePassedFirstTime"] is True
    # Read back as a session: details is free-form, the entry loads and its lists stay.
    again = Session.open(path)
    entry = again.tree.entries[-1]
    assert entry["details"]["modifiedFiles"] == details["modifiedFiles"]
    again.close()


def test_a_hooks_summary_is_checked_as_a_hooks_text() -> None:
    # A hook writes its own format (issue 38): no sections, file lists or focus required; an
    # error, a refusal, a text cut off or longer than what it replaces is still refused.
    hook = GateSpec(purpose="hook", input_chars=3000, focus="invoices")
    own = "Goal: fix totals.\n<read-files>\na.py\n</read-files>\nDone: the parser."
    assert check_summary(own, hook).passed
    refused = {
        "error_text": "Error: upstream request failed (502 Bad Gateway)",
        "refusal": "I'm sorry, but I can't help with summarizing this conversation.",
        "truncated": "Goal: fix totals. We changed the parser and the",
        "too_long": "word " * 1000,
    }
    for check, text in refused.items():
        assert check_summary(text, hook).check == check
