"""The offline short summary: one or two sentences for a tree line, a picker or a status bar.

Theory of operation. The short summary is what a user interface shows where the full summary
does not fit, so it has to say something on its own: what changed (the files modified), towards
what (the goal, quoted and cut short), and then what is still open or, when nothing is, the last
thing done. I read all of it from the request's ``<previous-summary>`` (the summary just written)
and its conversation (the messages the compaction keeps). It carries no banner: the full summary
says it was written offline, and a line that always starts with the same words tells nothing.
"""

from __future__ import annotations

from orchestrator._models.offline_evidence import Evidence, gist, short
from orchestrator._models.offline_summary import LATEST, STILL_OPEN, UNANSWERED, Parsed

_GOAL_CHARS = 120
_ITEM_CHARS = 120
_FILES_NAMED = 3


def _files(paths: list[str]) -> str:
    named = [f"`{p}`" for p in paths[:_FILES_NAMED]]
    if len(paths) > _FILES_NAMED:
        named.append(f"{len(paths) - _FILES_NAMED} more files")
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith(("…", ".", "!", "?")) else text + "."


def _goal(facts: Evidence, previous: Parsed) -> str | None:
    goals = [g for g in previous.items("Goal") if not g.startswith(LATEST)]
    goals = goals or [r.text for r in facts.requests[:1]]
    return gist(goals[0], _GOAL_CHARS).rstrip(".") if goals else None


def _still_open(facts: Evidence, previous: Parsed) -> str | None:
    questions = [
        item.split("(verbatim): ", 1)[1]
        for item in previous.items("Critical Context")
        if item.startswith((UNANSWERED, STILL_OPEN))
    ]
    question = facts.last_open()
    if question:
        questions.append(question)
    if questions:
        return f'the user\'s message "{short(questions[-1], _ITEM_CHARS)}"'
    pending = [*previous.items("Blocked"), *previous.items("In Progress")]
    return short(pending[0], _ITEM_CHARS) if pending else None


def short_summary(facts: Evidence, previous: Parsed) -> str:
    """One or two first-person sentences (see the module docstring)."""
    changed = sorted(previous.modified | set(facts.files()[1]))
    goal = _goal(facts, previous)
    towards = f' while working on "{goal}"' if goal else ""
    if changed:
        first = f"I changed {_files(changed)}{towards}."
    else:
        first = f"I have not changed any files yet{towards}."
    left = _still_open(facts, previous)
    done = previous.items("Done")
    if left:
        return f"{first} Still open: {_sentence(left)}"
    if done:
        return f"{first} Last done: {_sentence(short(done[-1], _ITEM_CHARS))}"
    return first
