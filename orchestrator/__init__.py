"""session-orchestrator: keeps long LLM agent sessions usable."""

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
from ._model import Model, ModelRequest, ModelResponse, ToolCall, Usage
from ._tokens import (
    CompactionSettings,
    ContextTokens,
    calculate_context_tokens,
    compaction_threshold,
    estimate_context_tokens,
    estimate_tokens,
    should_compact,
)
from ._tree import SessionTree, TreeNode

__all__ = (
    "Cancelled",
    "CompactionSettings",
    "ContextBuilder",
    "ContextTokens",
    "DefinitionError",
    "Model",
    "ModelError",
    "ModelRef",
    "ModelRequest",
    "ModelResponse",
    "OrchestratorError",
    "SessionContext",
    "SessionError",
    "SessionLockedError",
    "SessionTree",
    "ToolCall",
    "TransitionError",
    "TreeNode",
    "Usage",
    "build_context",
    "calculate_context_tokens",
    "compaction_threshold",
    "estimate_context_tokens",
    "estimate_tokens",
    "should_compact",
)
