"""The shipped tables: the main stories walked with bare asserts, and their rendering."""

import pytest

from orchestrator._core.errors import TransitionError
from orchestrator._lifecycle.guards import (
    EFFECTS,
    GUARDS,
    NO_NAVIGATION_FACTS,
    NO_TURN_FACTS,
    NavigationFacts,
    OperationFacts,
    SessionFacts,
    TurnFacts,
)
from orchestrator._lifecycle.machine import Runner, load_machine, shipped_machines
from orchestrator._lifecycle.render import guard_label, render_mermaid


def runner(name: str, state: str | None = None) -> Runner:
    return Runner(load_machine(name), state=state)


def test_the_four_machines_ship() -> None:
    assert shipped_machines() == ("navigation", "operation", "session", "turn")


# --- turn -----------------------------------------------------------------------------------


def test_threshold_path_prunes_compacts_and_auto_continues_once() -> None:
    turn = runner("turn")
    assert turn.fire("user_prompt").effects == ("start_turn", "call_agent")
    over = TurnFacts(over_threshold=True)
    # A reply ends any retry streak (D21): the row says so, not the agent's effect.
    assert turn.fire("agent_done", over).effects == ("end_retry_streak", "prune_tool_outputs")
    assert turn.state == "pruning"
    assert turn.fire("pruned", over).effects == ("start_threshold_compaction",)
    assert turn.state == "compacting"
    done = turn.fire("compaction_done", TurnFacts(auto_continue=True))
    assert (done.dest, done.effects) == (
        "continuing",
        ("emit_compaction_end", "append_continue_message", "resume_turn"),  # D20
    )
    assert turn.fire("resume").effects == ("call_agent",)
    # D19: still over the threshold in the same turn, but no second automatic compaction.
    again = turn.fire("agent_done", TurnFacts(over_threshold=True, auto_compactions=1))
    assert (again.dest, again.effects) == ("idle", ("end_retry_streak",))


def test_under_the_threshold_the_turn_just_ends() -> None:
    turn = runner("turn", "running")
    assert turn.fire("agent_done", NO_TURN_FACTS).dest == "idle"


def test_pruning_alone_can_be_enough() -> None:
    turn = runner("turn", "pruning")
    assert turn.fire("pruned", TurnFacts(over_threshold=False)).dest == "idle"


def test_threshold_compaction_without_auto_continue_ends_the_turn() -> None:
    turn = runner("turn", "compacting")
    step = turn.fire("compaction_done", TurnFacts(auto_continue=False))
    assert (step.dest, step.effects) == ("idle", ("emit_compaction_end",))


def test_compaction_disabled_means_no_automatic_path() -> None:
    off = TurnFacts(compaction_enabled=False, over_threshold=True, context_full=True)
    for event, effects in (
        ("agent_done", ("end_retry_streak",)),
        ("overflow", ()),
        ("reply_truncated", ("end_retry_streak",)),
    ):
        turn = runner("turn", "running")
        step = turn.fire(event, off)
        assert (step.dest, step.effects) == ("idle", effects)


def test_overflow_recovers_once_then_fails() -> None:
    turn = runner("turn")
    turn.fire("user_prompt")
    first = turn.fire("overflow", NO_TURN_FACTS)
    assert (first.dest, first.effects) == (
        "compacting",
        ("omit_failed_attempt", "start_overflow_compaction"),
    )
    retry = turn.fire("compaction_done", TurnFacts(will_retry=True, auto_continue=False))
    assert (retry.dest, retry.effects) == ("continuing", ("emit_compaction_end", "resume_turn"))
    turn.fire("resume")
    second = turn.fire("overflow", TurnFacts(overflow_attempted=True))
    assert (second.dest, second.effects) == ("idle", ("emit_overflow_failed",))


def test_a_length_stop_with_a_full_context_is_an_overflow() -> None:
    turn = runner("turn", "running")
    step = turn.fire("reply_truncated", TurnFacts(context_full=True))
    assert step.effects == ("end_retry_streak", "omit_failed_attempt", "start_overflow_compaction")
    turn = runner("turn", "running")
    step = turn.fire("reply_truncated", TurnFacts(context_full=True, overflow_attempted=True))
    assert (step.dest, step.effects) == ("idle", ("end_retry_streak", "emit_overflow_failed"))


def test_a_length_stop_without_a_full_context_is_a_plain_reply() -> None:
    turn = runner("turn", "running")
    assert turn.fire("reply_truncated", NO_TURN_FACTS).dest == "idle"
    turn = runner("turn", "running")
    assert turn.fire("reply_truncated", TurnFacts(over_threshold=True)).dest == "pruning"


def test_failed_compactions_say_which_kind_failed() -> None:
    overflow = runner("turn", "compacting").fire("compaction_failed", TurnFacts(will_retry=True))
    assert overflow.effects == ("emit_recovery_failed",)
    threshold = runner("turn", "compacting").fire("compaction_failed", NO_TURN_FACTS)
    assert threshold.effects == ("emit_compaction_failed",)
    for event in ("compaction_cancelled", "compaction_skipped"):
        assert runner("turn", "compacting").fire(event).dest == "idle"


def test_transient_errors_retry_until_the_budget_runs_out() -> None:
    turn = runner("turn", "running")
    wait = turn.fire("transient_error", TurnFacts(retry_attempt=0, max_retries=2))
    assert (wait.dest, wait.effects) == (
        "retrying",
        ("emit_retry_start", "omit_failed_attempt", "sleep_retry"),
    )
    assert turn.fire("retry_wait_done").effects == ("call_agent",)
    turn.fire("transient_error", TurnFacts(retry_attempt=1, max_retries=2))
    turn.fire("retry_wait_done")
    out = turn.fire("transient_error", TurnFacts(retry_attempt=2, max_retries=2))
    assert (out.dest, out.effects) == ("idle", ("emit_retry_end",))


def test_aborting_the_retry_wait_cancels_only_the_wait() -> None:
    turn = runner("turn", "retrying")
    step = turn.fire("abort")
    assert (step.dest, step.effects) == ("idle", ("cancel_retry_wait", "emit_retry_end"))


def test_abort_stops_whatever_is_active() -> None:
    assert runner("turn", "running").fire("abort").effects == ("stop_agent",)
    compacting = runner("turn", "compacting").fire("abort")
    assert compacting.effects == ("cancel_compaction", "emit_compaction_aborted")
    for state in ("pruning", "continuing", "manual_compacting"):
        assert runner("turn", state).fire("abort").dest == "idle"


@pytest.mark.parametrize(
    ("state", "stop"),
    [
        ("idle", ()),
        ("running", ("stop_agent",)),
        ("retrying", ("cancel_retry_wait",)),
        ("compacting", ("cancel_compaction", "emit_compaction_aborted")),
        ("pruning", ()),
        ("continuing", ()),
    ],
)
def test_manual_compaction_stops_work_first_and_never_resumes(
    state: str, stop: tuple[str, ...]
) -> None:
    turn = runner("turn", state)
    step = turn.fire("manual_compact")
    assert (step.dest, step.effects) == ("manual_compacting", (*stop, "start_manual_compaction"))
    for event in ("compaction_done", "compaction_skipped", "compaction_failed"):
        manual = runner("turn", "manual_compacting")
        end = manual.fire(event, TurnFacts(will_retry=True, auto_continue=True))
        # D22: no resume, and a manual compaction emits no auto_compaction events (as in pi).
        assert (end.dest, end.effects) == ("idle", ("report_manual_result",))


def test_a_turn_cannot_start_while_one_runs() -> None:
    turn = runner("turn", "running")
    with pytest.raises(TransitionError, match="turn: can't user_prompt when in running"):
        turn.fire("user_prompt")
    assert turn.state == "running"


def test_closing_is_final() -> None:
    turn = runner("turn")
    assert turn.fire("close").effects == ("close_session",)
    assert turn.done
    assert turn.listed_events() == ()


# --- operation ------------------------------------------------------------------------------


def test_operation_happy_path_commits_one_entry() -> None:
    op = runner("operation")
    assert op.fire("prepared", OperationFacts(has_work=True)).effects == ("run_hooks",)
    assert op.fire("hooks_done").effects == ("call_model",)
    assert op.fire("summary_ready").effects == ("append_entry",)
    assert op.fire("entry_appended").effects == ("rebuild_context", "emit_result")
    assert op.state == "committed"
    assert op.done


def test_nothing_to_compact_is_skipped_without_a_model_call() -> None:
    op = runner("operation")
    step = op.fire("prepared", OperationFacts(has_work=False))
    assert (step.dest, step.effects) == ("skipped", ("emit_result",))


def test_hooks_can_cancel_or_supply_the_result() -> None:
    assert runner("operation", "consulting_hooks").fire("hooks_cancelled").dest == "cancelled"
    supplied = runner("operation", "consulting_hooks").fire("hook_supplied")
    assert (supplied.dest, supplied.effects) == ("committing", ("append_entry",))


def test_candidates_and_retries() -> None:
    op = runner("operation", "summarizing")
    short = OperationFacts(retryable=True, retry_attempt=0, delay_ms=2_000, more_candidates=True)
    assert op.fire("attempt_failed", short).dest == "waiting_retry"
    assert op.fire("wait_done").effects == ("call_model",)
    long = OperationFacts(retryable=True, retry_attempt=1, delay_ms=60_000, more_candidates=True)
    switch = op.fire("attempt_failed", long)
    assert (switch.dest, switch.effects) == ("summarizing", ("next_candidate", "call_model"))
    last = OperationFacts(retryable=True, retry_attempt=0, delay_ms=60_000, more_candidates=False)
    assert op.fire("attempt_failed", last).dest == "waiting_retry"
    op.fire("wait_done")
    spent = OperationFacts(retryable=True, retry_attempt=3, max_retries=3, more_candidates=False)
    assert op.fire("attempt_failed", spent).dest == "failed"


def test_a_fatal_error_moves_on_to_the_next_candidate() -> None:
    op = runner("operation", "summarizing")
    assert op.fire(
        "attempt_failed", OperationFacts(retryable=False, more_candidates=True)
    ).effects == (
        "next_candidate",
        "call_model",
    )
    assert op.fire("attempt_failed", OperationFacts(retryable=False)).dest == "failed"


def test_summarizer_overflow_halves_three_times_then_fails() -> None:
    op = runner("operation", "summarizing")
    for attempts in range(3):
        step = op.fire("summary_overflow", OperationFacts(shrink_attempts=attempts))
        assert step.effects == ("shrink_request", "call_model")
    assert op.fire("summary_overflow", OperationFacts(shrink_attempts=3)).dest == "failed"


@pytest.mark.parametrize("state", ["preparing", "consulting_hooks", "summarizing", "waiting_retry"])
def test_cancel_before_the_commit_applies_nothing(state: str) -> None:
    step = runner("operation", state).fire("cancel")
    assert (step.dest, step.effects) == ("cancelled", ("stop_work", "emit_result"))


def test_the_commit_itself_cannot_be_cancelled() -> None:
    op = runner("operation", "committing")
    with pytest.raises(TransitionError):
        op.fire("cancel")
    assert op.fire("append_failed").dest == "failed"


def test_a_half_done_operation_settles_on_reopen_without_a_model_call() -> None:
    for state in ("preparing", "consulting_hooks", "summarizing", "waiting_retry"):
        step = runner("operation", state).fire("reopened")
        assert (step.dest, step.effects) == ("cancelled", ())
    assert runner("operation", "committing").fire(
        "reopened", OperationFacts(entry_present=True)
    ).dest == ("committed")
    assert runner("operation", "committing").fire("reopened").dest == "failed"


# --- navigation -----------------------------------------------------------------------------


def test_navigating_to_the_current_leaf_does_nothing() -> None:
    nav = runner("navigation")
    step = nav.fire("navigate", NavigationFacts(same_position=True))
    assert (step.dest, step.effects) == ("done", ())


def test_navigation_without_a_summary() -> None:
    nav = runner("navigation")
    assert nav.fire("navigate").effects == ("collect_entries",)
    assert nav.fire("collected").effects == ("run_hooks",)
    assert nav.fire(
        "hooks_done", NavigationFacts(wants_summary=False, has_entries=True)
    ).effects == ("switch_leaf",)
    assert nav.fire("switched").effects == ("rebuild_context", "emit_session_tree")
    assert nav.state == "done"


def test_navigation_with_a_summary() -> None:
    nav = runner("navigation", "consulting_hooks")
    wants = NavigationFacts(wants_summary=True, has_entries=True)
    assert nav.fire("hooks_done", wants).effects == ("start_summary",)
    step = nav.fire("summary_committed")
    assert (step.dest, step.effects) == ("done", ("rebuild_context", "emit_session_tree"))


def test_a_summary_of_nothing_is_a_plain_move() -> None:
    nav = runner("navigation", "consulting_hooks")
    assert nav.fire("hooks_done", NavigationFacts(wants_summary=True, has_entries=False)).dest == (
        "switching_leaf"
    )
    assert runner("navigation", "summarizing").fire("summary_skipped").effects == ("switch_leaf",)


def test_a_hook_summary_is_used_only_when_asked_for() -> None:
    asked = runner("navigation", "consulting_hooks").fire(
        "hook_supplied", NavigationFacts(wants_summary=True)
    )
    assert asked.effects == ("switch_leaf_with_summary",)
    unasked = runner("navigation", "consulting_hooks").fire("hook_supplied", NO_NAVIGATION_FACTS)
    assert unasked.effects == ("switch_leaf",)


def test_navigation_cancel_paths_leave_the_session_untouched() -> None:
    assert runner("navigation", "consulting_hooks").fire("hooks_cancelled").dest == "cancelled"
    aborted = runner("navigation", "summarizing").fire("summary_cancelled")
    assert (aborted.dest, aborted.effects) == ("cancelled", ())
    esc = runner("navigation", "summarizing").fire("cancel")
    assert (esc.dest, esc.effects) == ("cancelled", ("cancel_summary",))
    for state in ("collecting", "consulting_hooks"):
        # Nothing is written yet; a handler still running is stopped (D22).
        assert runner("navigation", state).fire("cancel").effects == ("stop_hooks",)
    assert runner("navigation", "summarizing").fire("summary_failed").dest == "failed"


# --- the tables as a whole ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["turn", "operation", "navigation"])
def test_mermaid_draws_every_transition_and_every_final_state(name: str) -> None:
    defn = load_machine(name)
    lines = render_mermaid(defn).splitlines()
    assert lines[:2] == ["stateDiagram-v2", f"    [*] --> {defn.initial}"]
    for row in defn.rows:
        label = f"{row.event} [{guard_label(row)}]" if guard_label(row) else row.event
        for source in row.sources:
            assert f"    {source} --> {row.dest}: {label}" in lines
    for state in defn.final:
        assert f"    {state} --> [*]" in lines
    arrows = sum(len(row.sources) for row in defn.rows)
    assert len(lines) == 2 + arrows + len(defn.final)


@pytest.mark.parametrize("name", ["turn", "operation", "navigation", "session"])
def test_every_registered_effect_is_used_by_its_table(name: str) -> None:
    used = {effect for row in load_machine(name).rows for effect in row.effects}
    assert used == set(EFFECTS[name])


@pytest.mark.parametrize("name", shipped_machines())
def test_every_registered_guard_is_used_by_its_table(name: str) -> None:
    used = {guard for row in load_machine(name).rows for guard in (*row.guards, *row.unless)}
    assert used == set(GUARDS[name])
    assert load_machine(name).guards is GUARDS[name]


def test_every_machine_has_its_own_guard_registry() -> None:
    assert set(GUARDS) == set(shipped_machines()) == set(EFFECTS)
    for name, registry in GUARDS.items():
        assert registry.machine == name
        assert len(registry) == len(set(registry)) > 0
    assert GUARDS["session"].facts is SessionFacts
    assert repr(GUARDS["navigation"]) == (
        "GuardSet('navigation', NavigationFacts, "
        "['has_entries', 'same_position', 'turn_running', 'wants_summary'])"
    )
    # A name two machines share reads each machine's own record.
    assert GUARDS["turn"]["retries_left"](TurnFacts(retry_attempt=2, max_retries=2)) is False
    assert GUARDS["operation"]["retries_left"](OperationFacts(retry_attempt=1, max_retries=2))
