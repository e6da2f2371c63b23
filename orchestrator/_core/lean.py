"""What a context keeps of each entry when nothing will read the messages' text (``plan``).

Planning a compaction reads of a context's messages only their estimates (kept in arrays as
each message comes in), their roles (cut points, system prompts), and the last assistant
reply's usage and stop reason (the token count, D6/D7). A ``ContextBuilder(lean=True)`` keeps
of each message only those fields, and of each message entry only its place in the tree and
that lean message: ``plan --json`` on a long session then holds a few hundred bytes per entry
instead of every message's text (issue 37: 111 MB against 55 MB at 40,000 entries).

The builder reads an entry's text once, when it takes it in. It reads the text of earlier
entries again only to measure the context anew (a context edit of a message already in it, or
a compaction after a system message or an edit): a lean builder cannot, and raises
:class:`BodiesNeeded`, and its caller plans from the whole path instead.
"""

from __future__ import annotations

from orchestrator._core.entries import MESSAGE, Entry, Message

LEAN_MESSAGE_KEYS = ("role", "usage", "stopReason", "provider", "model")
"""What a lean context keeps of a message: what planning and the token count read."""

_BEYOND_ROLE = LEAN_MESSAGE_KEYS[1:]

_ROLE_ONLY: dict[str, Message] = {}
"""One lean message per bare role, shared: half of a session's messages are a role alone, and
entries are never written in place (``entries.py``)."""


class BodiesNeeded(Exception):
    """A lean context was asked to measure entries again, which needs their text."""


def lean_message(message: Message) -> Message:
    """The fields of ``message`` a lean context keeps (one shared dict per bare role)."""
    role = message.get("role")
    if type(role) is not str or any(key in message for key in _BEYOND_ROLE):
        return {key: message[key] for key in LEAN_MESSAGE_KEYS if key in message}
    shared = _ROLE_ONLY.get(role)
    if shared is None:
        shared = _ROLE_ONLY[role] = {"role": role}
    return shared


def lean_entry(entry: Entry) -> Entry:
    """``entry`` as a lean context keeps it: a message entry's place and lean message.

    Other entries (compactions, summaries, changes of model, edits) are kept whole: they are
    few, small, and planning reads them (a compaction's summary and file lists).
    """
    if entry.get("type") != MESSAGE:
        return entry
    kept = {"type": MESSAGE, "id": entry["id"]}
    if "parentId" in entry:
        kept["parentId"] = entry["parentId"]
    message = entry.get("message")
    if isinstance(message, dict):
        kept["message"] = lean_message(message)
    elif "message" in entry:
        kept["message"] = message
    return kept
