"""A tiny fluent builder for pi-shaped session entries, for tests.

Every test that needs a session writes it the way pi writes it: entries with
``type``, ``id``, ``parentId`` and an ISO ``timestamp``; messages with epoch-ms ``timestamp``.
Ids and times are deterministic: the n-th entry gets id ``f"{n:08x}"`` (8 hex chars, like pi) and
the time ``start_ms + n * step_ms``.

Example::

    s = SessionBuilder()
    u = s.user("fix the bug")
    a = s.assistant("reading", calls=[("read", {"path": "a.py"})], usage=usage(1200))
    s.tool_result("print(1)")          # answers the pending call of ``a``
    s.compaction("summary", first_kept=u)
    path = s.path()                    # root-first path to the leaf (a list of entry dicts)

Each adding method returns the new entry's id, appends the entry as a child of the current leaf,
and moves the leaf to it, as pi's ``SessionManager`` does. :meth:`SessionBuilder.branch` moves the
leaf anywhere (or to ``None`` for a new root) so trees can be built too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator._core.compaction_plan import CompactionPlan, plan_compaction
from orchestrator._core.entries import Entry, Message, iso_now
from orchestrator._core.tokens import CompactionSettings
from orchestrator._core.tree import SessionTree

PROVIDER = "anthropic"
MODEL = "claude-test"

ToolCallSpec = tuple[str, Mapping[str, Any]]
"""A tool call to put on an assistant message: ``(tool name, arguments)``."""


def usage(
    total: int = 0, *, input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0
) -> dict[str, Any]:
    """A pi-ai ``Usage`` object.

    With only ``total`` given, the whole total is input (so prompt tokens equal ``total``).
    """
    if total and not (input or output or cache_read or cache_write):
        input = total
    if not total:
        total = input + output + cache_read + cache_write
    return {
        "input": input,
        "output": output,
        "cacheRead": cache_read,
        "cacheWrite": cache_write,
        "totalTokens": total,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
    }


class SessionBuilder:
    """Builds a list of pi entries (see the module docstring).

    Args:
        start_ms: Time of the header; the n-th entry is ``start_ms + n * step_ms``.
        step_ms: Time between consecutive entries.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000, step_ms: int = 1000) -> None:
        self.start_ms = start_ms
        self.step_ms = step_ms
        self.entries: list[Entry] = []
        self.by_id: dict[str, Entry] = {}
        self.leaf_id: str | None = None
        self._pending_calls: list[tuple[str, str]] = []
        self._call_counter = 0

    # -- reading -----------------------------------------------------------------------------

    @property
    def header(self) -> Entry:
        """The ``session`` header line (version 3)."""
        return {
            "type": "session",
            "version": 3,
            "id": "session-test",
            "timestamp": iso_now(self.start_ms),
            "cwd": "/work",
        }

    def path(self, leaf_id: str | None = None) -> list[Entry]:
        """Root-first path to ``leaf_id`` (default: the current leaf)."""
        current = self.leaf_id if leaf_id is None else leaf_id
        path: list[Entry] = []
        while current is not None:
            entry = self.by_id[current]
            path.append(entry)
            current = entry["parentId"]
        path.reverse()
        return path

    def tree(self) -> SessionTree:
        """A :class:`SessionTree` over every entry built so far (leaf = the builder's leaf)."""
        tree = SessionTree(self.header, list(self.entries))
        if self.leaf_id is None:
            tree.reset_leaf()
        else:
            tree.branch(self.leaf_id)
        return tree

    def __getitem__(self, entry_id: str) -> Entry:
        return self.by_id[entry_id]

    # -- moving ------------------------------------------------------------------------------

    def branch(self, entry_id: str | None) -> SessionBuilder:
        """Move the leaf to ``entry_id`` (``None``: the next entry is a new root)."""
        if entry_id is not None and entry_id not in self.by_id:
            raise KeyError(entry_id)
        self.leaf_id = entry_id
        self._pending_calls = []
        return self

    # -- adding ------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return self.start_ms + (len(self.entries) + 1) * self.step_ms

    def add(self, kind: str, **fields: Any) -> str:
        """Append an entry of any ``type`` with these fields; return its id."""
        entry_id = f"{len(self.entries) + 1:08x}"
        entry: Entry = {
            "type": kind,
            "id": entry_id,
            "parentId": self.leaf_id,
            "timestamp": iso_now(self._now_ms()),
        }
        entry.update(fields)
        self.entries.append(entry)
        self.by_id[entry_id] = entry
        self.leaf_id = entry_id
        return entry_id

    def message(self, message: Message) -> str:
        """Append a ``message`` entry holding ``message`` verbatim (a timestamp is added)."""
        stored = {"timestamp": self._now_ms(), **message}
        return self.add("message", message=stored)

    def user(self, text: str | Sequence[Mapping[str, Any]]) -> str:
        """A user message (a string, or a list of content blocks)."""
        content = text if isinstance(text, str) else [dict(b) for b in text]
        return self.message({"role": "user", "content": content})

    def assistant(
        self,
        text: str = "",
        *,
        calls: Iterable[ToolCallSpec] = (),
        usage: Mapping[str, Any] | None = None,
        stop_reason: str | None = None,
        thinking: str | None = None,
    ) -> str:
        """An assistant message with optional thinking, text and tool calls.

        Tool calls get ids ``call_1``, ``call_2``...; :meth:`tool_result` answers them in order.
        ``stop_reason`` defaults to ``toolUse`` with calls, else ``stop``. Without ``usage`` the
        message has no ``usage`` field, so token counts are pure estimates (pass :func:`usage`
        to anchor them on a provider count).
        """
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking})
        if text:
            content.append({"type": "text", "text": text})
        pending: list[tuple[str, str]] = []
        for name, arguments in calls:
            self._call_counter += 1
            call_id = f"call_{self._call_counter}"
            content.append(
                {"type": "toolCall", "id": call_id, "name": name, "arguments": dict(arguments)}
            )
            pending.append((call_id, name))
        message: Message = {
            "role": "assistant",
            "content": content,
            "provider": PROVIDER,
            "model": MODEL,
            "stopReason": stop_reason or ("toolUse" if pending else "stop"),
        }
        if usage is not None:
            message["usage"] = dict(usage)
        entry_id = self.message(message)
        self._pending_calls = pending
        return entry_id

    def tool_result(
        self,
        text: str | Sequence[Mapping[str, Any]],
        *,
        call_id: str | None = None,
        tool_name: str | None = None,
        is_error: bool = False,
        pruned_at: int | None = None,
    ) -> str:
        """A tool result answering the oldest pending call of the last assistant.

        Pass ``call_id`` / ``tool_name`` to answer something else (or nothing at all).
        """
        if call_id is None and self._pending_calls:
            call_id, pending_name = self._pending_calls.pop(0)
            tool_name = tool_name or pending_name
        content = [{"type": "text", "text": text}] if isinstance(text, str) else list(text)
        message: Message = {
            "role": "toolResult",
            "toolCallId": call_id or "call_unknown",
            "toolName": tool_name or "bash",
            "content": content,
            "isError": is_error,
        }
        if pruned_at is not None:
            message["prunedAt"] = pruned_at
        return self.message(message)

    def bash(self, command: str, output: str = "", exit_code: int = 0) -> str:
        """A ``bashExecution`` message (a user-run shell command)."""
        return self.message(
            {
                "role": "bashExecution",
                "command": command,
                "output": output,
                "exitCode": exit_code,
                "cancelled": False,
                "truncated": False,
            }
        )

    def compaction(
        self,
        summary: str,
        *,
        first_kept: str,
        tokens_before: int = 10000,
        details: Mapping[str, Any] | None = None,
        from_extension: bool = False,
        **extra: Any,
    ) -> str:
        """A ``compaction`` entry keeping entries from ``first_kept``."""
        fields: dict[str, Any] = {
            "summary": summary,
            "firstKeptEntryId": first_kept,
            "tokensBefore": tokens_before,
        }
        if details is not None:
            fields["details"] = dict(details)
        if from_extension:
            fields["fromExtension"] = True
        fields.update(extra)
        return self.add("compaction", **fields)

    def branch_summary(
        self,
        summary: str,
        *,
        from_id: str | None = None,
        details: Mapping[str, Any] | None = None,
        from_extension: bool = False,
    ) -> str:
        """A ``branch_summary`` entry (``fromId`` defaults to the current leaf or ``"root"``)."""
        fields: dict[str, Any] = {"fromId": from_id or self.leaf_id or "root", "summary": summary}
        if details is not None:
            fields["details"] = dict(details)
        if from_extension:
            fields["fromExtension"] = True
        return self.add("branch_summary", **fields)

    def custom_message(
        self, content: str | Sequence[Mapping[str, Any]], *, custom_type: str = "note"
    ) -> str:
        """A ``custom_message`` entry (an extension message that goes into the context)."""
        body = content if isinstance(content, str) else [dict(b) for b in content]
        return self.add("custom_message", customType=custom_type, content=body, display=True)

    def custom(self, custom_type: str = "state", data: Any = None) -> str:
        """A ``custom`` entry (extension state, never in the context)."""
        return self.add("custom", customType=custom_type, data=data)

    def model_change(self, provider: str = "openai", model_id: str = "gpt-test") -> str:
        """A pi-shaped ``model_change`` entry."""
        return self.add("model_change", provider=provider, modelId=model_id)

    def thinking(self, level: str = "high") -> str:
        """A ``thinking_level_change`` entry."""
        return self.add("thinking_level_change", thinkingLevel=level)

    def label(self, target_id: str, label: str | None) -> str:
        """A ``label`` entry (``None`` clears the label)."""
        return self.add("label", targetId=target_id, label=label)


def split_turn() -> SessionBuilder:
    """A history whose compaction (keep_recent_tokens=150, adaptive_keep off) cuts a turn:
    two summary requests, history and turn prefix."""
    s = SessionBuilder()
    s.user("old request " + "a" * 800)
    s.assistant("old answer " + "b" * 800, usage=usage(1000))
    s.user("big turn " + "c" * 200)
    for n in range(3):
        s.assistant("step " + "d" * 400, calls=[("read", {"path": f"f{n}.py"})], usage=usage(1500))
        s.tool_result("e" * 400)
    s.assistant("tail " + "f" * 100, usage=usage(2000))
    return s


def two_turns_plan() -> CompactionPlan:
    """The compaction plan (keep_recent_tokens=150, adaptive_keep off) of two whole turns: one
    summary request (no split turn, no file operations), the history."""
    s = SessionBuilder()
    s.user("first request " + "a" * 800)
    s.assistant("first answer " + "b" * 800, usage=usage(1000))
    s.user("second request " + "c" * 400)
    s.assistant("second answer " + "d" * 400, usage=usage(2000))
    plan = plan_compaction(
        s.path(), CompactionSettings(keep_recent_tokens=150, adaptive_keep=False)
    )
    assert isinstance(plan, CompactionPlan)
    return plan
