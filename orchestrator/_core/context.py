"""The context the model sees on a path (pi's buildSessionContext).

:func:`build_context` is pi's ``buildSessionContext`` over a root-first path. The same logic is
exposed incrementally as :class:`ContextBuilder`: feed it entries one at a time and it keeps the
messages, their token estimates, the model and the thinking level current. Appending a message
costs O(1); appending a compaction costs O(kept entries), never a walk of the whole path.

The builder also keeps what compaction planning needs, up to date as the context grows, so
that planning costs O(kept + summarized range), not a walk of the window (issue 9): the path
position of every context message, running sums of the estimates, the last compaction, and
the file operations of every assistant tool call (and where each path was first touched), and
running sums of each message's serialized length and each message's shape, so a summary
request serializes only what fits its budget, the usual shapes without checking them again (see
``_core.serialize``). A :class:`~orchestrator._core.context_index.ContextIndex` is a
fixed-length view of those, handed out with each context.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from orchestrator._core.context_index import FILE_TOOLS as FILE_TOOLS
from orchestrator._core.context_index import ContextIndex as ContextIndex
from orchestrator._core.context_index import Snapshot as Snapshot
from orchestrator._core.context_index import chosen as chosen
from orchestrator._core.context_index import window as window
from orchestrator._core.entries import (
    COMPACTION,
    CONTEXT_EDIT,
    MESSAGE,
    MODEL_CHANGE,
    THINKING_LEVEL_CHANGE,
    Entry,
    Message,
    compaction_messages,
    entry_message,
    is_system_entry,
    project,
)
from orchestrator._core.lean import Recent, lean_entry, lean_message
from orchestrator._core.measures import Measures
from orchestrator._core.serialize import LATE_ROLES, SHAPE_TEXT_AND_CALL
from orchestrator._core.session_context import ModelRef as ModelRef
from orchestrator._core.session_context import SessionContext as SessionContext
from orchestrator._core.session_context import model_from_change
from orchestrator._core.tokens import (
    estimate_tokens,
    json_length,
    quick_estimate,
)
from orchestrator._core.utf16 import utf16_len


class ContextBuilder:
    """Builds a :class:`SessionContext` one path entry at a time.

    It is pi 1.x's ``buildSessionProjection`` kept up to date: the latest compaction gives its
    system checkpoint and summary, then the entries it kept (system messages among them left
    out: the checkpoint replaces them), then everything after it; each entry projected through
    the latest context edit that targets it. An edit of something already in the context, rare
    (overflow recovery, an extension), measures the context again from the compaction; every
    other entry is O(1).

    ``measured``: measure each message for summary requests as it comes in (a runtime's
    context); otherwise on first need (:mod:`~orchestrator._core.measures`). ``lean``: keep of
    each entry only what planning reads (:mod:`~orchestrator._core.lean`); such a context
    raises :class:`~orchestrator._core.lean.BodiesNeeded` where it would read the text of an
    entry it no longer holds.
    """

    def __init__(
        self, path: Iterable[Entry] = (), *, measured: bool = False, lean: bool = False
    ) -> None:
        self._lean = lean
        self._lean_kept: tuple[object, Any] = (None, None)  # a pushed message, its lean form
        self._recent = Recent() if lean else None  # a lean context's last entries, whole
        self._path: list[Entry] = []
        self._position: dict[str, int] = {}
        self._messages: list[Message] = []
        self._entry_ids: list[str] = []
        # Numbers live in arrays, not lists of int objects: a quarter of the memory, and a
        # compaction that starts new ones frees the old ones at once, not entry by entry.
        self._estimates: array[int] = array("q")
        self._positions: array[int] = array("q")
        self._prefix: array[int] = array("q", [0])
        self._event_message: array[int] = array("q")
        self._event_kind: list[str] = []
        self._event_path: list[str] = []
        self._first_seen: dict[str, dict[str, int]] = {kind: {} for kind in FILE_TOOLS}
        self._late: list[int] = []
        # Per message its serialized length, shape and parts, for summary requests: on demand,
        # or as each message comes in when ``measured`` (see measure()).
        self._measures = Measures(self._messages)
        self._measures.eager = measured
        self._system: list[int] = []
        self._edits: dict[str, Entry] = {}
        # Since the last restart, a context edit or a system message came in: the next
        # compaction measures what it keeps again rather than reusing the numbers.
        self._irregular = False
        self._estimate_sum = 0
        self._last_compaction = -1
        self._last_invalidating = -1
        self._start = 0
        self._head = 0
        self._fresh_from = 0
        self.thinking_level = "off"
        self.model: ModelRef | None = None
        self._context: SessionContext | None = None  # the last one built, until the next push
        self._take_path(path)

    def _take_path(self, path: Iterable[Entry]) -> None:
        """:meth:`push` each entry of ``path``, a message entry's steps written out here.

        Building a context walks every entry of the path (``plan``, ``context``, opening a
        session); for the usual entry, a message, the calls of a push were half its cost. A
        context measured as it comes in (the runtime's) takes the general steps.
        """
        general = self._measures.eager or self._lean
        positions, entries = self._position, self._path
        for entry in path:
            if general or entry.get("type") != MESSAGE:
                self.push(entry)
                continue
            here = len(entries)
            entry_id = entry["id"]
            positions[entry_id] = here
            entries.append(entry)
            message = entry.get("message")
            if isinstance(message, dict):
                if message.get("content") is None or self._edits:
                    self._emit(entry, here, restoring=False)
                else:
                    self._take_message(message, entry_id, here)

    def _take_message(self, message: Message, entry_id: str, position: int) -> None:
        """:meth:`_add` for a context measured on need, the usual roles without its steps."""
        role = message.get("role")
        if role == "assistant" and type(message["content"]) is list:
            self._take_model_from_assistant(message)
            estimate = self._assistant_estimate(message["content"], len(self._messages))
        elif (role == "user" or role == "toolResult") and "nestedCalls" not in message:
            estimate = quick_estimate(message, role)
        else:
            self._add(message, entry_id, position)
            return
        self._append(message, entry_id, position, estimate)

    def _append(self, message: Message, entry_id: str, position: int, estimate: int) -> None:
        if self._lean:  # the message of the entry just pushed is already lean in the path
            message = self._lean_kept[1] if message is self._lean_kept[0] else lean_message(message)
        self._messages.append(message)
        self._entry_ids.append(entry_id)
        self._estimates.append(estimate)
        self._positions.append(position)
        self._estimate_sum += estimate
        self._prefix.append(self._estimate_sum)

    def push(self, entry: Entry) -> Entry:
        """Add the next entry of the path; return it as the builder keeps it (lean or whole)."""
        self._context = None
        here = len(self._path)
        self._position[entry["id"]] = here
        kept = entry
        if self._recent is not None:
            kept = lean_entry(entry)
            self._lean_kept = (entry.get("message"), kept.get("message"))
            self._recent.add(entry)
        self._path.append(kept)
        kind = entry.get("type")
        if kind == MESSAGE:  # the usual entry, taken directly
            message = entry.get("message")
            if isinstance(message, dict):
                if message.get("content") is None or self._edits:
                    self._emit(entry, here, restoring=False)
                elif self._lean:  # never measured: the quick steps of a path's loop
                    self._take_message(message, entry["id"], here)
                else:
                    self._add(message, entry["id"], here)
            return kept
        if kind == THINKING_LEVEL_CHANGE:
            level = entry.get("thinkingLevel")
            self.thinking_level = level if isinstance(level, str) and level else "off"
        elif kind == MODEL_CHANGE:
            self.model = model_from_change(entry) or self.model
        if kind == COMPACTION:
            self._last_invalidating = here
            self._restart_at(entry)
        elif kind == CONTEXT_EDIT:
            self._edit(entry, here)
        else:
            self._emit(entry, here)
        return kept

    def _edit(self, entry: Entry, here: int) -> None:
        """Take a context edit: it changes the target's part of the context, wherever it is."""
        self._last_invalidating = here
        self._irregular = True
        target = entry.get("targetId")
        if not isinstance(target, str):
            return
        self._edits[target] = entry
        at = self._position.get(target)
        if at is None or at >= here:
            return  # not on the path before it: it applies if the target comes later
        if at >= self._start and not (
            at < self._last_compaction and is_system_entry(self._path[at])
        ):
            self._remeasure(here + 1)

    def _take_model_from_assistant(self, message: Message) -> None:
        provider, model_id = message.get("provider"), message.get("model")
        if isinstance(provider, str) and isinstance(model_id, str):
            model = self.model
            if model is None or model.provider != provider or model.model_id != model_id:
                self.model = ModelRef(provider=provider, model_id=model_id)

    def _emit(self, entry: Entry, position: int, *, restoring: bool = True) -> None:
        message = entry_message(entry)
        if message is None:
            return
        if self._edits:
            edit = self._edits.get(entry["id"])
            if edit is not None:
                message = project(message, edit)
                if message is None:
                    return
        self._add(message, entry["id"], position, restoring=restoring)

    def _add(
        self, message: Message, entry_id: str, position: int, *, restoring: bool = False
    ) -> None:
        """Append a context message; ``restoring``: a kept one, re-read after a compaction."""
        role = message.get("role")
        index = len(self._messages)
        estimate = self._estimate(message, role, index, restoring=restoring)
        if role in LATE_ROLES:  # measured when planned: loading never reads the templates
            self._late.append(index)
        elif role == "system":
            self._system.append(index)
            self._irregular = True
        elif role == "toolResult" and "nestedCalls" in message:
            self._nested_file_events(message, index)
        self._append(message, entry_id, position, estimate)
        measures = self._measures
        if measures.eager and len(measures.shapes) <= index:  # a summary: not taken above
            measures.upto(index + 1)

    def _estimate(self, message: Message, role: object, index: int, *, restoring: bool) -> int:
        """The message's estimate, an assistant's model and file operations taken on the way.

        A context measured as it comes in (a runtime's, :meth:`measure`) measures the message
        for summary requests here too, in the walk that estimates it, as every push did before
        measuring became lazy.
        """
        if role == "assistant" and not restoring:
            self._take_model_from_assistant(message)
        measures = self._measures
        if measures.eager and role not in LATE_ROLES and len(measures.shapes) == index:
            estimate, shape = measures.take(message)
            if shape == SHAPE_TEXT_AND_CALL:  # an assistant's text and call: the second block
                self._file_event(message["content"][1], index)
            elif role == "assistant":
                self._file_events(message, index)
            return estimate
        if role == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                return self._assistant_estimate(content, index)
        return quick_estimate(message, role)

    def _file_events(self, message: Message, index: int) -> None:
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "toolCall":
                self._file_event(block, index)

    def _assistant_estimate(self, content: list[Any], index: int) -> int:
        """``estimate_tokens`` of an assistant message with these blocks.

        Its file operations are recorded from the same walk: the usual message of a context
        taken in one pass, not two (``tests/test_context_measures.py`` holds it to
        ``estimate_tokens``). An ASCII text is its length, without a call.
        """
        chars = 0
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" or kind == "thinking":  # each holds its text under its own name
                text = block.get(kind)
                if isinstance(text, str):
                    chars += len(text) if text.isascii() else utf16_len(text)
            elif kind == "toolCall":
                chars += self._call_chars(block, index)
        return -(-chars // 4)

    def _call_chars(self, block: dict[str, Any], index: int) -> int:
        """A tool call's characters in an estimate; its file operation recorded on the way."""
        name, arguments = block.get("name"), block.get("arguments", {})
        if not isinstance(name, str):
            return json_length(arguments)
        if name in FILE_TOOLS:
            self._file_operation(name, arguments, index)
        return (len(name) if name.isascii() else utf16_len(name)) + json_length(arguments)

    def _nested_file_events(self, message: Message, index: int) -> None:
        # pi 1.x: calls a codemode script made are recorded on the script's result.
        nested = message.get("nestedCalls")
        calls = nested.get("calls") if isinstance(nested, dict) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                self._file_event(call, index)

    def _file_event(self, block: dict[str, Any], index: int) -> None:
        """Record the file operation of a tool call block, if it is one."""
        name = block.get("name")
        if isinstance(name, str) and name in FILE_TOOLS:
            self._file_operation(name, block.get("arguments"), index)

    def _file_operation(self, name: str, arguments: object, index: int) -> None:
        """Record a call of the file tool ``name``, if its arguments name a path."""
        path = arguments.get("path") if isinstance(arguments, dict) else None
        if isinstance(path, str) and path:
            self._event_message.append(index)
            self._event_kind.append(name)
            self._event_path.append(path)
            self._first_seen[name].setdefault(path, index)

    def _restart_at(self, compaction: Entry) -> None:
        # Summary first, then the kept entries from firstKeptEntryId up to the compaction. If the
        # kept id is not on the path before the compaction, nothing before it is kept (pi; a
        # retain-none compaction names itself).
        here = len(self._path) - 1
        kept = compaction.get("firstKeptEntryId")
        start = self._position.get(kept, here) if isinstance(kept, str) else here
        start = min(start, here)
        if start > self._last_compaction and not self._irregular:
            # Everything kept was written after the last compaction, so it is in this context
            # already, measured: the restart reuses those numbers instead of measuring each
            # kept message again (the commit of a compaction costs O(kept) list copies).
            self._restart_reusing(compaction, here, start)
            return
        self._last_compaction, self._start = here, start
        # The edits in effect are those the context takes: in the kept range from now on.
        self._edits = {}
        for position in range(start, here):
            entry = self._path[position]
            target = entry.get("targetId")
            if entry.get("type") == CONTEXT_EDIT and isinstance(target, str):
                self._edits[target] = entry
        self._remeasure(here)

    def _head_messages(self, compaction: Entry) -> list[Message]:
        edit = self._edits.get(compaction["id"]) if self._edits else None
        if edit is not None and edit.get("replacement") is None:
            return []  # an edit may omit even the compaction (nothing else of it changes)
        return compaction_messages(compaction)

    def _reset(self, head: list[Message], entry_id: str, position: int) -> None:
        """Start the lists again with the compaction's own messages (none without one)."""
        self._messages, self._entry_ids = [], []
        self._estimates, self._positions = array("q"), array("q")
        self._prefix, self._estimate_sum = array("q", [0]), 0
        eager = self._measures.eager
        self._measures = Measures(self._messages)
        self._measures.eager = eager
        self._late, self._system = [], []
        self._event_message, self._event_kind, self._event_path = array("q"), [], []
        self._first_seen = {kind: {} for kind in FILE_TOOLS}
        self._irregular = bool(self._edits)
        for message in head:
            # Never in a range that is summarized or budgeted: no serialized length.
            estimate = estimate_tokens(message)
            if message.get("role") == "system":
                self._system.append(len(self._messages))
            else:
                self._late.append(len(self._messages))
            self._append(message, entry_id, position, estimate)
            self._measures.skip()
        self._head = len(head)

    def _remeasure(self, end: int) -> None:
        """Measure the context again, from the latest compaction through path position ``end``.

        The kept entries before the compaction leave their system messages out (the checkpoint
        stands for them); the entries after it are all taken.
        """
        recent = self._recent
        whole = recent.whole(self._start, len(self._path)) if recent is not None else None
        compaction = self._last_compaction
        if compaction >= 0:
            entry = self._path[compaction]
            self._reset(self._head_messages(entry), entry["id"], compaction)
        else:
            self._reset([], "", -1)
        self._fresh_from = 0
        path = self._path
        for position in range(self._start, end):
            if position == compaction:
                self._fresh_from = len(self._messages)
                continue
            entry = path[position] if whole is None else whole(position)
            if position < compaction and is_system_entry(entry):
                continue
            if entry.get("type") != COMPACTION:  # an older one in the kept range gives nothing
                self._emit(entry, position)
        if compaction >= end:
            self._fresh_from = len(self._messages)

    def _restart_reusing(self, compaction: Entry, here: int, start: int) -> None:
        """The restart that keeps the measured messages at path positions ``[start, here)``."""
        count = len(self._messages)
        first = bisect.bisect_left(self._positions, start, self._head, count)
        self._edits = {}
        head = compaction_messages(compaction)
        messages, entry_ids = self._messages, self._entry_ids
        estimates, positions = self._estimates, self._positions
        old_prefix, measures, late = self._prefix, self._measures, self._late
        event_message, event_kind, event_path = (
            self._event_message,
            self._event_kind,
            self._event_path,
        )
        self._reset(head, compaction["id"], here)
        h = self._head
        # The running sums go on from where the kept messages' sums stood (ContextIndex): the
        # head's steps end at the first kept message's old sum, so the kept steps are the old
        # sums themselves, sliced, not each recomputed.
        kept_from = old_prefix[first]
        prefix = array("q", (value - self._estimate_sum + kept_from for value in self._prefix))
        prefix.extend(old_prefix[first + 1 : count + 1])
        self._prefix, self._estimate_sum = prefix, prefix[-1]
        self._messages += messages[first:count]
        self._entry_ids += entry_ids[first:count]
        self._estimates.extend(estimates[first:count])
        self._positions.extend(positions[first:count])
        self._measures = measures.kept(self._messages, first, count, h)
        self._measures.eager = measures.eager
        if measures.eager:
            self._measures.upto(len(self._messages))
        self._late += (index - first + h for index in late if index >= first)
        lo = bisect.bisect_left(event_message, first)
        self._event_message = array("q", _less(event_message[lo:], first - h))
        self._event_kind, self._event_path = event_kind[lo:], event_path[lo:]
        for index, kind, path in zip(
            self._event_message, self._event_kind, self._event_path, strict=True
        ):
            self._first_seen[kind].setdefault(path, index)
        self._last_compaction, self._start = here, start
        self._fresh_from = len(self._messages)

    def measure(self) -> None:
        """Measure every message now, and each one taken in from now on.

        For a process that will summarize (the runtime): a compaction then finds every length
        known, as it did when every push measured (:mod:`~orchestrator._core.measures`).
        """
        self._measures.upto(len(self._messages))
        self._measures.eager = True

    def path(self) -> list[Entry]:
        """A copy of the path pushed so far, root first."""
        return self._path.copy()

    def context(self) -> SessionContext:
        """The context as of the last pushed entry (the same object until the next push).

        A commit asks for it several times over (the rebuild effect, the turn's threshold
        check, the events): an immutable view of the same moment is built once (issue 9).
        """
        if self._context is not None:
            return self._context
        self._context = SessionContext(
            messages=Snapshot(self._messages),
            entry_ids=Snapshot(self._entry_ids),
            estimates=Snapshot(self._estimates),
            thinking_level=self.thinking_level,
            model=self.model,
            fresh_from=self._fresh_from,
            index=ContextIndex(
                path=self._path,
                path_length=len(self._path),
                position=self._position,
                positions=self._positions,
                prefix=self._prefix,
                count=len(self._messages),
                base=self._head,
                last_compaction=self._last_compaction,
                context_start=self._start,
                last_invalidating=self._last_invalidating,
                system=Snapshot(self._system),
                event_message=self._event_message,
                event_kind=self._event_kind,
                event_path=self._event_path,
                events=len(self._event_message),
                first_seen=self._first_seen,
                late=self._late,
                measures=self._measures,
            ),
        )
        return self._context


def _less(values: Iterable[int], by: int) -> Iterator[int]:
    # Each value minus `by`, in C (map over operator.sub), not a Python-level loop: a commit
    # restarts the context over every kept message (issue 9).
    return map(operator.sub, values, itertools.repeat(by))


def build_context(path: Sequence[Entry]) -> SessionContext:
    """Build the context for a root-first path (pi ``buildSessionContext``)."""
    return ContextBuilder(path).context()
