"""Hooks: extension points around compaction, navigation and forking (pi's extension hooks, D25).

Handlers run one after another in registration order, sync or async. For the
``session_before_*`` hooks (and ``session.compacting``) the last truthy result wins, and a
result with ``cancel`` set ends the run at once. An exception in a handler never breaks the
flow: it is reported (the runtime turns it into a ``hook_error`` event) and the default
behaviour continues.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

HOOK_NAMES = frozenset(
    {
        "session_before_compact",
        "session.compacting",
        "session_compact",
        "session_compact_failed",
        "session_before_tree",
        "session_tree",
        "session_before_fork",
        "session_fork",
    }
)

Handler = Callable[[dict[str, Any]], Any | Awaitable[Any]]
ErrorReporter = Callable[[str, BaseException], None]


class Hooks:
    """A registry of hook handlers."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {name: [] for name in HOOK_NAMES}

    def on(self, name: str, handler: Handler) -> Callable[[], None]:
        """Register ``handler`` for hook ``name``; returns a function that removes it.

        Raises:
            ValueError: unknown hook name.
        """
        if name not in self._handlers:
            raise ValueError(f"unknown hook {name!r}; known: {', '.join(sorted(HOOK_NAMES))}")
        self._handlers[name].append(handler)
        return lambda: self._handlers[name].remove(handler)

    def handles(self, name: str) -> bool:
        """Whether any handler is registered for ``name`` (else its payload need not be built)."""
        return bool(self._handlers.get(name))

    async def run(
        self, name: str, payload: dict[str, Any], on_error: ErrorReporter
    ) -> Mapping[str, Any] | None:
        """Run the handlers of ``name`` and return the winning result (D25).

        Returns:
            The last truthy mapping a handler returned, or the first with ``cancel`` set;
            ``None`` when no handler returned one.
        """
        result: Mapping[str, Any] | None = None
        for handler in list(self._handlers.get(name, ())):
            try:
                value = handler(payload)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:  # noqa: BLE001 - D25: a handler never breaks the flow
                on_error(name, exc)
                continue
            if isinstance(value, Mapping) and value:
                result = value
                if value.get("cancel"):
                    return value
        return result
