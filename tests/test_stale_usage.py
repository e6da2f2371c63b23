"""D29: a provider usage measured before the latest compaction (or context edit) is stale.

After a compaction that keeps recent messages, the kept assistant reply still carries the usage
of the whole pre-compaction context. pi 0.x anchored its count on it; pi 1.x sets it aside and
counts the estimate, as we had decided: ``tokens`` is the estimate, the JSON says a usage was
set aside and what it counted (``staleUsageTokens``), and nothing triggers on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator._core.compaction_plan import plan_report
from orchestrator._core.context import build_context
from orchestrator._core.tokens import CompactionSettings, usage_is_stale
from tests.cli_kit import run
from tests.sessions import SessionBuilder, usage


def _compacted_with_kept_usage() -> SessionBuilder:
    s = SessionBuilder()
    s.user("x" * 4000)
    kept = s.user("y" * 40)
    s.assistant("z" * 40, usage=usage(90_000))
    s.compaction("summary " * 10, first_kept=kept)
    return s


def test_usage_on_a_kept_reply_is_stale_and_the_estimate_is_given() -> None:
    s = _compacted_with_kept_usage()
    context = build_context(s.path())
    tokens = context.tokens()
    assert tokens.tokens == tokens.estimated_tokens == sum(context.estimates) < 100  # pi 1.x
    assert tokens.stale_usage is True
    assert tokens.stale_usage_tokens == 90_000
    assert tokens.last_usage_index is None
    assert tokens.trusted_tokens == tokens.estimated_tokens


def test_a_reply_after_the_compaction_is_fresh_again() -> None:
    s = _compacted_with_kept_usage()
    s.user("next")
    s.assistant("ok", usage=usage(5_000))
    tokens = build_context(s.path()).tokens()
    assert (tokens.tokens, tokens.stale_usage) == (5_000, False)
    assert tokens.trusted_tokens == 5_000


def test_without_a_compaction_nothing_is_stale() -> None:
    s = SessionBuilder()
    s.user("hello")
    s.assistant("hi", usage=usage(70_000))
    tokens = build_context(s.path()).tokens()
    assert (tokens.stale_usage, tokens.trusted_tokens) == (False, 70_000)
    assert usage_is_stale(None, 3) is False
    assert usage_is_stale(1, 2) is True
    assert usage_is_stale(2, 2) is False


def test_the_plan_trigger_ignores_stale_usage() -> None:
    s = _compacted_with_kept_usage()
    report = plan_report(s.path(), CompactionSettings(), 50_000)
    assert report["contextTokens"] == report["estimatedTokens"] < 100
    assert (report["staleUsage"], report["staleUsageTokens"]) == (True, 90_000)
    assert report["shouldCompact"] is False  # 90,000 would be over 33,616; the estimate is not


def test_cli_after_compact_shows_the_estimate_and_says_stale(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "compact", str(example))[0] == 0
    code, out, _ = run(capsys, "context", str(example), "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report["tokens"]) == {"tokens", "usageTokens", "trailingTokens", "lastUsageIndex"}
    assert report["staleUsage"] is True
    assert report["estimatedTokens"] == sum(report["messageTokens"])
    assert report["tokens"]["tokens"] == report["estimatedTokens"]
    assert report["staleUsageTokens"] > report["estimatedTokens"]

    code, out, _ = run(capsys, "context", str(example))
    last = out.splitlines()[-1]
    assert f"~{report['estimatedTokens']} tokens estimated" in last
    assert f"provider usage ~{report['staleUsageTokens']} is stale" in last

    code, out, _ = run(capsys, "plan", str(example), "--json")
    plan = json.loads(out)
    assert (plan["staleUsage"], plan["estimatedTokens"]) == (True, report["estimatedTokens"])
    code, out, _ = run(capsys, "plan", str(example))
    assert out.startswith(f"context: ~{report['estimatedTokens']} tokens estimated")
    assert "is stale" in out.splitlines()[0]


def test_cli_with_a_fresh_usage_shows_pi_s_number(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example's last reply came after its older compaction: that usage is believed.
    code, out, _ = run(capsys, "context", str(example), "--json")
    report = json.loads(out)
    assert report["staleUsage"] is False
    code, text, _ = run(capsys, "context", str(example))
    assert f"~{report['tokens']['tokens']} tokens (model" in text.splitlines()[-1]
    assert "stale" not in text
