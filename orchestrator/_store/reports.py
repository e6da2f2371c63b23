"""Read-only reports over a stored session: the inspection JSON objects and tree rows.

The command line, the JSON-RPC server and the TUI all show these; they live below the surfaces so
that no surface imports another.
"""

from __future__ import annotations

from typing import Any

from orchestrator._core.branch_plan import collect_branch_entries, prepare_branch_entries
from orchestrator._core.context import ContextBuilder
from orchestrator._core.entries import Entry, role_of, text_of
from orchestrator._store.session import Session


def context_report(session: Session, leaf: str | None) -> dict[str, Any]:
    """The ``orchestrator context --json`` object."""
    context = ContextBuilder(session.path(leaf) if leaf else []).context()
    tokens = context.tokens()
    entries = [session.tree.by_id.get(entry_id) or {} for entry_id in context.entry_ids]
    return {
        "leafId": leaf,
        "messages": list(context.messages),
        "thinkingLevel": context.thinking_level,
        "model": context.model.as_json() if context.model else None,
        "tokens": tokens.as_json(),
        "messageTokens": list(context.estimates),
        # D29, as pi 1.x counts: a usage from before the latest compaction or context edit is
        # set aside ("tokens" is then the estimate); these say whether one was, and its count.
        "staleUsage": tokens.stale_usage,
        "estimatedTokens": tokens.estimated_tokens,
        "staleUsageTokens": tokens.stale_usage_tokens,
        # Ours too: the short summary of each summary message (None elsewhere, or none written).
        "messageShortSummaries": [short_summary_of(entry) for entry in entries],
    }


def branch_report(session: Session, old_leaf: str, target: str, budget: int) -> dict[str, Any]:
    """The branch form of ``orchestrator plan --json``."""
    session.tree.get(old_leaf)
    session.tree.get(target)
    entries, ancestor = collect_branch_entries(session.tree, old_leaf, target)
    plan = prepare_branch_entries(
        entries, budget, old_leaf_id=old_leaf, target_id=target, common_ancestor_id=ancestor
    )
    return plan.as_json()


def preview_message(message: dict[str, Any], width: int = 70) -> str:
    """One line of a message's text, cut to ``width`` characters."""
    # A field of the wrong type (a number or null for a text, D3) previews as empty: the
    # report is of the file as it is, and never a traceback (nor a Python repr of the value).
    role = message.get("role")
    if role in ("compactionSummary", "branchSummary"):
        text = _text(message.get("summary"))
    elif role == "bashExecution":
        text = f"$ {_text(message.get('command'))}"
    elif role == "assistant":
        parts = []
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(_text(block.get("text")))
            elif isinstance(block, dict) and block.get("type") == "toolCall":
                parts.append(f"{_text(block.get('name'))}(…)")
        text = " ".join(parts)
    else:
        text = text_of(message.get("content"))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def short_summary_of(entry: Entry) -> str | None:
    """The ``shortSummary`` of a compaction or branch summary entry, if one was written."""
    if entry.get("type") not in ("compaction", "branch_summary"):
        return None
    short = entry.get("shortSummary")
    return short if isinstance(short, str) and short.strip() else None


def describe_entry(entry: Entry) -> str:
    """A one-line description of an entry for trees and pickers.

    A summary with a short summary is described by it: that is what it was written for.
    """
    kind = entry.get("type")
    role = role_of(entry)
    if role is not None:
        return f"{role}: {preview_message(entry['message'])}"
    if kind in ("compaction", "branch_summary"):
        text = short_summary_of(entry) or entry.get("summary", "")
        summary = {"role": "compactionSummary", "summary": text}
        name = "compaction" if kind == "compaction" else "branch summary"
        return f"{name}: {preview_message(summary)}"
    if kind == "model_change":
        model = entry.get("modelId", entry.get("model"))
        return f"model → {_text(entry.get('provider'))}/{_text(model)}"
    if kind == "thinking_level_change":
        return f"thinking → {entry.get('thinkingLevel')}"
    if kind == "label":
        return f"label {entry.get('targetId')} = {entry.get('label', '(cleared)')}"
    if kind == "custom_message":
        return f"custom message [{entry.get('customType')}]: {text_of(entry.get('content'))[:60]}"
    return str(kind)


def tree_rows(session: Session) -> list[dict[str, Any]]:
    """Depth-first rows of the tree; depth grows only where the tree branches."""
    active = {e["id"] for e in session.path()}
    rows: list[dict[str, Any]] = []
    stack = [(0, node, False) for node in reversed(session.tree.nodes())]
    while stack:
        depth, node, _ = stack.pop()
        entry = node.entry
        rows.append(
            {
                "id": entry["id"],
                "parentId": entry.get("parentId"),
                "type": entry.get("type"),
                "role": role_of(entry),
                "label": node.label,
                "depth": depth,
                "onActivePath": entry["id"] in active,
                "isLeaf": entry["id"] == session.leaf_id,
                "text": describe_entry(entry),
                "shortSummary": short_summary_of(entry),
            }
        )
        child_depth = depth + 1 if len(node.children) > 1 else depth
        stack.extend((child_depth, child, False) for child in reversed(node.children))
    return rows
