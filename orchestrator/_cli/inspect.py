"""Inspection commands: ``context``, ``plan``, ``tree`` and ``check`` (read-only).

Their ``--json`` output is a stable contract, documented in docs/sessions.md ("Inspection JSON").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator._cli.common import (
    UsageError,
    check_leaf,
    check_reserve,
    keep_until_exit,
    open_existing,
    positive_int,
    print_json,
    require_file,
    warn_of,
)
from orchestrator._cli.database import add_database_option, reading
from orchestrator._cli.pi_settings import (
    Explicit,
    add_pi_settings_argument,
    compaction_enabled,
    given,
    model_key,
    with_pi_settings,
)
from orchestrator._cli.terminal import columns_of, fit
from orchestrator._core.compaction_plan import plan_report
from orchestrator._core.context import SessionContext, build_context
from orchestrator._core.entries import Entry
from orchestrator._core.errors import NotASessionError
from orchestrator._core.load_result import Problem
from orchestrator._core.tokens import CompactionSettings
from orchestrator._core.tree_drawing import tree_prefixes
from orchestrator._store.lean_read import read_lean, worth_reading_lean
from orchestrator._store.reports import (
    branch_report,
    check_file,
    context_report,
    edit_mark,
    preview_message,
    tree_rows,
)

_KEEP_RECENT_TOKENS = CompactionSettings().keep_recent_tokens
_RESERVE_TOKENS = CompactionSettings().reserve_tokens
# The options of a compaction plan, which a branch plan (--from/--to) does not use.
_COMPACTION_OPTIONS = (
    ("leaf", "--leaf"),
    ("keep_recent_tokens", "--keep-recent-tokens"),
    ("reserve_tokens", "--reserve-tokens"),
    ("context_window", "--context-window"),
    ("no_adaptive_keep", "--no-adaptive-keep"),
    ("pi_settings", "--pi-settings"),
)


def register(commands: Any) -> None:
    """Add the inspection commands to the parser."""
    context = commands.add_parser("context", help="show what the model would see")
    context.add_argument("session", help="the session file, or its id with --database")
    context.add_argument(
        "--leaf", metavar="ID", help="entry id to build the context at (default: last entry)"
    )
    context.add_argument("--json", action="store_true", help="print the stable JSON form")
    add_database_option(context)
    context.set_defaults(handler=_context)

    plan = commands.add_parser(
        "plan",
        help="show what a compaction or branch summary would do",
        description="Show what a compaction (default) or, with --from and --to, a branch "
        "summary would cover, without calling any model.",
    )
    plan.add_argument("session", help="the session file")
    plan.add_argument(
        "--leaf", metavar="ID", help="plan the compaction at this entry (default: last entry)"
    )
    # Compaction options default to None so that a branch plan can refuse them when given.
    plan.add_argument(
        "--keep-recent-tokens",
        type=positive_int,
        action=Explicit,
        metavar="N",
        help=f"recent tokens kept verbatim (default: {_KEEP_RECENT_TOKENS})",
    )
    plan.add_argument(
        "--reserve-tokens",
        type=positive_int,
        action=Explicit,
        metavar="N",
        help=f"room kept for the reply; threshold = window - reserve (default: {_RESERVE_TOKENS})",
    )
    plan.add_argument(
        "--context-window",
        type=positive_int,
        metavar="N",
        help="the model's window; adds the threshold and whether to compact",
    )
    plan.add_argument(
        "--no-adaptive-keep",
        action="store_true",
        help="keep --keep-recent-tokens as given, without the measured-ratio adaptation (D7)",
    )
    add_pi_settings_argument(plan)
    plan.add_argument(
        "--from", dest="from_leaf", metavar="OLD_LEAF", help="branch plan: the leaf being left"
    )
    plan.add_argument(
        "--to", dest="to_target", metavar="TARGET", help="branch plan: the entry navigated to"
    )
    plan.add_argument(
        "--budget",
        type=positive_int,
        metavar="N",
        help="branch plan: token budget of the summarized entries (default: no limit)",
    )
    plan.add_argument("--json", action="store_true", help="print the stable JSON form")
    plan.set_defaults(handler=_plan)

    tree = commands.add_parser("tree", help="draw the session tree")
    tree.add_argument("session", help="the session file, or its id with --database")
    tree.add_argument("--json", action="store_true", help="print the stable JSON form")
    add_database_option(tree)
    tree.set_defaults(handler=_tree)

    check = commands.add_parser("check", help="validate a session file (exit 1 on problems)")
    check.add_argument("session", help="the session file, or its id with --database")
    check.add_argument("--json", action="store_true", help="print ok, entries and problems as JSON")
    add_database_option(check)
    check.set_defaults(handler=_check)


# -- context -----------------------------------------------------------------------------------


def _context(args: argparse.Namespace) -> int:
    with reading(args) as session:
        report = context_report(session, check_leaf(session, args.leaf))
        keep_until_exit(session, report)  # freed by the process's exit, not one by one
    if args.json:
        print_json(report)
        return 0
    rows = zip(
        report["messages"], report["messageTokens"], report["messageShortSummaries"], strict=True
    )
    for message, tokens, short in rows:
        print(f"[{message.get('role')}] ~{tokens} tokens: {preview_message(message)}")
        if short:
            print(f"    short summary: {short}")
    count = _tokens_text(report["tokens"]["tokens"], report)
    print(f"-- {len(report['messages'])} messages, {count}", end="")
    print(f" (model {_model_text(report['model'])}, thinking {report['thinkingLevel']})")
    return 0


def _tokens_text(tokens: int, report: dict[str, Any]) -> str:
    # D29: a provider usage measured before the latest compaction or context edit describes a
    # context that is gone; the count is the estimate, and I say why the usage is not believed.
    if report["staleUsage"]:
        return (
            f"~{report['estimatedTokens']} tokens estimated (provider usage "
            f"~{report['staleUsageTokens']} is stale: measured before the latest compaction "
            "or context edit)"
        )
    return f"~{tokens} tokens"


def _model_text(model: dict[str, str] | None) -> str:
    return f"{model['provider']}/{model['modelId']}" if model else "none"


# -- plan --------------------------------------------------------------------------------------


def _plan(args: argparse.Namespace) -> int:
    # An option the chosen plan does not use would be dropped without a word: refuse it.
    if (args.from_leaf is None) != (args.to_target is None):
        raise UsageError("--from and --to go together (branch plan)")
    if args.from_leaf is None and args.budget is not None:
        raise UsageError("--budget needs --from and --to (it limits a branch plan)")
    if args.from_leaf is not None:
        used = [option for name, option in _COMPACTION_OPTIONS if getattr(args, name)]
        if used:
            one = len(used) == 1
            raise UsageError(
                f"{' and '.join(used)} {'is' if one else 'are'} for a compaction plan, "
                f"without --from and --to (a branch plan does not use {'it' if one else 'them'})"
            )
    if args.from_leaf is None and args.leaf is None:
        report = _lean_compaction_plan(args)
        if report is not None:
            return _print_plan(args, report)
    session = open_existing(args.session)
    keep_until_exit(session)  # freed by the process's exit, not one by one
    if args.from_leaf is not None:
        report = branch_report(session, args.from_leaf, args.to_target, args.budget or 0)
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
    return _print_plan(args, _compaction_plan(args, session.path(leaf) if leaf else []))


def _print_plan(args: argparse.Namespace, report: dict[str, Any]) -> int:
    keep_until_exit(report)
    if args.json:
        print_json(report)
        return 0
    _print_compaction_plan(report)
    return 0


def _lean_compaction_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    """The plan of the file's last entry from a lean read (``_store/lean_read.py``), or ``None``.

    A big linear file is read once, holding of each message only what planning reads; any
    other is left to the whole load (``None``). The problems are reported as a whole load reports
    them.
    """
    require_file(args.session)
    if not worth_reading_lean(args.session):
        return None
    read = read_lean(args.session)
    if read is None:
        return None
    problems, context = read
    keep_until_exit(context)
    warn_of(args.session, problems)
    assert context.index is not None  # a builder always indexes its context
    return _compaction_plan(args, context.index.path, context)


def _compaction_plan(
    args: argparse.Namespace, path: Sequence[Entry], context: SessionContext | None = None
) -> dict[str, Any]:
    if args.pi_settings:
        # plan calls no model: the model in use is the one the session's path selects, as pi
        # resolves its overrides for the session's model. The context that says so is the one
        # the plan reads: built once.
        context = context if context is not None else build_context(path)
        args = with_pi_settings(args, model_key(context.model))
    settings = plan_settings(args)
    from_file = args.pi_settings and not given(args, "reserve_tokens")
    name = "compaction.reserveTokens (--pi-settings)" if from_file else "--reserve-tokens"
    check_reserve(args.context_window, settings.reserve_tokens, name)
    return plan_report(path, settings, args.context_window, context=context)


def plan_settings(args: argparse.Namespace) -> CompactionSettings:
    """The compaction settings ``plan``'s options (and ``--pi-settings``) give, else defaults."""
    return CompactionSettings(
        enabled=compaction_enabled(args),
        reserve_tokens=_RESERVE_TOKENS if args.reserve_tokens is None else args.reserve_tokens,
        keep_recent_tokens=(
            _KEEP_RECENT_TOKENS if args.keep_recent_tokens is None else args.keep_recent_tokens
        ),
        adaptive_keep=not args.no_adaptive_keep,
    )


def _print_compaction_plan(report: dict[str, Any]) -> None:
    print(f"context: {_tokens_text(report['contextTokens'], report)}", end="")
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


def _tree(args: argparse.Namespace) -> int:
    with reading(args) as session:
        rows = tree_rows(session)
        keep_until_exit(session, rows)  # freed by the process's exit, not one by one
    if args.json:
        print_json(
            {
                # An empty file has no header yet: its id would be a new random one each read.
                "sessionId": session.session_id if session.persisted else None,
                "name": session.tree.session_name(),
                "leafId": session.leaf_id,
                "nodes": rows,
            }
        )
        return 0
    for line in tree_lines(rows, columns_of(sys.stdout)):
        print(line)
    print(f"-- {len(rows)} entries; * marks the active leaf, │ the active path")
    return 0


def tree_lines(rows: Sequence[dict[str, Any]], columns: int | None = None) -> list[str]:
    """``tree``'s lines: the marker, the branch connectors, then the id, label and text.

    On a terminal (``columns`` given) each line is cut to its width: a wrapped line continued
    without its marker, so the active path looked broken.
    """
    prefixes = tree_prefixes([(row["id"], row["parentId"]) for row in rows])
    lines = []
    for row, prefix in zip(rows, prefixes, strict=True):
        marker = "*" if row["isLeaf"] else ("│" if row["onActivePath"] else " ")
        label = f" [{row['label']}]" if row["label"] else ""
        line = f"{marker} {prefix}{row['id']}{label} {row['text']}{edit_mark(row)}"
        lines.append(line if columns is None else fit(line, columns))
    return lines


# -- check -------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    # The report (ok, or every problem) goes to stdout, so ``check S > report.txt`` keeps it;
    # stderr has only errors. A file that is not a session at all is both: its problems are
    # reported like any other, and the one-line error follows on stderr (exit 1).
    # A file is read in outline (ids, parents, references): the problems need no message.
    try:
        if getattr(args, "database", None) is None:
            require_file(args.session)
            problems, tree = check_file(args.session)
            entries = len(tree) if tree is not None else 0
            keep_until_exit(tree)  # freed by the process's exit, not one by one
        else:
            with reading(args, warn=False) as session:
                problems, entries = session.problems, len(session.tree)
                keep_until_exit(session)
    except NotASessionError as exc:
        _print_check(args, exc.problems, 0)
        raise
    return _print_check(args, problems, entries)


def _print_check(args: argparse.Namespace, problems: Sequence[Problem], entries: int) -> int:
    if args.json:
        print_json(
            {
                "ok": not problems,
                "entries": entries,
                "problems": [
                    {"line": p.line, "code": p.code, "message": p.message} for p in problems
                ],
            }
        )
    else:
        for problem in problems:
            print(f"{args.session}: {problem}")
        if not problems:
            print(f"{args.session}: ok, {entries} entries")
    return 1 if problems else 0
