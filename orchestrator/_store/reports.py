"""Read-only reports over a stored session: the inspection JSON objects and tree rows.

The command line, the JSON-RPC server and the TUI all show these; they live below the surfaces so
that no surface imports another.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from orchestrator._core.branch_plan import collect_branch_entries, prepare_branch_entries
from orchestrator._core.context import ContextBuilder, SessionContext
from orchestrator._core.entries import CONTEXT_EDIT, USAGE, Entry, role_of, text_of
from orchestrator._core.load_result import Problem
from orchestrator._core.loading import gc_paused
from orchestrator._core.tokens import ContextTokens, is_token_count
from orchestrator._core.tree import SessionTree
from orchestrator._core.usage_check import USAGE_KEYS
from orchestrator._store.jsonl import JsonlStore, read_outline
from orchestrator._store.session import Session, not_a_session

_USAGE_NAMES = ("kind", "provider", "model")


def check_file(path: str) -> tuple[list[Problem], SessionTree | None]:
    """What ``check`` reports of a session file: its problems, and its tree of outlines.

    The problems and the entries are those :meth:`Session.open` finds, but the entries are
    outlines (:func:`~orchestrator._store.jsonl.read_outline`): ``check`` reads no message, and
    a big session is checked in a fraction of the memory. ``None``: an empty file, which opens
    as a new session.

    Raises:
        NotASessionError: the file holds no session header.
        SessionError: the file cannot be read.
    """
    store = JsonlStore(path, lock=False)
    if not store.exists():
        return [], None
    with gc_paused():
        result = read_outline(store.path)
        if result.header is None:
            raise not_a_session(store.location, result.problems)
        return result.problems, SessionTree(result.header, result.entries, result.index)


def context_report(session: Session, leaf: str | None) -> dict[str, Any]:
    """The ``orchestrator context --json`` object."""
    context = ContextBuilder(session.path(leaf) if leaf else []).context()
    return context_report_of(context, context.tokens(), session.tree.by_id, leaf)


def context_report_of(
    context: SessionContext, tokens: ContextTokens, by_id: Mapping[str, Entry], leaf: str | None
) -> dict[str, Any]:
    """:func:`context_report` from a context already built and its token count.

    It only reads ``context`` (an immutable view) and looks entries up in ``by_id``, so the
    server runs it in a worker thread while the session goes on (see ``_rpc/fair.py``).
    """
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
        "messageShortSummaries": _short_summaries(context, by_id),
    }


def _short_summaries(context: SessionContext, by_id: Mapping[str, Entry]) -> list[str | None]:
    """Each message's :func:`short_summary_of` its entry.

    Only a compaction or a branch summary has one, and their messages are the context's head
    (the latest compaction's) and summaries, which the index lists: the others are not looked
    up (a context of 40,000 messages has a handful).
    """
    ids = context.entry_ids
    view = context.index
    if view is None:
        return [short_summary_of(by_id.get(entry_id) or {}) for entry_id in ids]
    shorts: list[str | None] = [None] * len(ids)
    for k in itertools.chain(range(view.base), view.late):
        if k < view.count:
            shorts[k] = short_summary_of(by_id.get(ids[k]) or {})
    return shorts


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
    return one_line(text, width)


def one_line(text: str, width: int) -> str:
    """``text`` with its whitespace runs made one space, cut to ``width`` characters (``…``).

    Only as much of the text as the line needs is split: a tree of a big session previews
    every entry, and a tool result is often tens of kilobytes. The runs of a prefix made one
    are a prefix of the whole text's, so a prefix that gives more than ``width`` characters
    gives the same line as the whole text.
    """
    size = 4 * width
    while True:
        line = " ".join(text[:size].split())
        if len(line) > width:
            return line[: width - 1] + "…"
        if size >= len(text):
            return line
        size *= 4


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
    if kind == CONTEXT_EDIT:
        return _describe_edit(entry)
    if kind == USAGE:
        return _describe_usage(entry)
    return str(kind)


def _describe_edit(entry: Entry) -> str:
    edit = edit_of(entry)
    if edit is None:
        return "context edit"
    if edit["action"] == "omit":
        return f"context edit: omits {edit['targetId']}"
    replacement = entry["replacement"]
    content = replacement.get("content") if isinstance(replacement, dict) else None
    preview = preview_message({"role": "user", "content": content}, width=50)
    return f"context edit: replaces {edit['targetId']}" + (f": {preview}" if preview else "")


def _describe_usage(entry: Entry) -> str:
    usage = usage_of(entry)
    model = f"{usage['provider'] or '?'}/{usage['model'] or '?'}"
    total = usage["totalTokens"]
    tokens = f"{total} tokens" if total is not None else "tokens unknown"
    return (
        f"usage {usage['kind'] or '?'} {model}: {tokens} "
        f"({usage['input'] or 0} in, {usage['output'] or 0} out)"
    )


def edit_of(entry: Entry) -> dict[str, str] | None:
    """A context edit's ``targetId`` and action (``omit`` or ``replace``); ``None`` elsewhere.

    pi 1.x: ``replacement: null`` omits the target from the model's context, an object
    ``{content}`` replaces its content. An edit without a string target edits nothing.
    """
    target = entry.get("targetId")
    if entry.get("type") != CONTEXT_EDIT or not isinstance(target, str):
        return None
    action = "omit" if entry.get("replacement") is None else "replace"
    return {"targetId": target, "action": action}


def usage_of(entry: Entry) -> dict[str, Any]:
    """A pi 1.x ``usage`` entry's kind, provider, model and counts (``None`` where not usable)."""
    usage = entry.get("usage")
    counts = usage if isinstance(usage, dict) else {}
    fields: dict[str, Any] = {key: _text(entry.get(key)) or None for key in _USAGE_NAMES}
    for key in USAGE_KEYS:
        value = counts.get(key)
        fields[key] = value if is_token_count(value) else None
    return fields


def _edit_marks(
    tree: SessionTree, path: Sequence[Entry]
) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """Each target's edits (file order), and the edit in effect on the active path.

    The latest edit of a target on the active branch wins, as in pi.
    """
    edited_by: dict[str, list[str]] = {}
    for entry in tree.entries:
        edit = edit_of(entry)
        if edit is not None:
            edited_by.setdefault(edit["targetId"], []).append(entry["id"])
    in_effect: dict[str, dict[str, str]] = {}
    if edited_by:
        for entry in path:
            edit = edit_of(entry)
            if edit is not None:
                in_effect[edit["targetId"]] = {"id": entry["id"], "action": edit["action"]}
    return edited_by, in_effect


def edit_mark(row: dict[str, Any]) -> str:
    """What a tree row adds after its text for an edited entry (``""`` for the others)."""
    effect = row.get("contextEdit")
    if effect is not None:
        done = "omitted" if effect["action"] == "omit" else "replaced"
        return f" ({done} by {effect['id']})"
    if row.get("editedBy"):
        return f" (edited off the active path by {', '.join(row['editedBy'])})"
    return ""


def tree_rows(session: Session) -> list[dict[str, Any]]:
    """Depth-first rows of the tree; depth grows only where the tree branches."""
    return list(iter_tree_rows(session.tree, session.path(), session.leaf_id))


def iter_tree_rows(
    tree: SessionTree, path: Sequence[Entry], leaf: str | None
) -> Iterator[dict[str, Any]]:
    """:func:`tree_rows` one row at a time, of ``tree`` with ``path`` the active one to ``leaf``.

    The server encodes them a few hundred at a time, so that the rows of a 200,000-entry
    session are never all in memory at once (``_rpc/fair.py``).
    """
    active = {e["id"] for e in path}
    edited_by, in_effect = _edit_marks(tree, path)
    labels = tree.labels
    if tree.linear:
        # One chain in file order, every depth 0 (depth grows only where the tree branches):
        # the usual session, walked without building a node per entry (tree.nodes()).
        for entry in tree.entries:
            yield _row(entry, labels.get(entry["id"]), 0, active, leaf, edited_by, in_effect)
        return
    stack = [(0, node) for node in reversed(tree.nodes())]
    while stack:
        depth, node = stack.pop()
        yield _row(node.entry, node.label, depth, active, leaf, edited_by, in_effect)
        child_depth = depth + 1 if len(node.children) > 1 else depth
        stack.extend((child_depth, child) for child in reversed(node.children))


def _row(
    entry: Entry,
    label: str | None,
    depth: int,
    active: set[str],
    leaf: str | None,
    edited_by: dict[str, list[str]],
    in_effect: dict[str, dict[str, str]],
) -> dict[str, Any]:
    entry_id, kind = entry["id"], entry.get("type")
    return {
        "id": entry_id,
        "parentId": entry.get("parentId"),
        "type": kind,
        "role": role_of(entry),
        "label": label,
        "depth": depth,
        "onActivePath": entry_id in active,
        "isLeaf": entry_id == leaf,
        "text": describe_entry(entry),
        "shortSummary": short_summary_of(entry),
        # pi 1.x: what a context edit does, which edits name this entry (the one in effect at
        # the active leaf apart), and a usage entry's numbers.
        "edit": edit_of(entry) if kind == CONTEXT_EDIT else None,
        "editedBy": edited_by.get(entry_id, []),
        "contextEdit": in_effect.get(entry_id),
        "usage": usage_of(entry) if kind == USAGE else None,
    }
