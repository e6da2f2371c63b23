"""Shared by the pi conformance tests: the recorded cases, and our answers in the same shape.

``tests/data/pi/cases.json`` lists, for each fixture session (written by pi's own
``SessionManager``, see ``make_fixtures.mjs``), the inspection commands to run on it. For each
fixture ``NAME``, ``NAME.expected.json`` holds what pi answered (``pi_reference.mjs record``).
:func:`ours` runs the same command through our code, so both can be compared key by key.

Fixtures marked ``indexIds`` are v1 files: migration gives every entry a fresh random id, in pi
and in our code, so ids are replaced on both sides by ``#<index>`` (0 = the first entry after the
header, in file order), and ``#<index>`` arguments are translated back before running.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator._cli.inspect import plan_settings
from orchestrator._cli.main import _build_parser, main
from orchestrator._core.compaction_plan import plan_report
from orchestrator._core.context import ContextBuilder
from orchestrator._core.serialize import serialize_conversation
from orchestrator._store.reports import branch_report, context_report
from orchestrator._store.session import Session

DATA = Path(__file__).resolve().parent.parent / "data" / "pi"
HERE = Path(__file__).resolve().parent

ID_KEYS = frozenset(
    {"leafId", "oldLeafId", "targetId", "commonAncestorId", "firstKeptEntryId", "turnStartEntryId"}
)
ID_LIST_KEYS = frozenset(
    {"summarizeEntryIds", "turnPrefixEntryIds", "entryIds", "summarizedEntryIds"}
)
SUMMARY_ROLES = frozenset({"compactionSummary", "branchSummary"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One command on one fixture, with pi's recorded answer.

    Attributes:
        fixture: Fixture name (``NAME`` of ``NAME.jsonl``).
        name: Run name inside the fixture (``context``, ``planKeep100``...).
        argv: Our CLI arguments after the session path, without ``--json``.
        index_ids: Ids are compared by file position (v1 fixtures).
        expected: What pi printed.
    """

    fixture: str
    name: str
    argv: tuple[str, ...]
    index_ids: bool
    expected: dict[str, Any]

    @property
    def path(self) -> Path:
        """The fixture's session file."""
        return DATA / f"{self.fixture}.jsonl"

    @property
    def id(self) -> str:
        """A pytest id: ``fixture:run``."""
        return f"{self.fixture}:{self.name}"


def pinned_pi() -> tuple[str, str]:
    """The pi package and version pinned in ``package.json`` (its one ``*/pi-coding-agent``)."""
    manifest = json.loads((HERE / "package.json").read_text(encoding="utf-8"))
    deps: dict[str, str] = manifest["dependencies"]
    (name,) = [n for n in deps if n.endswith("/pi-coding-agent")]
    return name, deps[name]


def cases() -> dict[str, Any]:
    """The manifest, ``tests/data/pi/cases.json``."""
    result: dict[str, Any] = json.loads((DATA / "cases.json").read_text(encoding="utf-8"))
    return result


def expected(fixture: str) -> dict[str, Any]:
    """pi's recorded answers for one fixture (``piVersion``, ``file``, ``runs``)."""
    result: dict[str, Any] = json.loads(
        (DATA / f"{fixture}.expected.json").read_text(encoding="utf-8")
    )
    return result


def runs() -> list[Run]:
    """Every recorded run, in manifest order."""
    out: list[Run] = []
    for fixture, spec in cases()["fixtures"].items():
        recorded = expected(fixture)["runs"]
        for name, argv in spec["runs"].items():
            out.append(
                Run(
                    fixture=fixture,
                    name=name,
                    argv=tuple(argv),
                    index_ids=bool(spec.get("indexIds")),
                    expected=recorded[name],
                )
            )
    return out


def run(fixture: str, name: str) -> Run:
    """One run by fixture and run name."""
    for candidate in runs():
        if candidate.fixture == fixture and candidate.name == name:
            return candidate
    raise KeyError(f"{fixture}:{name}")


def _cli_json(argv: Sequence[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    assert code == 0, f"orchestrator {' '.join(argv)} exited {code}"
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def index_ids(report: Any, order: Sequence[str], key: str | None = None) -> Any:
    """Replace entry ids by ``#<file index>`` wherever the inspection JSON holds an id."""
    index = {entry_id: f"#{i}" for i, entry_id in enumerate(order)}
    if key in ID_KEYS and isinstance(report, str):
        return index.get(report, report)
    if key in ID_LIST_KEYS and isinstance(report, list):
        return [index.get(v, v) for v in report]
    if isinstance(report, list):
        return [index_ids(v, order) for v in report]
    if isinstance(report, Mapping):
        return {k: index_ids(v, order, k) for k, v in report.items()}
    return report


def _with_session(session: Session, argv: Sequence[str]) -> dict[str, Any]:
    # The CLI handlers open the file themselves; a v1 file would get new random ids on every
    # open, so here the same parse runs against one loaded session (mirrors _cli/inspect.py).
    order = [entry["id"] for entry in session.tree.entries]
    resolved = [order[int(a[1:])] if a.startswith("#") else a for a in argv]
    args = _build_parser().parse_args([resolved[0], "unused.jsonl", *resolved[1:], "--json"])
    if args.command == "context":
        report = context_report(session, args.leaf or session.leaf_id)
    elif args.from_leaf is not None:
        report = branch_report(session, args.from_leaf, args.to_target, args.budget or 0)
    else:
        leaf = args.leaf or session.leaf_id
        settings = plan_settings(args)
        report = plan_report(session.path(leaf) if leaf else [], settings, args.context_window)
    result: dict[str, Any] = json.loads(json.dumps(report))
    indexed: dict[str, Any] = index_ids(result, order)
    return indexed


OUR_ADDITIONS = ("staleUsage", "estimatedTokens", "staleUsageTokens", "messageShortSummaries")
"""Fields we add to pi's objects (D29, short summaries); pi has nothing to compare them with."""


def serialize_report(session: Session, leaf: str | None) -> dict[str, Any]:
    """The context at ``leaf`` as the summarizer reads it (``pi_reference.mjs serialize``).

    Summaries are left out on both sides: the text that wraps them is our own (``prompts/``).
    """
    leaf = leaf or session.leaf_id
    context = ContextBuilder(session.path(leaf) if leaf else []).context()
    messages = [m for m in context.messages if m.get("role") not in SUMMARY_ROLES]
    return {"leafId": leaf, "text": serialize_conversation(messages)}


def ours(case: Run, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Our answer to a run (or to other arguments on the same fixture), as JSON data.

    The fields of :data:`OUR_ADDITIONS` are left out: the rest is what pi answers.
    """
    argv = tuple(argv if argv is not None else case.argv)
    if argv[0] == "serialize":
        # There is no serialize command; the summarizer's input is compared directly.
        session = Session.open(case.path)
        try:
            return serialize_report(session, argv[2] if len(argv) > 2 else None)
        finally:
            session.close()
    if case.index_ids:
        session = Session.open(case.path)
        try:
            report = _with_session(session, argv)
        finally:
            session.close()
    else:
        report = _cli_json([argv[0], str(case.path), *argv[1:], "--json"])
    return {k: v for k, v in report.items() if k not in OUR_ADDITIONS}


def _is_d9_cut(
    path: Sequence[Mapping[str, Any]], theirs: Mapping[str, Any], mine: Mapping[str, Any]
) -> bool:
    # pi kept everything from its first kept entry; we cut at an assistant followed only by tool
    # results, and summarize (history + turn prefix) exactly what lies between the two.
    ids = [entry["id"] for entry in path]
    if theirs["firstKeptEntryId"] not in ids or mine["firstKeptEntryId"] not in ids:
        return False
    start, cut = ids.index(theirs["firstKeptEntryId"]), ids.index(mine["firstKeptEntryId"])
    after = [e["message"] for e in path[cut + 1 :] if e.get("type") == "message"]
    producing = [
        e["id"]
        for e in path[start:cut]
        if e.get("type") in ("message", "custom_message", "branch_summary")
    ]
    same = ("tokensBefore", "previousSummary")
    return (
        path[cut].get("message", {}).get("role") == "assistant"
        and bool(after)
        and all(m.get("role") == "toolResult" for m in after)
        and mine["summarizeEntryIds"] + mine["turnPrefixEntryIds"] == producing
        and all(theirs[k] == mine[k] for k in same)
    )


def explain_plan_difference(
    pi: Mapping[str, Any], mine: Mapping[str, Any], path: Sequence[Mapping[str, Any]]
) -> str | None:
    """Name the decision that explains why our compaction plan differs from pi's, if one does.

    Args:
        pi: pi's ``plan --json`` object.
        mine: Ours, for the same arguments with ``--no-adaptive-keep``.
        path: The active path the plan was made on.

    Returns:
        ``"D12"``, ``"D9"`` or ``"D10"``; ``None`` when no decision explains the difference.
    """
    theirs, ours_ = pi["compaction"], mine["compaction"]
    if {k: v for k, v in pi.items() if k not in ("compaction", "reason")} != {
        k: v for k, v in mine.items() if k not in ("compaction", "reason")
    }:
        return None
    if theirs is None or (ours_ is None and mine["reason"] is None):
        return None
    if ours_ is None:
        empty = not theirs["summarizeEntryIds"] and not theirs["turnPrefixEntryIds"]
        return "D12" if empty else None
    if not theirs["summarizeEntryIds"] and not theirs["turnPrefixEntryIds"]:
        # pi kept everything; we cut at the assistant whose results fill the budget.
        return "D9" if _is_d9_cut(path, theirs, ours_) else None
    split = ("isSplitTurn", "turnStartEntryId", "summarizeEntryIds", "turnPrefixEntryIds")
    rest_same = {k: v for k, v in theirs.items() if k not in split} == {
        k: v for k, v in ours_.items() if k not in split
    }
    if not rest_same or not theirs["isSplitTurn"] or ours_["isSplitTurn"]:
        return None
    merged = theirs["summarizeEntryIds"] + theirs["turnPrefixEntryIds"]
    return "D10" if ours_["summarizeEntryIds"] == merged else None


_CUT = re.compile(r"([\ud800-\udbff])\n\n\[\.\.\. (\d+) more characters truncated\]")


def explain_serialize_difference(pi: Mapping[str, Any], mine: Mapping[str, Any]) -> str | None:
    """``"D26"`` when our serialized text is pi's except for cuts that split a surrogate pair.

    pi cuts a long tool result at 2000 UTF-16 units even inside a pair and leaves the high half
    before its marker; we cut one unit earlier and count that unit in the marker.
    """
    if pi.get("leafId") != mine.get("leafId") or not isinstance(pi.get("text"), str):
        return None
    mended = _CUT.sub(
        lambda m: f"\n\n[... {int(m.group(2)) + 1} more characters truncated]", pi["text"]
    )
    return "D26" if mended != pi["text"] and mended == mine.get("text") else None
