"""session-orchestrator: keeps long LLM agent sessions usable.

The façade. Everything public is re-exported here; implementation modules are private
(``_name.py``) and ``tests/test_public_api.py`` keeps this list honest. Test doubles live in
:mod:`orchestrator.testing`.
"""

from orchestrator._core.branch_plan import (
    BranchPlan,
    collect_branch_entries,
    prepare_branch_entries,
)
from orchestrator._core.compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from orchestrator._core.context import ContextBuilder, ModelRef, SessionContext, build_context
from orchestrator._core.errors import (
    Cancelled,
    DefinitionError,
    ModelError,
    OrchestratorError,
    SessionError,
    SessionLockedError,
    TransitionError,
)
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
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import MachineDef, Runner, Step, load_machine
from orchestrator._lifecycle.render import render_mermaid, render_table
from orchestrator._models.litellm import LiteLLMModel
from orchestrator._models.offline import OfflineSummarizer
from orchestrator._models.remote import RemoteSummaryModel
from orchestrator._runtime.agent import Agent, AgentInput, ChatAgent, ToolSpec
from orchestrator._runtime.events import Event, EventBus
from orchestrator._runtime.hooks import Hooks
from orchestrator._runtime.navigate import ForkResult, NavigationResult
from orchestrator._runtime.operations import OperationOutcome
from orchestrator._runtime.retry import AttemptRecord, RetryPolicy
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.summarize import (
    BranchSummaryResult,
    CompactionResult,
    SummaryRoutes,
    compact,
    summarize_branch,
)
from orchestrator._runtime.types import RuntimeSettings, TurnResult
from orchestrator._store.journal import Journal
from orchestrator._store.jsonl import JsonlStore
from orchestrator._store.memory import MemoryStore
from orchestrator._store.protocol import LoadResult, Problem, SessionStore
from orchestrator._store.session import Session
from orchestrator._store.settle import settle_unfinished_operations
from orchestrator._telemetry.export import JsonLinesSpanExporter, make_tracer_provider, read_trace
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
    "ContextBuilder",
    "ContextTokens",
    "DefinitionError",
    "Event",
    "EventBus",
    "Facts",
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
    "NavigationResult",
    "NothingToCompact",
    "OfflineSummarizer",
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
    "SessionLockedError",
    "SessionStore",
    "SessionTree",
    "Step",
    "SummaryRoutes",
    "ToolCall",
    "ToolSpec",
    "TransitionError",
    "TreeNode",
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
