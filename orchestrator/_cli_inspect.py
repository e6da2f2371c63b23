"""Inspection commands: ``context``, ``plan``, ``tree`` and ``check`` (read-only).

Their ``--json`` output is the stable contract of ``spec/inspection-json.md``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._branch_plan import collect_branch_entries, prepare_branch_entries
from ._cli_common import check_leaf, open_existing, print_json
from ._compaction_plan import plan_report
from ._context import ContextBuilder
from ._entries import Entry, role_of, text_of
from ._errors import SessionError
from ._session import Session
from ._tokens import CompactionSettings


def register(commands: Any) -> None:
    """Add the inspection commands to the parser."""
    context = commands.add_parser("context", help="show what the model would see")
    context.add_argument("session")
    context.add_argument("--leaf", help="entry id to build the context at (default: last entry)")
    context.add_argument("--json", action="store_true", help="print the stable JSON form")
    context.set_defaults(handler=_context)

    plan = commands.add_parser("plan", help="show what a compaction or branch summary would do")
    plan.add_argument("session")
    plan.add_argument("--leaf")
    plan.add_argument("--keep-recent-tokens", type=int, default=20000)
    plan.add_argument("--reserve-tokens", type=int, default=16384)
    plan.add_argument("--context-window", type=int)
    plan.add_argument("--no-adaptive-keep", action="store_true")
    plan.add_argument("--from", dest="from_leaf", metavar="OLD_LEAF")
    plan.add_argument("--to", dest="to_target", metavar="TARGET")
    plan.add_argument("--budget", type=int, default=0, help="branch-summary token budget (0: none)")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(handler=_plan)

    tree = commands.add_parser("tree", help="draw the session tree")
    tree.add_argument("session")
    tree.add_argument("--json", action="store_true")
    tree.set_defaults(handler=_tree)

    check = commands.add_parser("check", help="validate a session file (exit 1 on problems)")
    check.add_argument("session")
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=_check)


# -- context -----------------------------------------------------------------------------------


def context_report(session: Session, leaf: str | None) -> dict[str, Any]:
    """The ``orchestrator context --json`` object."""
    context = ContextBuilder(session.path(leaf) if leaf else []).context()
    return {
        "leafId": leaf,
        "messages": list(context.messages),
        "thinkingLevel": context.thinking_level,
        "model": context.model.as_json() if context.model else None,
        "tokens": context.tokens().as_json(),
        "messageTokens": list(context.estimates),
    }


def _context(args: argparse.Namespace) -> int:
    session = open_existing(args.session)
    report = context_report(session, check_leaf(session, args.leaf))
    if args.json:
        print_json(report)
        return 0
    for message, tokens in zip(report["messages"], report["messageTokens"], strict=True):
        print(f"[{message.get('role')}] ~{tokens} tokens: {_preview_message(message)}")
    tokens = report["tokens"]
    print(f"-- {len(report['messages'])} messages, ~{tokens['tokens']} tokens", end="")
    print(f" (model {_model_text(report['model'])}, thinking {report['thinkingLevel']})")
    return 0


def _model_text(model: dict[str, str] | None) -> str:
    return f"{model['provider']}/{model['modelId']}" if model else "none"


# -- plan --------------------------------------------------------------------------------------


def _plan(args: argparse.Namespace) -> int:
    session = open_existing(args.session)
    if (args.from_leaf is None) != (args.to_target is None):
        raise SessionError("--from and --to go together (branch plan)")
    if args.from_leaf is not None:
        report = branch_report(session, args.from_leaf, args.to_target, args.budget)
        if args.json:
            print_json(report)
        else:
            print(
                f"abandoned entries: {len(report['entryIds'])}, summarized: "
                f"{len(report['summarizedEntryIds'])}, ~{report['totalTokens']} tokens"
            )
            print(f"common ancestor: {report['commonAncestorId']}")
        return 0
    leaf = check_leaf(session, args.leaf)
    settings = CompactionSettings(
        reserve_tokens=args.reserve_tokens,
        keep_recent_tokens=args.keep_recent_tokens,
        adaptive_keep=not args.no_adaptive_keep,
    )
    report = plan_report(session.path(leaf) if leaf else [], settings, args.context_window)
    if args.json:
        print_json(report)
        return 0
    _print_compaction_plan(report)
    return 0


def branch_report(session: Session, old_leaf: str, target: str, budget: int) -> dict[str, Any]:
    """The branch form of ``orchestrator plan --json``."""
    session.tree.get(old_leaf)
    session.tree.get(target)
    entries, ancestor = collect_branch_entries(session.tree, old_leaf, target)
    plan = prepare_branch_entries(
        entries, budget, old_leaf_id=old_leaf, target_id=target, common_ancestor_id=ancestor
    )
    return plan.as_json()


def _print_compaction_plan(report: dict[str, Any]) -> None:
    print(f"context: ~{report['contextTokens']} tokens", end="")
    if report["threshold"] is not None:
        print(
            f", threshold {report['threshold']}, should compact: {report['shouldCompact']}", end=""
        )
    print()
    print(
        f"keep recent: {report['effectiveKeepRecentTokens']} tokens "
        f"(configured {report['keepRecentTokens']})"
    )
    plan = report["compaction"]
    if plan is None:
        print(f"no compaction: {report['reason']}")
        return
    split = f" (split turn, prefix of {len(plan['turnPrefixEntryIds'])})"
    print(
        f"summarize {len(plan['summarizeEntryIds'])} entries, keep from {plan['firstKeptEntryId']}"
        + (split if plan["isSplitTurn"] else "")
    )
    print(
        f"tokens before: {plan['tokensBefore']}; previous summary: "
        f"{'yes' if plan['previousSummary'] else 'no'}"
    )
    print(f"files read: {len(plan['readFiles'])}, modified: {len(plan['modifiedFiles'])}")


# -- tree --------------------------------------------------------------------------------------


def _preview_message(message: dict[str, Any], width: int = 70) -> str:
    role = message.get("role")
    if role in ("compactionSummary", "branchSummary"):
        text = str(message.get("summary", ""))
    elif role == "bashExecution":
        text = f"$ {message.get('command', '')}"
    elif role == "assistant":
        parts = []
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(block.get("text", ""))
            elif isinstance(block, dict) and block.get("type") == "toolCall":
                parts.append(f"{block.get('name')}(…)")
        text = " ".join(parts)
    else:
        text = text_of(message.get("content"))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_entry(entry: Entry) -> str:
    """A one-line description of an entry for trees and pickers."""
    kind = entry.get("type")
    role = role_of(entry)
    if role is not None:
        return f"{role}: {_preview_message(entry['message'])}"
    if kind == "compaction":
        summary = {"role": "compactionSummary", "summary": entry.get("summary", "")}
        return f"compaction: {_preview_message(summary)}"
    if kind == "branch_summary":
        summary = {"role": "branchSummary", "summary": entry.get("summary", "")}
        return f"branch summary: {_preview_message(summary)}"
    if kind == "model_change":
        return f"model → {entry.get('provider', '')}/{entry.get('modelId', entry.get('model', ''))}"
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
            }
        )
        child_depth = depth + 1 if len(node.children) > 1 else depth
        stack.extend((child_depth, child, False) for child in reversed(node.children))
    return rows


def _tree(args: argparse.Namespace) -> int:
    session = open_existing(args.session)
    rows = tree_rows(session)
    if args.json:
        print_json(
            {
                "sessionId": session.session_id,
                "name": session.tree.session_name(),
                "leafId": session.leaf_id,
                "nodes": rows,
            }
        )
        return 0
    for row in rows:
        marker = "*" if row["isLeaf"] else ("│" if row["onActivePath"] else " ")
        label = f" [{row['label']}]" if row["label"] else ""
        print(f"{marker} {'  ' * row['depth']}{row['id']}{label} {row['text']}")
    print(f"-- {len(rows)} entries; * marks the active leaf, │ the active path")
    return 0


# -- check -------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    session = open_existing(args.session, warn=False)
    problems = session.problems
    if args.json:
        print_json(
            {
                "ok": not problems,
                "entries": len(session.tree),
                "problems": [
                    {"line": p.line, "code": p.code, "message": p.message} for p in problems
                ],
            }
        )
    else:
        for problem in problems:
            print(f"{args.session}: {problem}", file=sys.stderr)
        if not problems:
            print(f"{args.session}: ok, {len(session.tree)} entries")
    return 1 if problems else 0
