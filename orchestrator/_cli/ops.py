"""Commands that change a session: ``compact``, ``navigate`` and ``fork``.

With no ``--model`` they use the built-in offline summarizer, so they work on a fresh machine
with no key. A spinner runs on stderr while a model is called (terminals only).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from opentelemetry.sdk.trace import TracerProvider

from orchestrator._cli.chat import route_settings
from orchestrator._cli.common import (
    UsageError,
    add_model_arguments,
    add_timeout_argument,
    open_existing,
    positive_int,
    print_json,
    require_file,
    warn_problems,
    with_timeout,
)
from orchestrator._cli.pi_settings import (
    Explicit,
    add_pi_settings_argument,
    branch_reserve,
    compaction_enabled,
    model_in_use,
    with_pi_settings,
)
from orchestrator._cli.progress import Progress, spinner
from orchestrator._core.entries import CUSTOM, Entry
from orchestrator._core.errors import SessionError
from orchestrator._core.printable import printable
from orchestrator._core.tokens import CompactionSettings, estimate_tokens
from orchestrator._runtime.navigation.driver import NavigationResult
from orchestrator._runtime.navigation.moves import LEAF_MARKER, position_is_recorded
from orchestrator._runtime.operation.jobs import kept_messages
from orchestrator._runtime.operation.retry import AttemptRecord
from orchestrator._runtime.operation.routes import RouteSettings, build_summarizer, close_routes
from orchestrator._runtime.operation.summarize import SummaryRoutes
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import OperationOutcome, RuntimeSettings
from orchestrator._store.files import refuse_folder_name
from orchestrator._store.session import Session
from orchestrator._telemetry.export import check_otlp_collector, make_tracer_provider
from orchestrator._telemetry.tracing import LifecycleTracer


def _add_route_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--reserve-tokens",
        type=positive_int,
        action=Explicit,
        default=16384,
        metavar="N",
        help="tokens reserved for the reply; sizes the summary request (default: %(default)s)",
    )
    parser.add_argument(
        "--trace",
        type=trace_spec,
        metavar="SPEC",
        help="export OpenTelemetry spans: otlp (OTEL_* variables), console, or jsonl:FOLDER",
    )
    parser.add_argument(
        "--short-summary",
        action="store_true",
        help="also write a one-or-two sentence short summary (shown by tree, context, the TUI)",
    )
    parser.add_argument(
        "--no-offline-fallback",
        action="store_true",
        help="when the summary gate refuses every model's summary, fail instead of committing the "
        "offline extractive summary (D32)",
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    add_timeout_argument(parser)


def register(commands: Any) -> None:
    """Add the commands that change sessions."""
    compact = commands.add_parser("compact", help="summarize old history into a compaction entry")
    compact.add_argument("session", help="the session file")
    compact.add_argument("--focus", help="what the summary should preserve above all")
    compact.add_argument(
        "--keep-recent-tokens",
        type=positive_int,
        action=Explicit,
        default=20000,
        metavar="N",
        help="recent tokens kept verbatim (default: %(default)s)",
    )
    compact.add_argument(
        "--no-adaptive-keep",
        action="store_true",
        help="keep --keep-recent-tokens as given, without the measured-ratio adaptation (D7)",
    )
    compact.add_argument("--dry-run", action="store_true", help="show the summary, write nothing")
    add_pi_settings_argument(compact)
    _add_route_arguments(compact)
    compact.set_defaults(handler=_compact)

    navigate = commands.add_parser("navigate", help="move the active leaf, optionally summarizing")
    navigate.add_argument("session", help="the session file")
    navigate.add_argument("--to", required=True, metavar="ID", help="entry to navigate to")
    navigate.add_argument(
        "--summarize",
        action="store_true",
        help="summarize the abandoned branch at the new position",
    )
    navigate.add_argument("--focus", help="instructions for the branch summary")
    navigate.add_argument(
        "--replace-instructions",
        action="store_true",
        help="--focus replaces the default branch-summary prompt",
    )
    add_pi_settings_argument(navigate)
    _add_route_arguments(navigate)
    navigate.set_defaults(handler=_navigate)

    fork = commands.add_parser("fork", help="copy the path before a user message into a new file")
    fork.add_argument("session", help="the session file to copy from")
    fork.add_argument(
        "--from",
        dest="entry",
        required=True,
        metavar="ID",
        help="a user message: the new session holds the path before it",
    )
    fork.add_argument("--out", help="new session file (default: beside the source)")
    fork.add_argument("--json", action="store_true", help="print the outcome as JSON")
    fork.set_defaults(handler=_fork)


def _attempt_text(progress: Progress) -> Any:
    def on_attempt(record: AttemptRecord, purpose: str) -> None:
        if record.outcome == "retry":
            progress.text = (
                f"{record.candidate}: {record.error}; retrying in {record.delay_ms / 1000:.1f}s"
            )
        elif record.outcome == "next_candidate":
            progress.text = f"{record.candidate} failed ({record.error}); trying the next model"

    return on_attempt


def _route_names(routes: RouteSettings) -> str:
    # A --remote endpoint was shown as "the offline summarizer" while it was being called.
    names = [*routes.models, *([routes.remote_url] if routes.remote_url else [])]
    return ", ".join(names) or "the offline summarizer"


# -- compact -----------------------------------------------------------------------------------


def _compact(args: argparse.Namespace) -> int:
    # The model in use is the first --model, which summarizes; without one, the session's own
    # (pi compacts with the session's model, so pi's override for it is the one that applies).
    args = with_pi_settings(args, model_in_use(args, args.session))
    routes = route_settings(args)
    progress = Progress(f"Summarizing with {_route_names(routes)}")
    summarizer = build_summarizer(routes, on_attempt=_attempt_text(progress))
    settings = CompactionSettings(
        enabled=compaction_enabled(args),
        reserve_tokens=args.reserve_tokens,
        keep_recent_tokens=args.keep_recent_tokens,
        adaptive_keep=not args.no_adaptive_keep,
    )
    outcome = _run_runtime(args, summarizer, settings, progress, _compact_through)
    done = outcome["entryId"] and f"the compaction was appended (entry {outcome['entryId']})"
    with reporting(done):
        if args.json:
            print_json({k: v for k, v in outcome.items() if k not in ("splitTurn", "summarized")})
        else:
            _print_compaction(args, outcome)
    return 0


@contextmanager
def reporting(done: str | None) -> Iterator[None]:
    """Print the report of a change already made, flushed; a failed write says it stands.

    ``compact S > /dev/full`` appended the compaction and then said only "No space left on
    device", which reads as if the compaction had failed. ``done`` says what was written
    (``None``: nothing was, and the error is reported as it is).

    Raises:
        SessionError: stdout could not be written after the change; one line naming both.
    """
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:  # a reader that stopped early (| head): not a failure
        raise
    except OSError as exc:
        if not done:
            raise
        raise SessionError(
            f"{done}, but writing the report to standard output failed: {exc.strerror or exc}"
        ) from None


async def _compact_through(runtime: AgentSession, args: argparse.Namespace) -> dict[str, Any]:
    # Every compaction, a dry run included, is the operation machine with its hooks; a real one
    # is journaled beside the file and settled on the next open if this process dies (D24). A
    # dry run has no journal and its commit only reports the entry it would append.
    tokens = runtime.session.context().tokens().tokens
    done = await runtime.compact(args.focus, dry_run=args.dry_run)
    return compaction_report(runtime.session, done, tokens)


def compaction_report(session: Session, done: OperationOutcome, tokens: int) -> dict[str, Any]:
    """The JSON form of a compaction's outcome, for the command line."""
    result, plan = done.result, done.plan
    after = None
    if result is not None and plan is not None:
        after = estimate_tokens({"role": "compactionSummary", "summary": result.summary})
        after += sum(estimate_tokens(m) for m in kept_messages(session, plan))
    appended = done.entry if done.entry is not None and not done.dry_run else None
    return {
        "compacted": appended is not None,
        "reason": done.reason if result is None else None,
        "entryId": appended["id"] if appended else None,
        "summary": result.summary if result else None,
        "firstKeptEntryId": result.first_kept_entry_id if result else None,
        "tokensBefore": plan.tokens_before if plan is not None else tokens,
        "tokensAfter": after,
        "model": result.model if result else None,
        "shortSummary": result.short_summary if result else None,
        "splitTurn": plan.is_split_turn if plan is not None else False,
        "summarized": len(plan.summarize_entry_ids) if plan is not None else 0,
    }


def _print_compaction(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if report["summary"] is None:
        print(report["reason"])
        return
    print(report["summary"])
    print()
    if report["shortSummary"]:
        print(f"-- short summary: {report['shortSummary']}")
    verb = "would compact" if args.dry_run else "compacted"
    print(
        f"-- {verb}: {report['summarized']} messages summarized"
        f"{' (split turn)' if report['splitTurn'] else ''}, kept from "
        f"{report['firstKeptEntryId']}; tokens before {report['tokensBefore']}, "
        f"after ~{report['tokensAfter']}; summarizer {report['model'] or 'none'}"
    )
    if report["entryId"] is not None:
        print(f"-- appended compaction entry {report['entryId']} to {args.session}")


T = TypeVar("T")


def _run_runtime(
    args: argparse.Namespace,
    summarizer: SummaryRoutes,
    settings: CompactionSettings,
    progress: Progress,
    work: Callable[[AgentSession, argparse.Namespace], Awaitable[T]],
) -> T:
    require_file(args.session)  # opening a missing path would start a new session there
    provider = make_trace_provider(args.trace)
    options: dict[str, Any] = {
        "summarizer": summarizer,
        "settings": with_timeout(
            RuntimeSettings(
                compaction=settings,
                branch_reserve_tokens=args.reserve_tokens,
                short_summary=args.short_summary,
            ),
            args,
        ),
        "tracer": LifecycleTracer(provider),
    }
    if getattr(args, "dry_run", False):
        # A dry run writes nothing, not even the journal.
        runtime = AgentSession(open_existing(args.session), **options)
    else:
        # The command owns the session from before it reads it to after its commit (D27): a
        # second process is refused here, before any model is called.
        runtime = AgentSession.open(args.session, owner=f"orchestrator {args.command}", **options)
        warn_problems(args.session, runtime.session)
    for settled in runtime.settlements:
        # The id, kind and note come from the journal, which anyone could have written.
        why = f" ({printable(settled.note)})" if settled.note else ""
        print(
            f"note: operation {printable(settled.operation_id)} ({printable(str(settled.kind))}) "
            f"left half-done by an earlier process was settled as {settled.dest}{why}",
            file=sys.stderr,
        )

    async def run() -> T:
        try:
            async with spinner(progress):
                return await work(runtime, args)
        finally:
            await close_routes(summarizer)

    try:
        return anyio.run(run)
    finally:
        runtime.close()
        if provider is not None:
            provider.shutdown()


def trace_spec(text: str) -> str:
    """An ``argparse`` type for ``--trace``: ``otlp``, ``console`` or ``jsonl:FOLDER``.

    A value that is none of them is a usage error (exit 2, with the usage), found before any
    work; so is a ``jsonl`` folder that cannot hold the spans (a file, or under one), which
    dropped every span without a word. Whether an OTLP collector listens is checked when the
    provider is made.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not one of the three forms, or names a folder
            that cannot be used.
    """
    kind, colon, folder = text.partition(":")
    if kind == "jsonl" and folder:
        problem = _trace_folder_problem(Path(folder))
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text!r}: {problem}; the spans need a folder")
        return text
    if kind in ("otlp", "console") and not colon:
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: use otlp, console or jsonl:FOLDER")


def _trace_folder_problem(folder: Path) -> str | None:
    """Why the spans cannot be written in ``folder`` (created when missing), or ``None``."""
    if folder.exists() and not folder.is_dir():
        return f"{folder} is not a folder"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder is created with its parents: where it starts
    if existing.exists() and not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot create files in {existing} (permission denied)"
    return None


def make_trace_provider(spec: str | None) -> TracerProvider | None:
    """A tracer provider for ``--trace``: ``otlp``, ``console`` or ``jsonl:FOLDER``.

    Raises:
        UsageError: an unknown specification (:func:`trace_spec` refuses it when parsing).
    """
    if not spec:
        return None
    kind, _, folder = spec.partition(":")
    if kind == "jsonl" and folder:
        return make_tracer_provider("jsonl", folder, shutdown_on_exit=False)
    if kind == "otlp" and not folder:
        check_otlp_collector()  # fail before any work, in one line, when nobody listens
        return make_tracer_provider("otlp", shutdown_on_exit=False)
    if kind == "console" and not folder:
        return make_tracer_provider("console", shutdown_on_exit=False)
    raise UsageError(f"--trace {spec}: use otlp, console or jsonl:FOLDER")


# -- navigate ----------------------------------------------------------------------------------


def _navigate(args: argparse.Namespace) -> int:
    # Instructions without a summary would be dropped without a word: refuse them instead.
    # Options that do not go together are a usage error (exit 2, with the usage), as argparse's.
    if (args.focus or args.replace_instructions) and not args.summarize:
        raise UsageError("--focus and --replace-instructions shape the summary: add --summarize")
    if args.replace_instructions and not args.focus:
        raise UsageError("--replace-instructions needs --focus (the prompt to use instead)")
    if args.short_summary and not args.summarize:
        raise UsageError("--short-summary needs --summarize (it shortens the branch summary)")
    # navigate's --reserve-tokens is the branch summary's: pi's branchSummary.reserveTokens.
    args = argparse.Namespace(**{**vars(args), "reserve_tokens": branch_reserve(args)})
    routes = route_settings(args)
    progress = Progress(f"Summarizing the branch with {_route_names(routes)}")
    summarizer = build_summarizer(routes, on_attempt=_attempt_text(progress))
    result = _run_runtime(args, summarizer, CompactionSettings(), progress, _navigate_through)
    report = {
        **result.as_json(),
        "targetId": args.to,
        "summary": result.summary_entry["summary"] if result.summary_entry else None,
        "shortSummary": result.summary_entry.get("shortSummary") if result.summary_entry else None,
    }
    with reporting(_navigation_done(result)):
        if args.json:
            print_json(report)
        else:
            _print_navigation(result)
    return 0


def _navigation_done(result: NavigationResult) -> str | None:
    if result.summary_entry is not None:
        return f"the branch summary was attached (entry {result.summary_entry['id']})"
    if result.cancelled or result.new_leaf_id == result.old_leaf_id:
        return None
    return f"the leaf was moved to {result.new_leaf_id or '(root)'}"


async def _navigate_through(runtime: AgentSession, args: argparse.Namespace) -> NavigationResult:
    before = runtime.session.leaf_id
    result = await runtime.navigate(
        args.to,
        summarize=args.summarize,
        instructions=args.focus,
        replace_instructions=args.replace_instructions,
    )
    if result.summary_entry is None and not result.cancelled and runtime.session.leaf_id != before:
        record_leaf(runtime.session, before, args.to)
    runtime.session.flush()
    return result


def record_leaf(session: Session, old_leaf: str | None, target: str) -> Entry | None:
    """Record a navigation without a summary so that the file reopens at the new leaf.

    pi keeps the leaf in memory and reopens a file at its last entry. A command is a separate
    process, so I record the move as a ``custom`` entry (never part of the context; pi ignores
    it) under the new leaf: reopening lands exactly there. Nothing is written when reopening
    already lands there (see :func:`position_is_recorded`).

    Returns:
        The marker entry, or ``None`` when none was needed.
    """
    if position_is_recorded(session):
        return None
    return session.append_entry(
        CUSTOM,
        {"customType": LEAF_MARKER, "data": {"from": old_leaf, "to": target}},
        parent_id=session.leaf_id,
    )


def _print_navigation(result: NavigationResult) -> None:
    if result.cancelled:
        print("navigation cancelled; nothing changed")
        return
    if result.new_leaf_id == result.old_leaf_id and result.summary_entry is None:
        print("already at that entry; nothing changed")
        return
    print(f"leaf: {result.old_leaf_id} -> {result.new_leaf_id or '(root)'}")
    if result.summary_entry is not None:
        print(f"branch summary {result.summary_entry['id']} attached:")
        print(result.summary_entry["summary"])
        if result.summary_entry.get("shortSummary"):
            print(f"-- short summary: {result.summary_entry['shortSummary']}")
    if result.editor_text is not None:
        print("-- editor text (edit and resend it):")
        print(result.editor_text)


# -- fork --------------------------------------------------------------------------------------


def _fork(args: argparse.Namespace) -> int:
    from orchestrator._store.fork import branched_session, fork_path, fork_target
    from orchestrator._store.jsonl import JsonlStore

    if args.out == "":  # not "no --out": the default name beside the source was written
        raise UsageError("--out: an empty path names no file; leave it out for a default name")
    source = open_existing(args.session)
    leaf, editor_text = fork_target(source, args.entry)
    if args.out is not None:
        refuse_folder_name(args.out)  # Path() would drop the slash and write the file
    out = Path(args.out) if args.out is not None else fork_path(args.session)
    if not out.parent.is_dir():
        raise SessionError(f"{out}: the folder {out.parent} does not exist; create it first")
    if os.path.lexists(out):  # a symbolic link too, even one that points nowhere
        raise SessionError(f"{out}: already exists; choose another --out")
    store = JsonlStore(out)
    try:
        # The new file is owned from before it exists (D27): a second fork to the same --out
        # is refused, never interleaved.
        store.own("orchestrator fork")
        if os.path.lexists(out):
            raise SessionError(f"{out}: already exists; choose another --out")
        forked = branched_session(source, leaf, store)
        forked.flush()
    finally:
        store.close()
    report = {
        "sessionFile": str(out),
        "sessionId": forked.session_id,
        "entries": len(forked.tree),
        "editorText": editor_text,
    }
    with reporting(f"the fork was written to {out}"):
        if args.json:
            print_json(report)
        else:
            print(f"forked into {out} ({len(forked.tree)} entries)")
            print("-- editor text:")
            print(editor_text)
    return 0
