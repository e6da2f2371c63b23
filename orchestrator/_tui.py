"""The tree navigator TUI: pick an entry of the session tree and move the active context there.

Theory of operation. The main screen shows the active path (what the model sees next), a status
line and the editor. ``/tree`` (typed in the editor) or Ctrl+T opens :class:`TreePicker`, a modal
over it, exactly when the session is idle: the runtime refuses navigation during a turn, and I
refuse to even open the picker then, with the same advice (seed 3: "/tree is unavailable while
the agent works").

In the picker, Up/Down choose an entry and the preview shows its full text and what Enter would
do; ``s`` toggles "summarize the branch I leave", ``c`` asks for focus instructions and then
summarizes with them (pi's three choices: no summary, summarize, summarize with a custom
prompt). Enter runs :meth:`AgentSession.navigate` in a worker so the screen stays live: while a
summary is being written a spinner runs, and Esc calls
:meth:`AgentSession.abort_branch_summary`, which leaves history and leaf as they were (D22); the
picker then stays open. A successful navigation closes the picker; the selected user message's
text goes back into the editor only when the editor is empty, so a draft is never lost.
Navigating starts no reply.

All the decisions are the runtime's; this module only shows state and forwards keys. The picker's
own mode is one enum, not a set of flags.
"""

from __future__ import annotations

import enum
from typing import Any

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from ._cli_inspect import describe_entry, tree_rows
from ._entries import Entry, role_of, text_of
from ._errors import ModelError, OrchestratorError, SessionError
from ._events import Event
from ._navigation import navigation_target
from ._runtime import AgentSession
from ._runtime_nav import NavigationResult
from ._runtime_types import TurnResult
from ._session import Session

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
        return str(entry.get("summary", ""))
    return describe_entry(entry)


def picker_rows(session: Session, *, show_all: bool = False) -> list[dict[str, Any]]:
    """The picker's rows: ``tree_rows`` without bookkeeping entries unless ``show_all``.

    Labels, ``custom`` entries (the position markers the commands write, for one) and session
    info are not places anyone wants to go back to, so, like pi's default filter, I hide them.
    ``current`` marks the leaf, or its nearest shown ancestor when the leaf itself is hidden.
    """
    rows = [r for r in tree_rows(session) if show_all or r["type"] not in HIDDEN]
    shown = {r["id"] for r in rows}
    current = next((e["id"] for e in reversed(session.path()) if e["id"] in shown), None)
    return [{**r, "current": r["id"] == current} for r in rows]


def row_content(row: dict[str, Any]) -> Content:
    """One picker line: marker, indentation, label and description."""
    if row["current"]:
        marker, style = "● ", "bold $success"
    elif row["onActivePath"]:
        marker, style = "│ ", "bold"
    else:
        marker, style = "  ", "dim"
    label = (f"[{row['label']}] ", "bold $warning") if row["label"] else ("", "")
    return Content.assemble((marker, "$success"), "  " * row["depth"], label, (row["text"], style))


class TreePicker(ModalScreen[NavigationResult | None]):
    """The ``/tree`` selector: dismissed with the navigation's result, or ``None`` on Esc."""

    DEFAULT_CSS = """
    TreePicker { align: center middle; }
    #picker { width: 96%; height: 92%; border: round $accent; background: $surface; }
    #rows { width: 3fr; height: 1fr; border: none; }
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

    def __init__(self, runtime: AgentSession) -> None:
        super().__init__()
        self.runtime = runtime
        self.summarize = False
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
            yield Input(placeholder="Focus for the branch summary (Enter: summarize and go, "
                                    "Esc: back)", id="instructions")
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
        self.query_one("#picker-status", Static).update(text)

    @on(OptionList.OptionHighlighted, "#rows")
    def _preview(self, event: OptionList.OptionHighlighted) -> None:
        row = self._rows[event.option_index]
        tree = self.runtime.session.tree
        entry = tree.get(row["id"])
        where = ("the current position" if row["current"] else
                 "on the active path" if row["onActivePath"] else "on another branch")
        if navigation_target(tree, row["id"]).editor_text is not None:
            effect = ("Enter: go back to just before this message; its text returns to an "
                      "empty editor")
        else:
            effect = "Enter: continue from here (this entry becomes the leaf)"
        lines = [f"{row['id']} · {entry.get('type')} · {where}"]
        if row["label"]:
            lines.append(f"label: {row['label']}")
        lines += [effect, "", entry_text(entry)]
        self.query_one("#preview", Static).update("\n".join(lines))

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
            name="navigate", exclusive=True, exit_on_error=False,
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


class TreeApp(App[None]):
    """The navigator: the active path, a status line, the editor, and the ``/tree`` picker.

    Args:
        runtime: The agent session to browse and navigate.
        open_tree: Open the picker at start (the command does; the user came for the tree).
    """

    TITLE = "orchestrator tree"
    CSS = """
    #transcript-box { height: 1fr; padding: 0 1; }
    #status { height: auto; padding: 0 1; background: $boost; }
    """
    BINDINGS = [
        Binding("ctrl+t", "open_tree", "Tree"),
        Binding("escape", "abort", "Abort the turn"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, runtime: AgentSession, *, open_tree: bool = True) -> None:
        super().__init__()
        self.runtime = runtime
        self.status_text = ""
        self._open_at_start = open_tree

    def compose(self) -> ComposeResult:
        """Transcript, status, editor, footer."""
        with VerticalScroll(id="transcript-box"):
            yield Static(id="transcript", markup=False)
        yield Static(id="status", markup=False)
        yield Input(placeholder="Message (/tree to navigate)", id="editor")
        yield Footer()

    def on_mount(self) -> None:
        """Show the active path; open the picker if asked."""
        self.sub_title = self.runtime.session.tree.session_name() or self.runtime.session.session_id
        self._show_path()
        self.set_status("Ctrl+T or /tree: navigate the session tree")
        if self._open_at_start:
            self.action_open_tree()

    @property
    def editor(self) -> Input:
        """The editor line."""
        return self.query_one("#editor", Input)

    def set_status(self, text: str) -> None:
        """Replace the status line (kept in :attr:`status_text` as plain text)."""
        self.status_text = text
        self.query_one("#status", Static).update(text)

    def _show_path(self) -> None:
        path = self.runtime.session.path()
        lines = [f"{role_of(e) or str(e['type']).replace('_', ' ')}: {entry_text(e)}"
                 for e in path if role_of(e) is not None or
                 e.get("type") in ("compaction", "branch_summary")]
        text = "\n\n".join(lines) or "(empty context: the next message starts a new root)"
        self.query_one("#transcript", Static).update(text)

    def action_open_tree(self) -> None:
        """Open the picker, unless the agent is working."""
        if self.runtime.is_busy:
            self.set_status(UNAVAILABLE)
            return
        self.push_screen(TreePicker(self.runtime), callback=self._picked)

    def action_abort(self) -> None:
        """Esc on the main screen: stop the running turn."""
        if self.runtime.is_busy:
            self.runtime.abort()
            self.set_status("Aborting the turn…")

    def _picked(self, result: NavigationResult | None) -> None:
        if result is None:
            self.set_status("Navigation cancelled; nothing changed")
            return
        self._show_path()
        if result.new_leaf_id == result.old_leaf_id and result.summary_entry is None:
            self.set_status("Already there; nothing changed")
            return
        if result.summary_entry is not None:
            notes = [f"Branch summary {result.summary_entry['id']} attached as the new leaf"]
        else:
            notes = [f"Moved to {result.new_leaf_id or 'the root'}"]
        if result.editor_text is not None:
            if self.editor.value:
                notes.append("the editor held a draft, so the message text was not restored")
            else:
                self.editor.value = result.editor_text
                notes.append("the message text is back in the editor")
        self.set_status("; ".join(notes) + ". The next message continues from here.")

    @on(Input.Submitted, "#editor")
    def _submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text == "/tree":
            self.editor.value = ""
            self.action_open_tree()
        elif self.runtime.agent is None:
            self.set_status("No agent is attached: the text stays in the editor")
        elif text:
            self.editor.value = ""
            self.set_status("The agent is working… (Esc: abort)")
            self.run_worker(self.runtime.prompt(text), name="prompt", exit_on_error=False)

    @on(Worker.StateChanged)
    def _prompted(self, event: Worker.StateChanged) -> None:
        if event.worker.name != "prompt" or event.state not in (WorkerState.SUCCESS,
                                                                  WorkerState.ERROR):
            return
        self._show_path()
        error, result = event.worker.error, event.worker.result
        if isinstance(error, OrchestratorError):
            self.set_status(f"The turn failed: {error}")
        elif not isinstance(result, TurnResult):
            raise error or TypeError(result)  # a bug, not an outcome: fail loudly
        else:
            self.set_status("Queued behind the running turn" if result.queued else "Ready")
