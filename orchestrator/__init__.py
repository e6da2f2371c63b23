"""session-orchestrator: keeps long LLM agent sessions usable.

The façade. Everything public is re-exported here; implementation modules are private
(``_name.py``) and ``tests/test_public_api.py`` keeps this list honest. Test doubles live in
:mod:`orchestrator.testing`.
"""

from ._agent import Agent, AgentInput, ChatAgent, ToolSpec
from ._branch_plan import BranchPlan, collect_branch_entries, prepare_branch_entries
from ._compaction_plan import CompactionPlan, NothingToCompact, plan_compaction
from ._context import ContextBuilder, ModelRef, SessionContext, build_context
from ._errors import (
    Cancelled,
    DefinitionError,
    ModelError,
    OrchestratorError,
    SessionError,
    SessionLockedError,
    TransitionError,
)
from ._events import Event, EventBus
from ._guards import Facts
from ._hooks import Hooks
from ._journal import Journal
from ._jsonl_store import JsonlStore
from ._litellm_model import LiteLLMModel
from ._llm_messages import convert_to_llm
from ._machine import MachineDef, Runner, Step, load_machine
from ._machine_render import render_mermaid, render_table
from ._memory_store import MemoryStore
from ._model import Model, ModelRequest, ModelResponse, ToolCall, Usage
from ._offline import OfflineSummarizer
from ._prune import PrunePlan, apply_prune, plan_prune
from ._remote_model import RemoteSummaryModel
from ._retry import AttemptRecord, RetryPolicy
from ._runtime import AgentSession
from ._runtime_nav import ForkResult, NavigationResult
from ._runtime_ops import OperationOutcome
from ._runtime_types import RuntimeSettings, TurnResult
from ._serialize import serialize_conversation
from ._session import Session
from ._settle import settle
from ._store import LoadResult, Problem, SessionStore
from ._summarize import BranchSummaryResult, CompactionResult, Summarizer, compact, summarize_branch
from ._tokens import (
    CompactionSettings,
    ContextTokens,
    calculate_context_tokens,
    compaction_threshold,
    estimate_context_tokens,
    estimate_tokens,
    should_compact,
)
from ._trace_export import JsonLinesSpanExporter, make_tracer_provider, read_trace
from ._tracing import LifecycleTracer
from ._tree import SessionTree, TreeNode

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
    "Summarizer",
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
    "settle",
    "should_compact",
    "summarize_branch",
)
