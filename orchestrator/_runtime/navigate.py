"""Tree navigation and forking for the runtime, through the navigation machine.

Navigation (as in pi, D17, D22): refused while a turn runs; the same position is a no-op;
``session_before_tree`` hooks may cancel or supply the summary (D25); when a summary is wanted
and the abandoned branch has entries, one branch-summary operation runs and its commit attaches
the summary at the new position; cancelling it leaves history and leaf as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator._core.branch_plan import collect_branch_entries, prepare_branch_entries
from orchestrator._core.entries import Entry
from orchestrator._core.errors import ModelError, SessionError
from orchestrator._core.summary_request import FALLBACK_CONTEXT_WINDOW
from orchestrator._lifecycle.guards import Facts
from orchestrator._lifecycle.machine import Runner, load_machine
from orchestrator._runtime.navigation import NavigationTarget, apply_navigation, navigation_target
from orchestrator._store.fork import branched_session, fork_target
from orchestrator._store.protocol import SessionStore
from orchestrator._store.session import Session

if TYPE_CHECKING:
    from orchestrator._runtime.session import AgentSession

BUSY = "Cannot navigate while the agent is working; wait for the turn to end or abort it"


@dataclass(frozen=True, slots=True, kw_only=True)
class NavigationResult:
    """What :meth:`AgentSession.navigate` did (pi's ``navigateTree`` result).

    Attributes:
        cancelled: A hook cancelled, or the summary was aborted.
        aborted: The branch summary was aborted (``abort_branch_summary``).
        editor_text: Text for the editor (the selected user message), else ``None``.
        new_leaf_id: The leaf afterwards.
        old_leaf_id: The leaf before.
        summary_entry: The attached branch summary, if any.
    """

    cancelled: bool = False
    aborted: bool = False
    editor_text: str | None = None
    new_leaf_id: str | None = None
    old_leaf_id: str | None = None
    summary_entry: Entry | None = None

    def as_json(self) -> dict[str, Any]:
        """The RPC form."""
        return {
            "cancelled": self.cancelled,
            "aborted": self.aborted,
            "editorText": self.editor_text,
            "newLeafId": self.new_leaf_id,
            "oldLeafId": self.old_leaf_id,
            "summaryEntryId": self.summary_entry["id"] if self.summary_entry else None,
        }


async def navigate(
    runtime: AgentSession,
    target_id: str,
    *,
    summarize: bool = False,
    instructions: str | None = None,
    replace_instructions: bool = False,
    label: str | None = None,
) -> NavigationResult:
    """Navigate the session tree (see :meth:`AgentSession.navigate`)."""
    if runtime.is_busy:
        raise SessionError(BUSY)
    session = runtime.session
    old_leaf = session.leaf_id
    target = navigation_target(session.tree, target_id)
    nav = Runner(load_machine("navigation"), observers=(runtime.observe_step,))
    if target_id == old_leaf:
        nav.fire("navigate", Facts(same_position=True))
        return NavigationResult(new_leaf_id=old_leaf, old_leaf_id=old_leaf)
    with runtime.tracer.navigation_span(session.session_id, target_id):
        nav.fire("navigate", Facts())
        entries, ancestor = collect_branch_entries(session.tree, old_leaf, target_id)
        nav.fire("collected")
        hook = await runtime.run_hook(
            "session_before_tree",
            {
                "type": "session_before_tree",
                "preparation": {
                    "targetId": target_id,
                    "oldLeafId": old_leaf,
                    "commonAncestorId": ancestor,
                    "entriesToSummarize": [e["id"] for e in entries],
                    "userWantsSummary": summarize,
                    "customInstructions": instructions,
                    "replaceInstructions": replace_instructions,
                    "label": label,
                },
            },
        )
        if hook and hook.get("cancel"):
            nav.fire("hooks_cancelled")
            return NavigationResult(cancelled=True, new_leaf_id=old_leaf, old_leaf_id=old_leaf)
        if hook:
            instructions = hook.get("customInstructions", instructions)
            replace_instructions = bool(hook.get("replaceInstructions", replace_instructions))
            label = hook.get("label", label)
        facts = Facts(wants_summary=summarize, has_entries=bool(entries))
        supplied = hook.get("summary") if hook else None
        if isinstance(supplied, dict) and isinstance(supplied.get("summary"), str):
            step = nav.fire("hook_supplied", facts)
            summary_entry = None
            if "switch_leaf_with_summary" in step.effects:
                summary_entry = apply_navigation(
                    session,
                    target,
                    old_leaf_id=old_leaf,
                    summary=supplied["summary"],
                    details=supplied.get("details"),
                    from_extension=True,
                )
            else:
                apply_navigation(session, target, old_leaf_id=old_leaf)
            return await _finish(runtime, nav, target, old_leaf, summary_entry, label, True)
        step = nav.fire("hooks_done", facts)
        if "start_summary" not in step.effects:
            apply_navigation(session, target, old_leaf_id=old_leaf)
            nav.fire("switched")
            return await _finish(runtime, nav, target, old_leaf, None, label, False)
        budget = max(1, _window(runtime) - runtime.settings.branch_reserve_tokens)
        plan = prepare_branch_entries(
            entries, budget, old_leaf_id=old_leaf, target_id=target_id, common_ancestor_id=ancestor
        )
        outcome = await runtime.operations.branch_summary(
            plan,
            new_leaf_id=target.new_leaf_id,
            old_leaf_id=old_leaf,
            instructions=instructions,
            replace_instructions=replace_instructions,
        )
        if outcome.status == "cancelled":
            nav.fire("summary_cancelled")
            return NavigationResult(
                cancelled=True, aborted=True, new_leaf_id=old_leaf, old_leaf_id=old_leaf
            )
        if outcome.status != "committed":
            nav.fire("summary_failed")
            raise ModelError(
                outcome.error or "Branch summarization failed",
                kind=outcome.error_kind or "fatal",
                retry_after=outcome.retry_after,
            )
        nav.fire("summary_committed")
        return await _finish(
            runtime, nav, target, old_leaf, outcome.entry, label, False, switched=True
        )


def _window(runtime: AgentSession) -> int:
    candidates = runtime.summarizer.candidates
    window = candidates[0].context_window if candidates else 0
    return window or FALLBACK_CONTEXT_WINDOW


async def _finish(
    runtime: AgentSession,
    nav: Runner,
    target: NavigationTarget,
    old_leaf: str | None,
    summary_entry: Entry | None,
    label: str | None,
    from_extension: bool,
    *,
    switched: bool = False,
) -> NavigationResult:
    if nav.state == "switching_leaf" and not switched:
        nav.fire("switched")
    session = runtime.session
    if label:
        # pi labels the summary entry when there is one, else the target (PM navigateTree).
        # Like pi, the label entry is a child of the new leaf (it moves the leaf; labels are
        # never in the context, so what the model sees is unchanged).
        session.append_label(summary_entry["id"] if summary_entry else target.target_id, label)
    payload = {
        "type": "session_tree",
        "newLeafId": session.leaf_id,
        "oldLeafId": old_leaf,
        "summaryEntry": summary_entry,
        "fromExtension": from_extension if summary_entry else None,
    }
    await runtime.run_hook("session_tree", payload)
    runtime.events.emit(
        "session_tree",
        newLeafId=session.leaf_id,
        oldLeafId=old_leaf,
        summaryEntryId=summary_entry["id"] if summary_entry else None,
    )
    return NavigationResult(
        editor_text=target.editor_text,
        new_leaf_id=session.leaf_id,
        old_leaf_id=old_leaf,
        summary_entry=summary_entry,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkResult:
    """What :meth:`AgentSession.fork` did.

    Attributes:
        cancelled: A ``session_before_fork`` hook cancelled it.
        session: The new session (``None`` when cancelled).
        editor_text: The forked user message's text, for the editor.
    """

    cancelled: bool = False
    session: Session | None = None
    editor_text: str = ""


async def fork(runtime: AgentSession, entry_id: str, store: SessionStore) -> ForkResult:
    """Fork the path before a user message into a new session (pi's fork)."""
    leaf, editor_text = fork_target(runtime.session, entry_id)
    hook = await runtime.run_hook(
        "session_before_fork", {"type": "session_before_fork", "entryId": entry_id}
    )
    if hook and hook.get("cancel"):
        return ForkResult(cancelled=True, editor_text=editor_text)
    new = branched_session(runtime.session, leaf, store)
    await runtime.run_hook(
        "session_fork",
        {"type": "session_fork", "previousSessionFile": runtime.session.store.location},
    )
    runtime.events.emit(
        "session_fork",
        previousSessionFile=runtime.session.store.location,
        newSessionFile=store.location,
        entryId=entry_id,
    )
    return ForkResult(session=new, editor_text=editor_text)
