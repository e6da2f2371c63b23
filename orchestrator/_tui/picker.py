"""The tree picker of the navigator TUI: rows, preview, summary choice, navigation worker.

See :mod:`orchestrator._tui.app` for the theory of operation; this module holds the modal screen.
"""

from __future__ import annotations

import enum
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from orchestrator._core.entries import Entry, text_of
from orchestrator._core.errors import ModelError, SessionError
from orchestrator._core.printable import terminal_safe
from orchestrator._core.tree_drawing import tree_prefixes
from orchestrator._runtime.events import Event
from orchestrator._runtime.navigation.driver import NavigationResult
from orchestrator._runtime.navigation.moves import navigation_target
from orchestrator._runtime.session import AgentSession
from orchestrator._store.reports import describe_entry, edit_mark, short_summary_of, tree_rows
from orchestrator._store.session import Session

UNAVAILABLE = "/tree is unavailable while the agent works; wait for the turn to end or press Esc"
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
HIDDEN = frozenset({"label", "custom", "session_info"})


class PickerState(enum.Enum):
    """What the picker is doing, hence what Enter and Esc mean."""

    CHOOSING = "choosing"  # the list has focus: Enter navigates, Esc closes the picker
    INSTRUCTING = "instructing"  # the focus input is open: Enter summarizes, Esc goes back
    NAVIGATING = "navigating"  # navigate() runs: Esc aborts the summary, other keys wait


def entry_text(entry: Entry) -> str:
    """The full text of an entry for the preview pane (``describe_entry`` is one line)."""
    message = entry.get("message") if entry.get("type") == "message" else None
    if isinstance(message, dict):
        role = message.get("role")
        if role in ("compactionSummary", "branchSummary"):
            return str(message.get("summary", ""))
        if role == "bashExecution":
            return f"$ {message.get('command', '')}\n{message.get('output', '')}"
        if role == "assistant":
            parts = []
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
                elif isinstance(block, dict) and block.get("type") == "toolCall":
                    parts.append(f"→ {block.get('name')}({block.get('arguments', {})})")
            return "\n".join(parts)
        return text_of(message.get("content"))
    if entry.get("type") in ("compaction", "branch_summary"):
        short = short_summary_of(entry)
        body = str(entry.get("summary", ""))
        return f"Short summary: {short}\n\n{body}" if short else body
    return describe_entry(entry)


def picker_rows(session: Session, *, show_all: bool = False) -> list[dict[str, Any]]:
    """The picker's rows: ``tree_rows`` without bookkeeping entries unless ``show_all``.

    Labels, ``custom`` entries (the position markers the commands write, for one) and session
    info are not places anyone wants to go back to, so, like pi's default filter, I hide them.
    ``current`` marks the leaf, or its nearest shown ancestor when the leaf itself is hidden.
    ``prefix`` draws the row's branches (``├─``, ``└─``, ``│``) as ``tree`` does, each row
    hanging from its nearest shown ancestor.
    """
    every = tree_rows(session)
    parents = {r["id"]: r["parentId"] for r in every}
    rows = [r for r in every if show_all or r["type"] not in HIDDEN]
    shown = {r["id"] for r in rows}

    def shown_parent(entry_id: str | None) -> str | None:
        seen: set[str] = set()
        while entry_id is not None and entry_id not in shown and entry_id not in seen:
            seen.add(entry_id)
            entry_id = parents.get(entry_id)
        return entry_id if entry_id in shown else None

    prefixes = tree_prefixes([(r["id"], shown_parent(r["parentId"])) for r in rows])
    current = next((e["id"] for e in reversed(session.path()) if e["id"] in shown), None)
    return [
        {**r, "current": r["id"] == current, "prefix": prefix}
        for r, prefix in zip(rows, prefixes, strict=True)
    ]


def row_content(row: dict[str, Any]) -> Content:
    """One picker line: marker, branch connectors, label and description."""
    if row["current"]:
        marker, style = "● ", "bold $success"
    elif row["onActivePath"]:
        marker, style = "│ ", "bold"
    else:
        marker, style = "  ", "dim"
    label = (f"[{terminal_safe(row['label'])}] ", "bold $warning") if row["label"] else ("", "")
    # A session's text, tool output and all; an edited entry says which edit applies.
    text = (terminal_safe(row["text"] + edit_mark(row)), style)
    return Content.assemble((marker, "$success"), (row["prefix"], "dim"), label, text)


class TreePicker(ModalScreen[NavigationResult | None]):
    """The ``/tree`` selector: dismissed with the navigation's result, or ``None`` on Esc."""

    DEFAULT_CSS = """
    TreePicker { align: center middle; }
    #picker { width: 96%; height: 92%; border: round $accent; background: $surface; }
    #rows { width: 3fr; height: 1fr; border: none; text-wrap: nowrap; text-overflow: ellipsis; }
    #preview-box { width: 2fr; height: 1fr; border-left: solid $accent; padding: 0 1; }
    #instructions { display: none; }
    #instructions.open { display: block; }
    #picker-status { height: auto; padding: 0 1; background: $boost; }
    """
    BINDINGS = [
        Binding("s", "toggle_summary", "Summary on/off"),
        Binding("c", "custom", "Summarize with focus"),
        Binding("a", "show_all", "All entries"),
        Binding("escape", "back", "Cancel / abort"),
    ]

    def __init__(self, runtime: AgentSession, *, summarize: bool = False) -> None:
        super().__init__()
        self.runtime = runtime
        self.summarize = summarize  # ``s``'s choice; the app keeps it for the next opening
        self.show_all = False
        self.state = PickerState.CHOOSING
        self.message = ""
        self.status_text = ""  # what the status line shows, as plain text
        self._rows: list[dict[str, Any]] = []
        self._frame = 0
        self._spinner: Timer | None = None
        self._operation_state = ""
        self._unsubscribe = runtime.events.subscribe(self._on_event)

    def compose(self) -> ComposeResult:
        """The list and preview side by side, the focus input, the status line, the footer."""
        with VerticalScroll(id="picker"):
            with Horizontal():
                yield OptionList(id="rows")
                with VerticalScroll(id="preview-box"):
                    yield Static(id="preview", markup=False)
            yield Input(
                placeholder="Focus for the branch summary (Enter: summarize and go, Esc: back)",
                id="instructions",
            )
            yield Static(id="picker-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        """Fill the list and select the active leaf."""
        self.query_one("#picker").border_title = "Session tree"
        self._fill()
        self._show_status()

    def on_unmount(self) -> None:
        """Stop listening to the runtime."""
        self._unsubscribe()

    def _fill(self) -> None:
        rows_view = self.query_one("#rows", OptionList)
        self._rows = picker_rows(self.runtime.session, show_all=self.show_all)
        rows_view.set_options(Option(row_content(r), id=r["id"]) for r in self._rows)
        if not self._rows:
            self.query_one("#preview", Static).update("The session has no entries yet.")
            return
        leaf = next((i for i, r in enumerate(self._rows) if r["current"]), len(self._rows) - 1)
        rows_view.highlighted = leaf
        rows_view.focus()

    # -- what the user sees --------------------------------------------------------------------

    def _show_status(self) -> None:
        if self.state is PickerState.NAVIGATING and self._spinner is None:
            text = "Navigating…"
        elif self.state is PickerState.NAVIGATING:
            frame = SPINNER[self._frame % len(SPINNER)]
            detail = f" [{self._operation_state}]" if self._operation_state else ""
            text = f"{frame} Summarizing the branch you leave{detail} (Esc: abort)"
        else:
            keys = "↑↓ choose · Enter go · s summary · c summary with focus · a all · Esc cancel"
            text = f"Summarize: {'ON ' if self.summarize else 'OFF'} │ {keys}"
            if self.message:
                text = f"{self.message}\n{text}"
        self.status_text = text
        self.query_one("#picker-status", Static).update(terminal_safe(text))

    @on(OptionList.OptionHighlighted, "#rows")
    def _preview(self, event: OptionList.OptionHighlighted) -> None:
        row = self._rows[event.option_index]
        tree = self.runtime.session.tree
        entry = tree.get(row["id"])
        where = (
            "the current position"
            if row["current"]
            else "on the active path"
            if row["onActivePath"]
            else "on another branch"
        )
        if navigation_target(tree, row["id"]).editor_text is not None:
            effect = (
                "Enter: go back to just before this message; its text returns to an empty editor"
            )
        else:
            effect = "Enter: continue from here (this entry becomes the leaf)"
        lines = [f"{row['id']} · {entry.get('type')} · {where}"]
        if row["label"]:
            lines.append(f"label: {row['label']}")
        lines += [effect, "", entry_text(entry)]
        self.query_one("#preview", Static).update(terminal_safe("\n".join(lines)))

    def _on_event(self, event: Event) -> None:
        if event.type == "transition" and event.payload.get("machine") == "operation":
            self._operation_state = str(event.payload.get("dest", ""))
            self._show_status()

    def _tick(self) -> None:
        self._frame += 1
        self._show_status()

    # -- keys ----------------------------------------------------------------------------------

    def action_toggle_summary(self) -> None:
        """``s``: summarize the branch being left, or not."""
        if self.state is PickerState.CHOOSING:
            self.summarize = not self.summarize
            self.message = ""
            self._show_status()

    def action_show_all(self) -> None:
        """``a``: show or hide bookkeeping entries (labels, custom entries)."""
        if self.state is PickerState.CHOOSING:
            self.show_all = not self.show_all
            self._fill()

    def action_custom(self) -> None:
        """``c``: ask for focus instructions, then summarize with them."""
        if self.state is PickerState.CHOOSING and self._rows:
            self.state = PickerState.INSTRUCTING
            box = self.query_one("#instructions", Input)
            box.add_class("open")
            box.focus()

    def action_back(self) -> None:
        """Esc: abort a running summary, close the focus input, or cancel the picker."""
        if self.state is PickerState.NAVIGATING:
            self.runtime.abort_branch_summary()
        elif self.state is PickerState.INSTRUCTING:
            self._close_instructions()
        else:
            self.dismiss(None)

    def _close_instructions(self) -> None:
        self.state = PickerState.CHOOSING
        self.query_one("#instructions", Input).remove_class("open")
        self.query_one("#rows", OptionList).focus()

    @on(OptionList.OptionSelected, "#rows")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        if self.state is PickerState.CHOOSING:
            target = self._rows[event.option_index]["id"]
            self._start(target, summarize=self.summarize, instructions=None)

    @on(Input.Submitted, "#instructions")
    def _instructed(self, event: Input.Submitted) -> None:
        event.stop()
        # The input is only shown (so only submitted) in INSTRUCTING, with rows to choose.
        target = self._rows[self.query_one("#rows", OptionList).highlighted or 0]["id"]
        self._close_instructions()
        self._start(target, summarize=True, instructions=event.value.strip() or None)

    # -- navigating ----------------------------------------------------------------------------

    def _start(self, target: str, *, summarize: bool, instructions: str | None) -> None:
        self.state = PickerState.NAVIGATING
        self.message = ""
        self._operation_state = ""
        if summarize:
            self._spinner = self.set_interval(1 / 12, self._tick)
        self._show_status()
        # The worker is the bare runtime call and I read its outcome in ``_navigated``: a
        # coroutine resumed by a cancellation (an aborted summary) is not traced reliably on
        # Python 3.11, so no logic of mine runs after that await.
        self.run_worker(
            self.runtime.navigate(target, summarize=summarize, instructions=instructions),
            name="navigate",
            exclusive=True,
            exit_on_error=False,
        )

    @on(Worker.StateChanged)
    def _navigated(self, event: Worker.StateChanged) -> None:
        event.stop()  # the app watches its own workers only
        if event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None
        error, result = event.worker.error, event.worker.result
        if isinstance(error, SessionError):
            self._stay(str(error))
        elif isinstance(error, ModelError):
            self._stay(f"Branch summary failed: {error}; nothing changed")
        elif not isinstance(result, NavigationResult):
            raise error or TypeError(result)  # a bug, not an outcome: fail loudly
        elif result.aborted:
            self._stay("Summary aborted; history and position are unchanged")
        elif result.cancelled:
            self._stay("Navigation cancelled by an extension; nothing changed")
        else:
            self.dismiss(result)

    def _stay(self, message: str) -> None:
        self.state = PickerState.CHOOSING
        self.message = message
        self._show_status()
        self.query_one("#rows", OptionList).focus()
