"""Simulation scenarios: scripted agent and summarizer behaviour, as plain TOML files.

A scenario file reads like a test story and is inert data::

    [scenario]
    name = "threshold"
    doc = "A reply over the threshold: prune, compact, continue."

    [settings]                      # all optional
    context_window = 10000
    reserve_tokens = 1000
    keep_recent_tokens = 300
    adaptive_keep = false
    auto_continue = true
    candidates = ["primary"]        # summarizer routes, in order

    [[turns]]                       # what the agent answers, one table per agent run
    steps = [
      { reply = "Reading it.", tokens = 1200, calls = [["c1", "read", { path = "a.py" }]] },
      { tool_result = "c1", size = 4000 },
      { reply = "Done.", tokens = 9500 },
    ]                               # also: { error = "429 rate limit" }, { hang = true },
                                    #       { reply = "...", stop = "length" }

    [summarizer]                    # what each route answers, call by call
    primary = [ { text = "## Goal ..." }, { error = "503", kind = "transient", retry_after = 40 },
                { hang = true }, { stop = "length" }, { text = "" } ]

    [[actions]]                     # what the user does, in order
    do = "prompt"                   # prompt | compact | navigate | reopen
    text = "Fix the bug"            # or size = 2000 for filler text
    abort = "retry_wait"            # optional: while this action runs, abort once the runtime is
                                    # in that phase: agent | retry_wait | compaction |
                                    # branch_summary

    [hooks]                         # optional, e.g. session_before_compact = "cancel"
                                    # (or "throw", or "replace")

    [crash]                         # optional: SIGKILL the process at this transition, then reopen
    machine = "operation"
    to = "committing"
    kind = "compaction"             # optional: only in this kind of operation
                                    # or: after = "commit" (die right after the commit is written)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator._core.errors import DefinitionError, error_class

_TOP = frozenset({"scenario", "settings", "turns", "summarizer", "actions", "hooks", "crash"})
_SETTINGS = frozenset(
    {
        "context_window",
        "reserve_tokens",
        "keep_recent_tokens",
        "adaptive_keep",
        "auto_continue",
        "candidates",
        "max_retries",
        "base_delay_ms",
        "prune",
    }
)
_ACTIONS = frozenset({"prompt", "compact", "navigate", "reopen"})
_ABORTS = frozenset({"agent", "retry_wait", "compaction", "branch_summary"})
_HOOK_BEHAVIOURS = frozenset({"cancel", "throw", "replace"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A parsed scenario (see the module docstring for the file format).

    Attributes:
        name: The scenario's name (its recorded trace is ``traces/<name>.jsonl``).
        doc: What it shows.
        settings: Runtime settings overrides.
        turns: Agent turns: lists of step tables.
        summarizer: Route name to its scripted answers.
        actions: User actions in order.
        hooks: Hook name to behaviour.
        crash: Where to kill the process (``machine``, ``to``, optional ``event``), if anywhere.
        source: The file it came from.
    """

    name: str
    doc: str
    settings: dict[str, Any] = field(default_factory=dict)
    turns: tuple[tuple[dict[str, Any], ...], ...] = ()
    summarizer: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    actions: tuple[dict[str, Any], ...] = ()
    hooks: dict[str, str] = field(default_factory=dict)
    crash: dict[str, str] | None = None
    source: str = ""


def _fail(source: str, reason: str) -> DefinitionError:
    return DefinitionError(f"{source}: {reason}")


def _actions(raw: Any, source: str) -> tuple[dict[str, Any], ...]:
    actions = tuple(dict(a) for a in raw)
    for number, action in enumerate(actions, 1):
        if action.get("do") not in _ACTIONS:
            raise _fail(source, f"action {number}: 'do' must be one of {sorted(_ACTIONS)}")
        if "abort" in action and action["abort"] not in _ABORTS:
            raise _fail(source, f"action {number}: 'abort' must be one of {sorted(_ABORTS)}")
    return actions


def _check_kinds(summarizer: dict[str, tuple[dict[str, Any], ...]], source: str) -> None:
    # A scripted failure's kind becomes its ModelError class when the simulation runs: an unknown
    # one is refused here, naming the route and the answer, before anything runs.
    for route, answers in summarizer.items():
        for number, answer in enumerate(answers, 1):
            if "error" in answer:
                try:
                    error_class(str(answer.get("kind", "fatal")))
                except ValueError as exc:
                    raise _fail(source, f"summarizer {route} answer {number}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file.

    Raises:
        DefinitionError: the file is not valid TOML or breaks the format.
    """
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise _fail(source, f"cannot read scenario: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise _fail(
            source, f"cannot read scenario: not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from exc
    unknown = set(raw) - _TOP
    if unknown:
        raise _fail(source, f"unknown top-level keys {sorted(unknown)}; known: {sorted(_TOP)}")
    head = raw.get("scenario") or {}
    if not isinstance(head.get("name"), str):
        raise _fail(source, "[scenario] needs a name")
    settings = dict(raw.get("settings") or {})
    if set(settings) - _SETTINGS:
        raise _fail(source, f"unknown settings {sorted(set(settings) - _SETTINGS)}")
    actions = _actions(raw.get("actions") or (), source)
    hooks = {str(k): str(v) for k, v in (raw.get("hooks") or {}).items()}
    for name, behaviour in hooks.items():
        if behaviour not in _HOOK_BEHAVIOURS:
            raise _fail(source, f"hook {name}: behaviour must be one of {sorted(_HOOK_BEHAVIOURS)}")
    summarizer = {k: tuple(dict(i) for i in v) for k, v in (raw.get("summarizer") or {}).items()}
    _check_kinds(summarizer, source)
    crash = raw.get("crash")
    if crash is not None and not (
        {"machine", "to"} <= set(crash) or crash.get("after") == "commit"
    ):
        raise _fail(source, '[crash] needs machine and to, or after = "commit"')
    return Scenario(
        name=head["name"],
        doc=str(head.get("doc", "")),
        settings=settings,
        turns=tuple(tuple(dict(s) for s in t.get("steps", ())) for t in raw.get("turns") or ()),
        summarizer=summarizer,
        actions=actions,
        hooks=hooks,
        crash={str(k): str(v) for k, v in crash.items()} if crash else None,
        source=source,
    )
