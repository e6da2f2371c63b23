"""Model failure kinds are classes: each keeps its recorded word, and a word gives the class back.

The word (``kind``) is what the journal, the Temporal results, the scenarios, the traces and
``--json`` carry; the class is what code catches. These tests pin both directions and the
places a word read back from a record becomes a class again.
"""

from __future__ import annotations

import pickle

import pytest
from trio.testing import MockClock

import orchestrator
from orchestrator._cluster.contract import CompressResult, NavigateResult
from orchestrator._core.errors import (
    MODEL_ERRORS,
    ContextOverflowError,
    EmptyReplyError,
    FatalModelError,
    ModelError,
    ModelTimeoutError,
    OrchestratorError,
    SummaryRefusedError,
    TransientModelError,
    TruncatedReplyError,
    error_class,
    error_name,
    model_error,
)
from orchestrator._core.model import ModelRequest
from orchestrator._lifecycle.names import OperationState
from orchestrator._rpc.cluster_hub import compacted, navigate_answer
from orchestrator._rpc.errors import error_for
from orchestrator._runtime.agent import AgentInput, ChatAgent, error_message
from orchestrator._runtime.operation.runner import raise_for
from orchestrator._runtime.outcomes import RETRYABLE
from orchestrator._runtime.turn.replies import classify
from orchestrator._runtime.types import OperationOutcome, RuntimeSettings
from orchestrator.testing import Hang, ScriptedModel

KINDS = {
    "fatal": FatalModelError,
    "transient": TransientModelError,
    "timeout": ModelTimeoutError,
    "overflow": ContextOverflowError,
    "truncated": TruncatedReplyError,
    "empty": EmptyReplyError,
    "refused": SummaryRefusedError,
}


def test_each_kind_has_one_class_that_keeps_its_word() -> None:
    assert dict(MODEL_ERRORS) == KINDS
    for kind, cls in KINDS.items():
        error = cls("boom", retry_after=2.0, status=503)
        assert (error.kind, str(error), error.retry_after, error.status) == (kind, "boom", 2.0, 503)
        assert isinstance(error, ModelError)
        assert isinstance(error, OrchestratorError)
        # Public: a caller catches them from the package itself.
        assert getattr(orchestrator, cls.__name__) is cls


def test_a_timeout_is_retried_as_a_transient_failure_is() -> None:
    assert issubclass(ModelTimeoutError, TransientModelError)
    assert RETRYABLE == {"transient", "timeout"}
    for cls in (ContextOverflowError, TruncatedReplyError, EmptyReplyError, SummaryRefusedError):
        assert not issubclass(cls, TransientModelError)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_recorded_kind_round_trips_to_the_same_class(kind: str) -> None:
    raised = KINDS[kind]("the provider's words", retry_after=1.5, status=429)
    rebuilt = model_error(raised.kind, str(raised), retry_after=1.5, status=429)
    assert type(rebuilt) is type(raised)
    assert (rebuilt.kind, str(rebuilt), rebuilt.retry_after, rebuilt.status) == (
        kind,
        "the provider's words",
        1.5,
        429,
    )
    assert error_class(kind) is KINDS[kind]
    # A process boundary that pickles the exception keeps the class and the hints too.
    unpickled = pickle.loads(pickle.dumps(raised))  # noqa: S301 - our own bytes
    assert type(unpickled) is type(raised)
    assert (unpickled.kind, unpickled.retry_after, unpickled.status) == (kind, 1.5, 429)


def test_an_unknown_kind_is_refused_naming_the_known_ones() -> None:
    known = "empty, fatal, overflow, refused, timeout, transient, truncated"
    with pytest.raises(
        ValueError, match=f"^unknown model error kind 'flaky'; the kinds are {known}$"
    ):
        model_error("flaky", "boom")
    with pytest.raises(ValueError, match="unknown model error kind 'flaky'"):
        ModelError("boom", kind="flaky")
    with pytest.raises(ValueError, match="unknown model error kind None"):
        error_class(None)  # type: ignore[arg-type]


def test_the_old_keyword_still_builds_the_kinds_class() -> None:
    # Routes written before the classes raise ModelError(..., kind=...): caught by type as before.
    for kind, cls in KINDS.items():
        error = ModelError("x", kind=kind, retry_after=3.0)
        assert (type(error), error.kind, error.retry_after) == (cls, kind, 3.0)
    assert type(ModelError("no kind said")) is FatalModelError
    assert type(TransientModelError("x", kind="timeout")) is ModelTimeoutError
    with pytest.raises(
        ValueError,
        match=r"^ContextOverflowError cannot be of kind 'transient' \(a TransientModelError\)$",
    ):
        ContextOverflowError("x", kind="transient")


def test_the_message_is_redacted_whatever_the_class() -> None:
    error = TransientModelError("401 for key sk-abcdefghijklmnopqrstuvwxyz0123456789")
    assert "sk-abcdef" not in str(error)
    assert "[redacted]" in str(error)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_failed_operation_raises_its_kinds_class(kind: str) -> None:
    outcome = OperationOutcome(
        operation_id="op-1",
        status=OperationState.FAILED,
        error="it went wrong",
        error_kind=kind,
        retry_after=4.0,
    )
    with pytest.raises(ModelError) as caught:
        raise_for(outcome)
    assert (type(caught.value), str(caught.value), caught.value.retry_after) == (
        KINDS[kind],
        "it went wrong",
        4.0,
    )


def test_a_failed_operation_without_a_kind_is_fatal() -> None:
    outcome = OperationOutcome(operation_id="op-1", status=OperationState.FAILED)
    with pytest.raises(FatalModelError, match="^Compaction failed$"):
        raise_for(outcome)


def test_the_clusters_results_raise_their_kinds_class() -> None:
    done = CompressResult(
        operation_id="op-1",
        status=OperationState.FAILED,
        error="halved thrice",
        error_kind="overflow",
    )
    with pytest.raises(ContextOverflowError, match="^halved thrice$"):
        compacted(done)
    refused = NavigateResult(navigation_id="n-1", status="failed", error_kind="refused")
    with pytest.raises(SummaryRefusedError, match="^Branch summarization failed$"):
        navigate_answer(refused)
    bogus = CompressResult(operation_id="op-1", status=OperationState.FAILED, error_kind="flaky")
    with pytest.raises(ValueError, match="unknown model error kind 'flaky'"):
        compacted(bogus)


def reply_with(kind: object, words: str) -> dict[str, object]:
    return {"role": "assistant", "stopReason": "error", "errorMessage": words, "errorKind": kind}


def test_a_failed_replys_kind_is_judged_by_its_class() -> None:
    settings = RuntimeSettings()
    # The words say nothing either way: the class decides.
    assert classify(reply_with("timeout", "no answer"), settings, stale=False).outcome == (
        "transient"
    )
    assert classify(reply_with("overflow", "boom"), settings, stale=False).outcome == "overflow"
    assert classify(reply_with("empty", "boom"), settings, stale=False).outcome == "fatal"
    # A word we do not know (a session file anyone may write) is not refused: the text judges.
    unknown = reply_with("flaky", "503 Service Unavailable")
    assert classify(unknown, settings, stale=False).outcome == "transient"
    assert classify(reply_with(7, "boom"), settings, stale=False).outcome == "fatal"


def test_an_error_reply_records_the_classs_word() -> None:
    message = error_message(ModelTimeoutError("slow", retry_after=2.5), 0)
    assert (message["errorKind"], message["retryAfterMs"]) == ("timeout", 2500)


def test_records_that_name_the_class_still_say_model_error() -> None:
    # A failed reply with no text was written "ModelError" before the kinds had classes.
    for cls in KINDS.values():
        message = error_message(cls(""), 0)
        assert (message["errorMessage"], message["errorKind"]) == ("ModelError", cls.kind)
        answer = error_for(cls(""))
        assert (str(answer), answer.data) == ("ModelError", {"kind": cls.kind})
        assert error_name(cls("x")) == "ModelError"
    assert error_name(ValueError("x")) == "ValueError"
    assert error_message(ValueError(""), 0)["errorMessage"] == "ValueError"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock-clock")],
)
async def test_a_chat_call_past_its_time_limit_is_a_model_timeout() -> None:
    agent = ChatAgent(model=ScriptedModel([Hang(), Hang()], name="scripted/slow"), timeout_s=30)
    request = ModelRequest(
        purpose="chat", system="", messages=({"role": "user", "content": "hi"},), max_tokens=100
    )
    with pytest.raises(ModelTimeoutError, match="^scripted/slow: no answer after 30 s$"):
        await agent._complete(request)
    # In a turn the class is recorded as its word, which the turn reads as transient.
    turn = AgentInput(
        messages=({"role": "user", "content": "hi"},),
        model=None,
        thinking_level="off",
        now_ms=lambda: 0,
    )
    [reply] = [m async for m in agent.run(turn)]
    assert (reply["errorKind"], reply["errorMessage"]) == (
        "timeout",
        "scripted/slow: no answer after 30 s",
    )
