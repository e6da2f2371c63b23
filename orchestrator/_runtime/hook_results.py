"""What a hook handler returned, checked before it shapes anything (D25).

A handler's result is input like a line of a session file: a field of the wrong type, an empty
summary or an id the branch does not have would otherwise fail deep inside the summary request
(``{"context": 5}`` was a ``TypeError`` out of ``compact()``) or be written into the session for
good (a compaction whose kept region starts at an entry that does not exist). Each malformed
field is reported, as a handler's exception is, and the default applies in its place: a
supplied compaction or summary with any bad field is left out whole (the model summarizes, as
with no hook), a bad shaping field is ignored and the others are used. Pure: the caller emits
the ``hook_error`` events.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator._core.compaction_plan import CompactionPlan
from orchestrator._runtime.operation.summarize import CompactionResult


@dataclass(slots=True)
class Checked:
    """A hook result's usable part and what was wrong with the rest.

    Attributes:
        value: What the caller uses (its shape depends on the hook).
        problems: One sentence per malformed field, for ``hook_error`` events.
    """

    value: Any = None
    problems: list[str] = field(default_factory=list)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compaction_problems(
    value: Mapping[str, Any], branch_ids: Collection[str] | None, where: str
) -> list[str]:
    problems: list[str] = []
    summary = value.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        problems.append(f"{where}.summary must be a non-empty string, got {_shown(summary)}")
    first_kept = value.get("firstKeptEntryId")
    if first_kept is not None:
        if not isinstance(first_kept, str) or not first_kept:
            problems.append(
                f"{where}.firstKeptEntryId must be an entry id, got {_shown(first_kept)}"
            )
        elif branch_ids is not None and first_kept not in branch_ids:
            problems.append(
                f"{where}.firstKeptEntryId {first_kept!r} is not an entry of the active branch"
            )
    tokens = value.get("tokensBefore")
    if tokens is not None and not (_is_int(tokens) and tokens >= 0):
        problems.append(f"{where}.tokensBefore must be a whole number >= 0, got {_shown(tokens)}")
    for name in ("details", "preserveData"):
        item = value.get(name)
        if item is not None and not isinstance(item, Mapping):
            problems.append(f"{where}.{name} must be an object, got {_shown(item)}")
    short = value.get("shortSummary")
    if short is not None and not isinstance(short, str):
        problems.append(f"{where}.shortSummary must be a string, got {_shown(short)}")
    return problems


def supplied_compaction(
    value: Any, plan: CompactionPlan, branch_ids: Collection[str] | None
) -> Checked:
    """The compaction a ``session_before_compact`` handler supplied, if it is whole and sound.

    Args:
        value: The result's ``compaction`` field (``None``: nothing supplied).
        plan: The plan the defaults come from.
        branch_ids: The ids of the active branch, which ``firstKeptEntryId`` must name one of
            (``None``: no branch to check against, a plan given without a session).
    """
    if value is None:
        return Checked()
    where = "session_before_compact result's compaction"
    if not isinstance(value, Mapping):
        return Checked(
            problems=[
                f"{where} must be an object, got {_shown(value)}; the compaction is "
                "summarized as without a hook"
            ]
        )
    problems = _compaction_problems(value, branch_ids, where)
    if problems:
        problems[-1] += "; the compaction is summarized as without a hook"
        return Checked(problems=problems)
    first_kept = value.get("firstKeptEntryId")
    tokens = value.get("tokensBefore")
    preserve = value.get("preserveData")
    return Checked(
        CompactionResult(
            summary=value["summary"],
            first_kept_entry_id=first_kept or plan.first_kept_entry_id,
            tokens_before=plan.tokens_before if tokens is None else tokens,
            details=dict(value.get("details") or {}),
            short_summary=value.get("shortSummary"),
            preserve_data=dict(preserve) if preserve is not None else None,
            from_extension=True,
            model="hook",
        )
    )


def compacting_shape(value: Mapping[str, Any] | None) -> Checked:
    """What a ``session.compacting`` result changes: ``context``, ``prompt``, ``preserveData``.

    Returns:
        ``value``: a dict with ``context`` (a tuple of lines), ``prompt`` and ``preserveData``
        (``None`` where not given or malformed).
    """
    shape: dict[str, Any] = {"context": (), "prompt": None, "preserveData": None}
    checked = Checked(shape)
    if not value:
        return checked
    where = "session.compacting result's"
    context = value.get("context")
    if context is not None:
        if isinstance(context, list | tuple) and all(isinstance(line, str) for line in context):
            shape["context"] = tuple(context)
        else:
            checked.problems.append(
                f"{where} context must be a list of strings, got {_shown(context)}; ignored"
            )
    prompt = value.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str) and prompt.strip():
            shape["prompt"] = prompt
        else:
            checked.problems.append(
                f"{where} prompt must be a non-empty string, got {_shown(prompt)}; ignored"
            )
    preserve = value.get("preserveData")
    if preserve is not None:
        if isinstance(preserve, Mapping):
            shape["preserveData"] = dict(preserve)
        else:
            checked.problems.append(
                f"{where} preserveData must be an object, got {_shown(preserve)}; ignored"
            )
    return checked


@dataclass(frozen=True, slots=True)
class TreeChanges:
    """What a ``session_before_tree`` result changes (``None``: keep the request's own)."""

    instructions: str | None = None
    replace_instructions: bool | None = None
    label: str | None = None
    clear_instructions: bool = False
    clear_label: bool = False
    supplied: Mapping[str, Any] | None = None

    def applied(
        self, instructions: str | None, replace_instructions: bool, label: str | None
    ) -> tuple[str | None, bool, str | None]:
        """The request's instructions, replace flag and label with these changes made."""
        if self.clear_instructions:
            instructions = None
        elif self.instructions is not None:
            instructions = self.instructions
        if self.replace_instructions is not None:
            replace_instructions = self.replace_instructions
        if self.clear_label:
            label = None
        elif self.label is not None:
            label = self.label
        return instructions, replace_instructions, label


def tree_changes(value: Mapping[str, Any] | None) -> Checked:
    """What a ``session_before_tree`` result changes, its malformed fields left out.

    ``customInstructions`` and ``label`` may be a string or ``null`` (which clears them);
    ``replaceInstructions`` a boolean; ``summary`` an object with a non-empty ``summary``
    string and, optionally, ``details`` (an object).

    Returns:
        ``value``: a :class:`TreeChanges`.
    """
    if not value:
        return Checked(TreeChanges())
    where = "session_before_tree result's"
    problems: list[str] = []
    changes = _tree_fields(value, where, problems)
    supplied = value.get("summary")
    if supplied is not None:
        problem = _summary_problem(supplied, where)
        if problem is None:
            changes["supplied"] = supplied
        else:
            problems.append(f"{problem}; the branch is summarized as without a hook")
    return Checked(TreeChanges(**changes), problems)


def _tree_fields(value: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for key, name, clear in (
        ("customInstructions", "instructions", "clear_instructions"),
        ("label", "label", "clear_label"),
    ):
        if key not in value:
            continue
        item = value[key]
        if item is None:
            changes[clear] = True
        elif isinstance(item, str):
            changes[name] = item
        else:
            problems.append(f"{where} {key} must be a string or null, got {_shown(item)}; ignored")
    item = value.get("replaceInstructions")
    if isinstance(item, bool):
        changes["replace_instructions"] = item
    elif item is not None:
        problems.append(
            f"{where} replaceInstructions must be true or false, got {_shown(item)}; ignored"
        )
    return changes


def _summary_problem(supplied: Any, where: str) -> str | None:
    text = supplied.get("summary") if isinstance(supplied, Mapping) else None
    if not isinstance(text, str) or not text.strip():
        return (
            f"{where} summary must be an object with a non-empty summary string, got "
            f"{_shown(supplied)}"
        )
    details = supplied.get("details")
    if details is not None and not isinstance(details, Mapping):
        return f"{where} summary.details must be an object, got {_shown(details)}"
    return None
