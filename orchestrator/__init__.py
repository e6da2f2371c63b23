"""session-orchestrator: keeps long LLM agent sessions usable.

The façade. Everything public is re-exported here; implementation modules are private
(``_name.py``) and ``tests/test_public_api.py`` keeps this list honest. Test doubles live in
:mod:`orchestrator.testing`.

The re-exports are lazy (PEP 562): ``import orchestrator`` imports nothing else, and a name's
module is imported the first time the name is used. A command that only reads a session file
then never pays for the runtime, the model clients or tracing (issue 9: imports were most of a
short command's time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator._core.branch_plan import (
        BranchPlan,
        collect_branch_entries,
        prepare_branch_entries,
    )
    from orchestrator._core.compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
    from orchestrator._core.context import ContextBuilder, ModelRef, SessionContext, build_context
    from orchestrator._core.errors import (
        Cancelled,
        ConflictError,
        ContextOverflowError,
        DefinitionError,
        EmptyReplyError,
        FatalModelError,
        ModelError,
        ModelTimeoutError,
        OrchestratorError,
        SessionError,
        SessionLockedError,
        StorageError,
        SummaryRefusedError,
        TransientModelError,
        TransitionError,
        TruncatedReplyError,
    )
    from orchestrator._core.load_result import LoadResult, Problem, Tail
    from orchestrator._core.messages import convert_to_llm
    from orchestrator._core.model import Model, ModelRequest, ModelResponse, ToolCall, Usage
    from orchestrator._core.prune import PrunePlan, apply_prune, plan_prune
    from orchestrator._core.serialize import serialize_conversation
    from orchestrator._core.tokens import (
        CompactionSettings,
        ContextTokens,
        calculate_context_tokens,
        compaction_threshold,
        estimate_context_tokens,
        estimate_tokens,
        should_compact,
    )
    from orchestrator._core.tree import SessionTree, TreeNode
    from orchestrator._lifecycle.guards import (
        NavigationFacts,
        OperationFacts,
        SessionFacts,
        TurnFacts,
    )
    from orchestrator._lifecycle.machine import MachineDef, Runner, Step, load_machine
    from orchestrator._lifecycle.render import render_mermaid, render_table
    from orchestrator._models.litellm import LiteLLMModel
    from orchestrator._models.offline import OfflineSummarizer
    from orchestrator._models.remote import RemoteSummaryModel
    from orchestrator._runtime.agent import Agent, AgentInput, ChatAgent, ToolSpec
    from orchestrator._runtime.events import Event, EventBus
    from orchestrator._runtime.hooks import Hooks
    from orchestrator._runtime.operation.retry import AttemptRecord, RetryPolicy
    from orchestrator._runtime.operation.runner import compact, summarize_branch
    from orchestrator._runtime.operation.summarize import (
        BranchSummaryResult,
        CompactionResult,
        SummaryRoutes,
    )
    from orchestrator._runtime.session import AgentSession
    from orchestrator._runtime.types import (
        ForkResult,
        NavigationResult,
        OperationOutcome,
        RuntimeSettings,
        TurnResult,
    )
    from orchestrator._store.journal import Journal
    from orchestrator._store.jsonl import JsonlStore
    from orchestrator._store.memory import MemoryStore
    from orchestrator._store.pi_settings_files import (
        pi_branch_reserve_tokens,
        pi_settings,
        pi_settings_paths,
    )
    from orchestrator._store.protocol import SessionStore
    from orchestrator._store.session import Session
    from orchestrator._store.settle import settle_unfinished_operations
    from orchestrator._telemetry.export import (
        JsonLinesSpanExporter,
        make_tracer_provider,
        read_trace,
    )
    from orchestrator._telemetry.tracing import LifecycleTracer

__all__ = (
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

_EXPORTS: dict[str, str] = {
    "Agent": "orchestrator._runtime.agent",
    "AgentInput": "orchestrator._runtime.agent",
    "AgentSession": "orchestrator._runtime.session",
    "AttemptRecord": "orchestrator._runtime.operation.retry",
    "BranchPlan": "orchestrator._core.branch_plan",
    "BranchSummaryResult": "orchestrator._runtime.operation.summarize",
    "Cancelled": "orchestrator._core.errors",
    "ChatAgent": "orchestrator._runtime.agent",
    "CompactionPlan": "orchestrator._core.compaction_plan",
    "CompactionResult": "orchestrator._runtime.operation.summarize",
    "CompactionSettings": "orchestrator._core.tokens",
    "ConflictError": "orchestrator._core.errors",
    "ContextBuilder": "orchestrator._core.context",
    "ContextOverflowError": "orchestrator._core.errors",
    "ContextTokens": "orchestrator._core.tokens",
    "DefinitionError": "orchestrator._core.errors",
    "EmptyReplyError": "orchestrator._core.errors",
    "Event": "orchestrator._runtime.events",
    "EventBus": "orchestrator._runtime.events",
    "FatalModelError": "orchestrator._core.errors",
    "ForkResult": "orchestrator._runtime.types",
    "Hooks": "orchestrator._runtime.hooks",
    "Journal": "orchestrator._store.journal",
    "JsonLinesSpanExporter": "orchestrator._telemetry.export",
    "JsonlStore": "orchestrator._store.jsonl",
    "LifecycleTracer": "orchestrator._telemetry.tracing",
    "LiteLLMModel": "orchestrator._models.litellm",
    "LoadResult": "orchestrator._core.load_result",
    "MachineDef": "orchestrator._lifecycle.machine",
    "MemoryStore": "orchestrator._store.memory",
    "Model": "orchestrator._core.model",
    "ModelError": "orchestrator._core.errors",
    "ModelRef": "orchestrator._core.context",
    "ModelRequest": "orchestrator._core.model",
    "ModelResponse": "orchestrator._core.model",
    "ModelTimeoutError": "orchestrator._core.errors",
    "NavigationFacts": "orchestrator._lifecycle.guards",
    "NavigationResult": "orchestrator._runtime.types",
    "NothingToCompact": "orchestrator._core.compaction_plan",
    "OfflineSummarizer": "orchestrator._models.offline",
    "OperationFacts": "orchestrator._lifecycle.guards",
    "OperationOutcome": "orchestrator._runtime.types",
    "OrchestratorError": "orchestrator._core.errors",
    "Problem": "orchestrator._core.load_result",
    "PrunePlan": "orchestrator._core.prune",
    "RemoteSummaryModel": "orchestrator._models.remote",
    "RetryPolicy": "orchestrator._runtime.operation.retry",
    "Runner": "orchestrator._lifecycle.machine",
    "RuntimeSettings": "orchestrator._runtime.types",
    "Session": "orchestrator._store.session",
    "SessionContext": "orchestrator._core.context",
    "SessionError": "orchestrator._core.errors",
    "SessionFacts": "orchestrator._lifecycle.guards",
    "SessionLockedError": "orchestrator._core.errors",
    "SessionStore": "orchestrator._store.protocol",
    "SessionTree": "orchestrator._core.tree",
    "Step": "orchestrator._lifecycle.machine",
    "StorageError": "orchestrator._core.errors",
    "SummaryRefusedError": "orchestrator._core.errors",
    "SummaryRoutes": "orchestrator._runtime.operation.summarize",
    "Tail": "orchestrator._core.load_result",
    "ToolCall": "orchestrator._core.model",
    "ToolSpec": "orchestrator._runtime.agent",
    "TransientModelError": "orchestrator._core.errors",
    "TransitionError": "orchestrator._core.errors",
    "TreeNode": "orchestrator._core.tree",
    "TruncatedReplyError": "orchestrator._core.errors",
    "TurnFacts": "orchestrator._lifecycle.guards",
    "TurnResult": "orchestrator._runtime.types",
    "Usage": "orchestrator._core.model",
    "apply_prune": "orchestrator._core.prune",
    "build_context": "orchestrator._core.context",
    "calculate_context_tokens": "orchestrator._core.tokens",
    "collect_branch_entries": "orchestrator._core.branch_plan",
    "compact": "orchestrator._runtime.operation.runner",
    "compaction_threshold": "orchestrator._core.tokens",
    "convert_to_llm": "orchestrator._core.messages",
    "estimate_context_tokens": "orchestrator._core.tokens",
    "estimate_tokens": "orchestrator._core.tokens",
    "load_machine": "orchestrator._lifecycle.machine",
    "make_tracer_provider": "orchestrator._telemetry.export",
    "pi_branch_reserve_tokens": "orchestrator._store.pi_settings_files",
    "pi_settings": "orchestrator._store.pi_settings_files",
    "pi_settings_paths": "orchestrator._store.pi_settings_files",
    "plan_compaction": "orchestrator._core.compaction_plan",
    "plan_prune": "orchestrator._core.prune",
    "prepare_branch_entries": "orchestrator._core.branch_plan",
    "read_trace": "orchestrator._telemetry.export",
    "render_mermaid": "orchestrator._lifecycle.render",
    "render_table": "orchestrator._lifecycle.render",
    "serialize_conversation": "orchestrator._core.serialize",
    "settle_unfinished_operations": "orchestrator._store.settle",
    "should_compact": "orchestrator._core.tokens",
    "summarize_branch": "orchestrator._runtime.operation.runner",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary global, not this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
