"""The tree navigator TUI: pick an entry of the session tree and move the active context there.

Theory of operation. The main screen shows the active path (what the model sees next), a status
line and the editor. ``/tree`` (typed in the editor) or Ctrl+T opens :class:`TreePicker`, a modal
over it, exactly when the session is idle: the runtime refuses navigation during a turn, and I
refuse to even open the picker then, with the same advice ("/tree is unavailable while
the agent works").

In the picker, Up/Down choose an entry and the preview shows its full text and what Enter would
do; ``s`` toggles "summarize the branch I leave", ``c`` asks for focus instructions and then
summarizes with them (pi's three choices: no summary, summarize, summarize with a custom
prompt). Enter runs :meth:`AgentSession.navigate` in a worker so the screen stays live: while a
summary is being written a spinner runs, and Esc calls
:meth:`AgentSession.abort_branch_summary`, which leaves history and leaf as they were (D22); the
picker then stays open. A successful navigation closes the picker; the selected user message's
text goes back into the editor only when the editor is empty, so a draft is never lost.
Navigating starts no reply. However the picker closes, the editor has the focus again, and the
summary choice is kept for the next time the picker opens.

Rows show the tree's branches with connectors (``├─``, ``└─``, ``│``), drawn as ``tree`` draws
them, and never wrap: a long row is cut with ``…`` (a wrapped row continued without its
active-path marker); the preview has the full text.

All the decisions are the runtime's; this module only shows state and forwards keys. The picker's
own mode is one enum, not a set of flags.
"""

from __future__ import annotations

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Input, Static
from textual.worker import Worker, WorkerState

from orchestrator._core.entries import role_of
from orchestrator._core.errors import OrchestratorError
from orchestrator._core.printable import terminal_safe
from orchestrator._runtime.navigation.driver import NavigationResult
from orchestrator._runtime.session import AgentSession
from orchestrator._runtime.types import TurnResult
from orchestrator._tui.picker import UNAVAILABLE, TreePicker, entry_text


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
        self.summarize = False  # the picker's "summarize the branch I leave", kept between opens
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
        self.query_one("#status", Static).update(terminal_safe(text))

    def _show_path(self) -> None:
        path = self.runtime.session.path()
        lines = [
            f"{role_of(e) or str(e['type']).replace('_', ' ')}: {entry_text(e)}"
            for e in path
            if role_of(e) is not None or e.get("type") in ("compaction", "branch_summary")
        ]
        text = "\n\n".join(lines) or "(empty context: the next message starts a new root)"
        self.query_one("#transcript", Static).update(terminal_safe(text))
        # The active position is the path's end (a new branch summary, the latest reply): follow
        # it, or after a navigation the user would be looking at the top of an old transcript.
        # scroll_end waits for the refresh, so it sees the new text's height.
        self.query_one("#transcript-box", VerticalScroll).scroll_end(animate=False)

    def action_open_tree(self) -> None:
        """Open the picker, unless the agent is working."""
        if self.runtime.is_busy:
            self.set_status(UNAVAILABLE)
            return
        picker = TreePicker(self.runtime, summarize=self.summarize)
        self.push_screen(picker, callback=lambda result: self._picked(picker, result))

    def action_abort(self) -> None:
        """Esc on the main screen: stop the running turn."""
        if self.runtime.is_busy:
            self.runtime.abort()
            self.set_status("Aborting the turn…")

    def _picked(self, picker: TreePicker, result: NavigationResult | None) -> None:
        self.summarize = picker.summarize
        # The editor takes the keys again: after the picker opened at start, nothing had focus
        # and what the user typed next was dropped.
        self.editor.focus()
        if result is None:
            self.set_status("Navigation cancelled; nothing changed")
            return
        self._show_path()
        if result.new_leaf_id == result.old_leaf_id and result.summary_entry is None:
            self.set_status("Already there; nothing changed")
            return
        if result.summary_entry is not None:
            notes = [f"Branch summary {result.summary_entry['id']} attached as the new leaf"]
            short = result.summary_entry.get("shortSummary")
            notes += [f"in short: {short}"] if short else []
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
        if event.worker.name != "prompt" or event.state not in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
        ):
            return
        self._show_path()
        error, result = event.worker.error, event.worker.result
        if isinstance(error, OrchestratorError):
            self.set_status(f"The turn failed: {error}")
        elif not isinstance(result, TurnResult):
            raise error or TypeError(result)  # a bug, not an outcome: fail loudly
        else:
            self.set_status("Queued behind the running turn" if result.queued else "Ready")
