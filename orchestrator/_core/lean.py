"""What a context keeps of each entry when nothing will read the messages' text (``plan``).

Planning a compaction reads of a context's messages only their estimates (kept in arrays as
each message comes in), their roles (cut points), the last assistant reply's usage and stop
reason (the token count, D6/D7), and the system messages whole (the current system prompt).
A ``ContextBuilder(lean=True)`` keeps of each other message only those fields, and of each
message entry only its place in the tree and that lean message: ``plan --json`` on a long
session then holds a few hundred bytes per entry instead of every message's text (issue 37:
111 MB against 60 MB at 40,000 entries).

The builder reads an entry's text once, when it takes it in. It reads the text of earlier
entries again only to measure the context anew: a compaction after a system message or a
context edit measures what it keeps (pi 1.x sessions open with a system message, so this is
every compaction of theirs), and an edit of a message already in the context measures the
window again. A lean builder keeps its last :data:`RECENT` entries whole for that
(:class:`Recent`), which holds what a compaction keeps; anything older raises
:class:`BodiesNeeded`, and its caller plans from the whole path instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from orchestrator._core.entries import MESSAGE, Entry, Message

LEAN_MESSAGE_KEYS = ("role", "usage", "stopReason", "provider", "model")
"""What a lean context keeps of a message: what planning and the token count read."""


_ROLE_ONLY: dict[str, Message] = {}
"""One lean message per bare role, shared: half of a session's messages are a role alone, and
entries are never written in place (``entries.py``)."""


RECENT = 2048
"""Entries a lean context keeps whole, newest last: the recent turns a compaction keeps
(20,000 tokens by default) are a few hundred entries."""


class BodiesNeeded(Exception):
    """A lean context was asked to measure entries again that it no longer holds whole."""


class Recent:
    """The last :data:`RECENT` entries a lean context took, whole, by path position."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque(maxlen=RECENT)

    def add(self, entry: Entry) -> None:
        """Keep ``entry``, the path's next one (the oldest kept one goes)."""
        self._entries.append(entry)

    def whole(self, start: int, total: int) -> Callable[[int], Entry]:
        """The whole entry at each path position from ``start`` on, of a path of ``total``.

        Raises:
            BodiesNeeded: ``start`` is older than what is kept.
        """
        first = total - len(self._entries)
        if start < first:
            raise BodiesNeeded(f"entries from position {start} on, and {first} is the oldest kept")
        entries = self._entries
        return lambda position: entries[position - first]


def lean_message(message: Message) -> Message:
    """The fields of ``message`` a lean context keeps (one shared dict per bare role).

    A system message is kept whole: the token count estimates the current system prompt,
    which is made from them (``current_system_message``), and they are few.
    """
    role = message.get("role")
    if role == "system":
        return message
    if (
        type(role) is not str
        or "usage" in message
        or "stopReason" in message
        or "provider" in message
        or "model" in message
    ):
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
