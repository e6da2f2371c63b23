"""The façade: a sorted ``__all__`` of names that exist, and nothing private leaks."""

from __future__ import annotations

import subprocess
import sys

import orchestrator
import orchestrator.testing

# The public names, written out: dropping or renaming one breaks users, so it must fail here and
# be a deliberate edit of this snapshot (and a line in docs/python-api.md), never a side effect.
PUBLIC_API = (
    "Agent",
    "AgentInput",
    "AgentSession",
    "AttemptRecord",
    "BranchPlan",
    "BranchSummaryResult",
    "Cancelled",
    "ChatAgent",
    "CompactionPlan",
    "CompactionResult",
    "CompactionSettings",
    "ConflictError",
    "ContextBuilder",
    "ContextOverflowError",
    "ContextTokens",
    "DefinitionError",
    "EmptyReplyError",
    "Event",
    "EventBus",
    "FatalModelError",
    "ForkResult",
    "Hooks",
    "Journal",
    "JsonLinesSpanExporter",
    "JsonlStore",
    "LifecycleTracer",
    "LiteLLMModel",
    "LoadResult",
    "MachineDef",
    "MemoryStore",
    "Model",
    "ModelError",
    "ModelRef",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeoutError",
    "NavigationFacts",
    "NavigationResult",
    "NothingToCompact",
    "OfflineSummarizer",
    "OperationFacts",
    "OperationOutcome",
    "OrchestratorError",
    "Problem",
    "PrunePlan",
    "RemoteSummaryModel",
    "RetryPolicy",
    "Runner",
    "RuntimeSettings",
    "Session",
    "SessionContext",
    "SessionError",
    "SessionFacts",
    "SessionLockedError",
    "SessionStore",
    "SessionTree",
    "Step",
    "StorageError",
    "SummaryRefusedError",
    "SummaryRoutes",
    "Tail",
    "ToolCall",
    "ToolSpec",
    "TransientModelError",
    "TransitionError",
    "TreeNode",
    "TruncatedReplyError",
    "TurnFacts",
    "TurnResult",
    "Usage",
    "apply_prune",
    "build_context",
    "calculate_context_tokens",
    "collect_branch_entries",
    "compact",
    "compaction_threshold",
    "convert_to_llm",
    "estimate_context_tokens",
    "estimate_tokens",
    "load_machine",
    "make_tracer_provider",
    "pi_branch_reserve_tokens",
    "pi_settings",
    "pi_settings_paths",
    "plan_compaction",
    "plan_prune",
    "prepare_branch_entries",
    "read_trace",
    "render_mermaid",
    "render_table",
    "serialize_conversation",
    "settle_unfinished_operations",
    "should_compact",
    "summarize_branch",
)

TESTING_API = (
    "AgentHang",
    "Delay",
    "FakeClock",
    "FunctionModel",
    "Hang",
    "LocalProvider",
    "RecordedRequest",
    "Reply",
    "ScriptedAgent",
    "ScriptedModel",
    "error_reply",
    "reply",
    "summary_text",
    "tool_result",
    "usage",
)


def test_public_names_match_the_snapshot() -> None:
    assert tuple(sorted(orchestrator.__all__)) == PUBLIC_API


def test_testing_names_match_the_snapshot() -> None:
    assert tuple(sorted(orchestrator.testing.__all__)) == TESTING_API


def test_all_is_sorted_unique_and_importable() -> None:
    names = list(orchestrator.__all__)
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(orchestrator, name) is not None
        assert not name.startswith("_")


def test_public_objects_come_from_private_modules() -> None:
    for name in orchestrator.__all__:
        module = getattr(getattr(orchestrator, name), "__module__", "orchestrator._x")
        assert module.startswith("orchestrator._"), (name, module)


def test_testing_exports_exist() -> None:
    for name in orchestrator.testing.__all__:
        assert hasattr(orchestrator.testing, name)


def test_import_is_quiet_and_lazy() -> None:
    # No network at import: litellm (and its cost-map download) loads only on a real call.
    code = "import sys, orchestrator, orchestrator.testing; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""
