import re
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._core.errors import ModelError
from orchestrator._core.model import Model, ModelRequest, ModelResponse, Purpose
from orchestrator._core.prompts import render
from orchestrator._core.summary_request import (
    branch_request,
    history_request,
    merge_split_turn,
    short_summary_request,
    turn_prefix_request,
    upsert_file_tags,
)
from orchestrator._models.offline import NOTE, OfflineSummarizer, summarize
from orchestrator._models.offline_evidence import _paragraphs

ERROR_LINE = "E   AssertionError: expected 200, got 401"

Message = dict[str, Any]


def call(call_id: str, name: str, **arguments: Any) -> Message:
    return {"type": "toolCall", "id": call_id, "name": name, "arguments": arguments}


def result(call_id: str, text: str) -> Message:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "x",
        "content": [{"type": "text", "text": text}],
        "isError": False,
    }


def assistant(*blocks: Message) -> Message:
    return {"role": "assistant", "content": list(blocks), "stopReason": "toolUse"}


def text(value: str) -> Message:
    return {"type": "text", "text": value}


SESSION = [
    {
        "role": "user",
        "content": "Fix the failing login test in src/auth/login.py. "
        "You must not change the public API. Please use pytest.",
    },
    assistant(text("I'll read the file first."), call("c1", "read", path="src/auth/login.py")),
    result("c1", "def login():\n    raise ValueError('not an error of the session')"),
    assistant(call("c2", "bash", command="pytest -q; echo done")),
    result("c2", f"{ERROR_LINE}\n1 failed"),
    assistant(
        text("Decided to patch the token check instead of the fixture."),
        call("c3", "edit", path="src/auth/tokens.py", old="a", new="b"),
    ),
    result("c3", "ok"),
    assistant(call("c4", "read", path="docs/AUTH.md")),
    result("c4", "# Auth"),
    {"role": "user", "content": "Now also update docs/AUTH.md?"},
]

SECTIONS = [
    "## Goal",
    "## Constraints & Preferences",
    "## Progress",
    "### Done",
    "### In Progress",
    "### Blocked",
    "## Key Decisions",
    "## Next Steps",
    "## Critical Context",
]


def run(request: ModelRequest) -> ModelResponse:
    response = anyio.run(OfflineSummarizer().complete, request)
    assert response.stop_reason == "stop"
    assert response.text.strip()
    return response


def section(summary: str, heading: str) -> str:
    body = summary.split(heading + "\n", 1)[1]
    return body.split("\n## ", 1)[0]


def test_it_is_a_model() -> None:
    model = OfflineSummarizer()
    assert isinstance(model, Model)
    assert model.name == "offline/extractive"
    assert model.context_window >= 1_000_000


def test_history_summary_has_every_section_in_order() -> None:
    summary = run(history_request(SESSION, reserve_tokens=16384)).text
    assert summary.startswith(NOTE + "\n\n## Goal\n")
    positions = [summary.index(h + "\n") for h in SECTIONS]
    assert positions == sorted(positions)


def test_history_summary_keeps_exact_facts() -> None:
    summary = run(history_request(SESSION, reserve_tokens=16384)).text
    goal = section(summary, "## Goal")
    # The goal is the request whole; its rules are also listed under Constraints.
    assert goal.startswith(
        "- Fix the failing login test in src/auth/login.py. You must not change the public API. "
        "Please use pytest.\n"
    )
    assert "- Latest request: Now also update docs/AUTH.md?" in goal
    rules = section(summary, "## Constraints & Preferences")
    assert "- You must not change the public API." in rules
    assert "- Please use pytest." in rules
    done = section(summary, "## Progress").split("### In Progress")[0]
    assert "- [x] edit `src/auth/tokens.py`" in done
    assert "read `" not in done  # reads are inputs: they are listed under Files read
    blocked = section(summary, "## Progress").split("### Blocked\n")[1]
    assert "- Ran `pytest -q; echo done` failed" in blocked
    assert "Decided to patch the token check instead of the fixture." in section(
        summary, "## Key Decisions"
    )
    steps = section(summary, "## Next Steps")
    assert steps.startswith("1. Answer the user's pending message: Now also update docs/AUTH.md?")
    critical = section(summary, "## Critical Context")
    assert "- Files read: `docs/AUTH.md`, `src/auth/login.py`" in critical
    assert "- Files modified: `src/auth/tokens.py`" in critical
    assert f"- Error seen: {ERROR_LINE}" in critical
    assert "not an error of the session" not in summary  # file contents are not errors
    assert "- Unanswered (verbatim): Now also update docs/AUTH.md?" in critical


def test_it_is_deterministic() -> None:
    request = history_request(SESSION, reserve_tokens=16384, previous_summary="## Goal\nG")
    assert summarize(request) == summarize(request)
    assert run(request).text == summarize(request)


def test_update_merges_the_previous_summary() -> None:
    previous = run(history_request(SESSION[:3], reserve_tokens=16384)).text
    previous += "\n\n<read-files>\nsrc/auth/login.py\n</read-files>"
    later = [
        {"role": "user", "content": "Never touch the CI config."},
        assistant(call("c9", "write", path="NOTES.md", content="x")),
        result("c9", "written"),
    ]
    summary = run(history_request(later, reserve_tokens=16384, previous_summary=previous)).text
    assert summary.count(NOTE) == 1
    assert "<read-files>" not in summary
    goal = section(summary, "## Goal")
    assert goal.startswith(
        "- Fix the failing login test in src/auth/login.py. You must not change the public API. "
        "Please use pytest.\n"
    )
    assert "- Latest request: Never touch the CI config." in goal
    rules = section(summary, "## Constraints & Preferences")
    assert "- You must not change the public API." in rules
    assert "- Never touch the CI config." in rules
    done = section(summary, "## Progress")
    assert "- [x] write `NOTES.md`" in done
    assert "- Files read: `src/auth/login.py`" in section(summary, "## Critical Context")
    # Next Steps is rewritten from the new messages, never carried over.
    steps = section(summary, "## Next Steps")
    assert "Fix the failing login test" not in steps
    assert "Never touch the CI config." in steps


def test_previous_summary_items_are_not_duplicated() -> None:
    previous = run(history_request(SESSION, reserve_tokens=16384)).text
    summary = run(history_request(SESSION, reserve_tokens=16384, previous_summary=previous)).text
    assert summary.count("- [x] edit `src/auth/tokens.py`") == 1
    assert summary.count("- You must not change the public API.") == 1


def test_additional_context_and_focus_reach_critical_context() -> None:
    request = history_request(
        SESSION, reserve_tokens=16384, additional_context=["branch main"], focus="the tokens"
    )
    critical = section(summary := run(request).text, "## Critical Context")
    assert "- branch main" in critical
    assert "- Requested focus: the tokens" in critical
    assert summary


def test_turn_prefix_sections() -> None:
    summary = run(turn_prefix_request(SESSION[:5], reserve_tokens=16384)).text
    assert summary.startswith(NOTE)
    for heading in ("## Original Request", "## Early Progress", "## Context for Suffix"):
        assert summary.count(heading) == 1
    assert "Fix the failing login test" in section(summary, "## Original Request")
    assert "(failed)" in section(summary, "## Early Progress")
    assert ERROR_LINE in section(summary, "## Context for Suffix")


def test_short_summary_is_one_or_two_first_person_sentences_without_the_banner() -> None:
    history = run(history_request(SESSION, reserve_tokens=16384)).text
    response = run(short_summary_request(SESSION[-1:], summary=history, reserve_tokens=16384))
    assert response.text == (
        'I changed `src/auth/tokens.py` while working on "Fix the failing login test in '
        'src/auth/login.py. You must not change the public API. Please use pytest". '
        'Still open: the user\'s message "Now also update docs/AUTH.md?".'
    )
    assert NOTE not in response.text
    assert "\n" not in response.text


def test_short_summary_says_the_last_thing_done_when_nothing_is_open() -> None:
    messages = [
        {"role": "user", "content": "Add a changelog entry."},
        assistant(call("w", "write", path="CHANGELOG.md", content="x")),
        result("w", "Wrote 10 bytes"),
        assistant(text("The entry is written.")),
    ]
    history = run(history_request(messages, reserve_tokens=16384)).text
    short = run(short_summary_request(messages[-1:], summary=history, reserve_tokens=16384)).text
    assert short == (
        'I changed `CHANGELOG.md` while working on "Add a changelog entry". '
        "Last done: write `CHANGELOG.md`."
    )
    nothing = run(short_summary_request([], summary="", reserve_tokens=16384)).text
    assert nothing == "I have not changed any files yet."


def test_branch_summary_has_every_section_and_honours_the_focus() -> None:
    summary = run(branch_request(SESSION, instructions="the token check")).text
    positions = [summary.index(h + "\n") for h in SECTIONS]
    assert positions == sorted(positions)
    critical = section(summary, "## Critical Context")
    assert "- Requested focus: the token check\n" in critical
    assert (
        "- On the focus (verbatim): Decided to patch the token check instead of the fixture.\n"
        in critical
    )
    assert "- Unanswered (verbatim): Now also update docs/AUTH.md?" in critical


def test_a_focus_nothing_mentions_is_said_so() -> None:
    summary = run(branch_request(SESSION, instructions="the billing currency")).text
    critical = section(summary, "## Critical Context")
    assert (
        "- Requested focus: the billing currency (nothing in the summarized messages mentions it)"
        in critical
    )
    assert "On the focus" not in summary


def test_focus_lines_are_not_carried_into_the_next_update() -> None:
    previous = run(history_request(SESSION, reserve_tokens=16384, focus="the token check")).text
    assert "On the focus (verbatim)" in previous
    summary = update([assistant(text("Finished."))], previous=previous)
    assert "focus" not in summary


def test_replacement_instructions_are_refused_not_ignored() -> None:
    request = branch_request(SESSION, instructions="Write a haiku.", replace=True)
    with pytest.raises(ModelError, match="cannot follow replacement instructions") as caught:
        anyio.run(OfflineSummarizer().complete, request)
    assert caught.value.kind == "fatal"


def test_output_fits_the_budget_and_says_what_was_left_out() -> None:
    many = []
    for i in range(60):
        many.append(assistant(call(f"c{i}", "edit", path=f"src/module_{i:02}.py")))
        many.append(result(f"c{i}", "ok"))
    request = history_request(many, reserve_tokens=800)
    response = run(request)
    assert len(response.text) <= request.max_tokens * 4
    assert "more items omitted)" in response.text
    assert "src/module_59.py" in response.text  # the newest work is what stays


def test_chat_requests_are_refused() -> None:
    request = ModelRequest(purpose="chat", system="", messages=(), max_tokens=10)
    with pytest.raises(ModelError) as caught:
        anyio.run(OfflineSummarizer().complete, request)
    assert caught.value.kind == "fatal"


def test_a_request_without_conversation_still_answers() -> None:
    request = ModelRequest(
        purpose="history",
        system="",
        messages=({"role": "user", "content": "no tags here"},),
        max_tokens=100,
    )
    assert summarize(request).startswith(NOTE)


def test_embedded_compaction_summary_is_merged_not_quoted_as_a_request() -> None:
    messages: list[Message] = [
        {"role": "compactionSummary", "summary": "## Goal\n- Old goal", "tokensBefore": 5},
        {"role": "user", "content": "continue please"},
    ]
    summary = run(branch_request(messages)).text
    goal = section(summary, "## Goal")
    assert goal.startswith("- Old goal\n- Latest request: continue please\n")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(lambda t: {"role": "user", "content": t}, st.text(min_size=1)),
            st.builds(lambda t: assistant(text(t)), st.text(min_size=1)),
            st.builds(lambda t: result("z", t), st.text(min_size=1)),
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["history", "turn_prefix", "short", "branch"]),
)
def test_never_empty_and_always_within_budget(messages: list[Message], purpose: str) -> None:
    builders = {
        "history": lambda: history_request(messages, reserve_tokens=2000),
        "turn_prefix": lambda: turn_prefix_request(messages, reserve_tokens=2000),
        "short": lambda: short_summary_request(messages, summary="S", reserve_tokens=2000),
        "branch": lambda: branch_request(messages),
    }
    request = builders[purpose]()
    out = summarize(request)
    assert out.strip()
    assert out.startswith(NOTE) != (purpose == "short")  # the one-line summary has no banner
    assert len(out) <= request.max_tokens * 4


def _raw(conversation: str, purpose: Purpose = "history", max_tokens: int = 4000) -> ModelRequest:
    prompt = f"<conversation>\n{conversation}\n</conversation>\n\nSummarize."
    return ModelRequest(
        purpose=purpose,
        system="",
        messages=({"role": "user", "content": prompt},),
        max_tokens=max_tokens,
    )


def test_failed_shell_runs_are_blocked_with_their_errors() -> None:
    bash = {
        "role": "bashExecution",
        "command": "make build",
        "output": "fatal: no rule",
        "exitCode": 2,
        "cancelled": False,
        "truncated": False,
    }
    summary = run(history_request([bash], reserve_tokens=16384)).text
    assert "- Ran `make build` failed" in section(summary, "## Progress").split("### Blocked")[1]
    assert "- Error seen: fatal: no rule" in summary
    assert "- Error seen: Command exited with code 2" in summary
    assert section(summary, "## Goal").startswith("(none)")


def test_hand_written_calls_and_thinking_are_read_leniently() -> None:
    conversation = (
        "[User]: go\n\n[Assistant thinking]: hmm\n\n"
        '[Assistant tool calls]: read(path=not-json); write(path="")\n\n'
        "[Tool result]: text\n\n[Tool result]: ok"
    )
    summary = summarize(_raw(conversation))
    assert '- [x] write(path="")' in summary  # no usable path: the call is quoted
    assert "- Files read: `not-json`" in summary
    assert "hmm" not in summary


def test_a_tiny_budget_still_gets_a_cut_answer() -> None:
    summary = summarize(_raw("[User]: " + "word " * 500, max_tokens=30))
    assert summary.startswith(NOTE)
    assert summary.endswith("…")
    assert len(summary) == 120


# -- quality: what the README's example showed, and what other sessions showed ----------------

PI_PREAMBLE = (
    "The user explored a different direction before returning here. Summary of that exploration:"
)
BRANCH_BODY = (
    "## Goal\nAdd a VAT rounding regression test.\n\n## Progress\n### Done\n"
    "- [x] Wrote tests/test_tax_rounding.py\n### Blocked\n"
    "- Switching invoice/tax.py to integer cents broke the Decimal API\n\n## Key Decisions\n"
    "- **Abandoned integer cents**: it would change public signatures\n\n"
    "<modified-files>\ninvoice/tax.py\n</modified-files>"
)
PREVIOUS = (
    "## Goal\nFix the one-cent rounding bug in invoice totals (invoice/totals.py).\n\n"
    "## Constraints & Preferences\n- Never change public function signatures\n\n"
    "## Progress\n### Done\n- [x] Changed invoice/totals.py to round once at the end\n"
    "### In Progress\n- [ ] Check invoice/tax.py for the same problem\n"
    "- [ ] Update the changelog\n\n## Next Steps\n1. Fix tax.py the same way\n\n"
    "## Critical Context\n- Failing test: tests/test_totals.py:41"
)


def branch_summary(preamble: str = PI_PREAMBLE, body: str = BRANCH_BODY) -> Message:
    return {"role": "branchSummary", "summary": f"{preamble}\n\n{body}", "fromId": "f"}


def tax_fix(test_output: str = "52 passed in 1.48s") -> list[Message]:
    """The README example's kept turn: a request, an edit, a test run, an answer."""
    return [
        {
            "role": "user",
            "content": "Good. Now also look at invoice/tax.py, I think the VAT "
            "calculation has the same problem.",
        },
        assistant(text("Reading the tax module."), call("t1", "read", path="invoice/tax.py")),
        result("t1", "def vat_for_lines(lines): ..."),
        assistant(
            call("t2", "edit", path="invoice/tax.py", oldText="a", newText="b"),
            call("t3", "bash", command="python -m pytest -q"),
        ),
        result("t2", "Successfully replaced text in invoice/tax.py."),
        result("t3", "....\n" + test_output),
        assistant(text("Both fixes are in and the full suite passes (52 tests).")),
    ]


def update(messages: list[Message], previous: str | None = PREVIOUS, **kwargs: Any) -> str:
    return run(
        history_request(messages, reserve_tokens=16384, previous_summary=previous, **kwargs)
    ).text


def test_a_summary_wrapper_at_the_end_is_not_the_users_last_message() -> None:
    summary = update([*tax_fix(), branch_summary()])
    assert "Unanswered" not in summary
    assert "no reply yet" not in summary
    assert "Good. Now also look" not in section(summary, "## Next Steps")
    assert (
        section(summary, "## Progress")
        .split("### In Progress\n")[1]
        .startswith("- [ ] Update the changelog\n### Blocked")
    )
    assert "1. Continue: Update the changelog" in section(summary, "## Next Steps")


@pytest.mark.parametrize(
    "preamble",
    [
        PI_PREAMBLE,
        "The user explored a different conversation branch before returning here.\n"
        "Summary of that exploration:",
        render("branch_preamble").strip(),
        "Summary of that exploration:",
    ],
)
def test_preambles_and_wrapper_sentences_never_become_items(preamble: str) -> None:
    glued = {"role": "branchSummary", "summary": preamble + BRANCH_BODY, "fromId": "f"}
    messages = [
        {"role": "compactionSummary", "summary": "## Goal\n- Old goal", "tokensBefore": 5},
        *tax_fix(),
        glued,  # OMP joins the preamble to the text without a line break
        branch_summary(preamble),
    ]
    for request in (
        history_request(messages, reserve_tokens=16384),
        branch_request(messages),
        turn_prefix_request(messages, reserve_tokens=16384),
    ):
        summary = run(request).text
        for framing in ("exploration", "explored", "compacted", "following is a summary"):
            assert framing not in summary


def test_in_progress_moves_to_done_when_its_file_was_edited_and_tests_passed() -> None:
    summary = update(tax_fix())
    progress = section(summary, "## Progress")
    done, in_progress = progress.split("### In Progress\n")
    assert "- [x] Check invoice/tax.py for the same problem" in done
    assert "- [x] Ran `python -m pytest -q`: 52 passed in 1.48s" in done
    assert in_progress.startswith("- [ ] Update the changelog\n### Blocked")


def test_in_progress_stays_when_the_tests_failed_after_the_edit() -> None:
    summary = update(tax_fix(test_output="E   AssertionError: vat\n1 failed, 51 passed"))
    in_progress = section(summary, "## Progress").split("### In Progress\n")[1]
    assert "- [ ] Check invoice/tax.py for the same problem" in in_progress
    assert "- Ran `python -m pytest -q` failed" in in_progress.split("### Blocked\n")[1]


def test_in_progress_moves_to_done_when_a_new_done_item_covers_its_words() -> None:
    previous = "## Progress\n### In Progress\n- [ ] Ran `make docs`\n- [ ] Ran `make release`"
    later = [assistant(call("d", "bash", command="make docs")), result("d", "docs built")]
    progress = section(update(later, previous=previous), "## Progress")
    assert "- [x] Ran `make docs`: docs built" in progress
    assert "- [ ] Ran `make docs`" not in progress
    assert "- [ ] Ran `make release`" in progress


def test_goal_is_the_sessions_goal_and_a_branch_goal_is_context() -> None:
    summary = update([*tax_fix(), branch_summary()])
    assert section(summary, "## Goal") == (
        "- Fix the one-cent rounding bug in invoice totals (invoice/totals.py).\n"
        "- Latest request: Now also look at invoice/tax.py, I think the VAT calculation has "
        "the same problem.\n"
    )
    critical = section(summary, "## Critical Context")
    assert (
        "- An abandoned branch tried: Add a VAT rounding regression test. It did: Wrote "
        "tests/test_tax_rounding.py. It hit: Switching invoice/tax.py to integer cents broke "
        "the Decimal API." in critical
    )
    assert "Wrote tests/test_tax_rounding.py" not in section(summary, "## Progress")
    assert "**Abandoned integer cents**" in section(summary, "## Key Decisions")
    branch = run(branch_request([*tax_fix(), branch_summary()])).text
    assert section(branch, "## Goal").startswith("- Now also look at invoice/tax.py, I think")


def shell(command: str, output: str, code: int = 0) -> Message:
    return {
        "role": "bashExecution",
        "command": command,
        "output": output,
        "exitCode": code,
        "cancelled": False,
        "truncated": False,
    }


def test_a_shell_run_after_the_reply_does_not_reopen_the_request() -> None:
    messages = [
        {"role": "user", "content": "Also write a changelog entry."},
        assistant(text("Writing it."), call("w", "write", path="CHANGELOG.md", content="x")),
        result("w", "Wrote 10 bytes"),
        assistant(text("The entry is written.")),
        shell("git status", "nothing to commit"),
    ]
    summary = run(history_request(messages, reserve_tokens=16384)).text
    assert "Unanswered" not in summary
    assert "Also write a changelog entry." not in section(summary, "## Next Steps")
    assert "- [x] Ran `git status`: nothing to commit" in summary


def test_a_failed_read_is_blocked_not_done() -> None:
    messages = [
        {"role": "user", "content": "Read missing.txt"},
        assistant(call("m", "read", path="missing.txt")),
        result("m", "ENOENT: missing.txt"),
        assistant(text("That file does not exist.")),
    ]
    progress = section(run(history_request(messages, reserve_tokens=16384)).text, "## Progress")
    assert "- read `missing.txt` failed" in progress.split("### Blocked\n")[1]
    assert "read `missing.txt`" not in progress.split("### In Progress")[0]


def test_a_failure_fixed_later_is_not_blocked_and_previous_failures_clear() -> None:
    messages = [
        assistant(call("a", "bash", command="pytest -q")),
        result("a", "E   KeyError: 'x'\n1 failed"),
        assistant(call("b", "bash", command="pytest -q tests/test_x.py")),
        result("b", "3 passed"),
    ]
    previous = "## Progress\n### Blocked\n- Tests fail with KeyError\n- The CI token is missing"
    summary = update(messages, previous=previous)
    blocked = section(summary, "## Progress").split("### Blocked\n")[1]
    assert blocked == "- The CI token is missing\n"
    assert "- Error seen: E   KeyError: 'x'" in summary  # the error text itself is kept


def test_open_questions_across_updates() -> None:
    previous = update([{"role": "user", "content": "Is the cache thread-safe?"}], previous=None)
    assert "- Unanswered (verbatim): Is the cache thread-safe?" in previous
    answered = update([assistant(text("Yes, it takes a lock."))], previous=previous)
    assert "thread-safe" not in section(answered, "## Critical Context")
    assert "thread-safe" not in section(answered, "## Progress")
    passed_over = update(
        [{"role": "user", "content": "Add a cache test."}, assistant(text("Added."))],
        previous=previous,
    )
    assert "- Question still open (verbatim): Is the cache thread-safe?" in passed_over
    assert "- [ ] Is the cache thread-safe?" in passed_over
    assert "Unanswered (verbatim)" not in passed_over
    instruction = update([{"role": "user", "content": "Use Redis."}], previous=None)
    moved_on = update(
        [{"role": "user", "content": "Add a cache test."}, assistant(text("Added."))],
        previous=instruction,
    )
    assert "Use Redis." not in section(moved_on, "## Critical Context")
    assert "- [ ] Use Redis." not in moved_on


def test_a_split_turn_summary_is_folded_into_the_sections_on_update() -> None:
    history = run(history_request(SESSION[:5], reserve_tokens=16384)).text
    prefix = run(turn_prefix_request(SESSION[3:9], reserve_tokens=16384)).text
    previous = merge_split_turn(history, prefix) + "\n\n<read-files>\nsrc/x.py\n</read-files>"
    summary = update([assistant(text("Finished the token fix."))], previous=previous)
    for heading in ("Original Request", "Early Progress", "Context for Suffix", "Turn Context"):
        assert heading not in summary
    assert "Last assistant text" not in summary
    assert "- [x] edit `src/auth/tokens.py`" in section(summary, "## Progress")
    blocked = section(summary, "## Progress").split("### Blocked\n")[1]
    assert blocked == "- Ran `pytest -q; echo done` failed\n"  # a failed early step
    assert summary.count("Files read:") == summary.count("Files modified:") == 1
    assert "`src/x.py`" in section(summary, "## Critical Context")
    assert summary.count(NOTE) == 1


def test_turn_prefix_lists_files_like_the_history_summary() -> None:
    prefix = run(turn_prefix_request(SESSION[:7], reserve_tokens=16384)).text
    context = section(prefix, "## Context for Suffix")
    assert "- Files read: `src/auth/login.py`\n" in context
    assert "- Files modified: `src/auth/tokens.py`\n" in context
    assert "read `" not in section(prefix, "## Early Progress")


def test_slash_commands_intentions_and_references() -> None:
    messages = [
        {"role": "user", "content": "/mode"},
        {"role": "user", "content": "Port the parser. It broke in a3f9c21d, see https://x.test/1"},
        assistant(text("I'll read the parser first. I chose a table-driven design.")),
        {"role": "compactionSummary", "summary": "## Done\n- … (7 more items omitted)\n- x"},
        assistant(text("Compare with 0badc0de.")),
    ]
    summary = run(history_request(messages, reserve_tokens=16384)).text
    assert section(summary, "## Goal").startswith("- Port the parser.")
    assert "/mode" not in summary
    assert section(summary, "## Key Decisions") == "- I chose a table-driven design.\n"
    assert "- Reference: It broke in a3f9c21d, see https://x.test/1" in summary
    assert "- Reference: Compare with 0badc0de." in summary
    assert "- [x] … (7 more items omitted)\n- [x] x\n" in summary  # counts carry over


def test_repeated_updates_stay_bounded() -> None:
    summary: str | None = None
    sizes: list[int] = []
    changed: list[str] = []
    for n in range(24):
        messages = [
            {"role": "user", "content": f"Step {n}: you must keep rule {n}. Is part {n} ok?"},
            assistant(
                text(f"I decided to use approach {n}."), call(f"e{n}", "edit", path=f"src/m{n}.py")
            ),
            result(f"e{n}", f"error: E{n} broke"),
            {"role": "branchSummary", "summary": f"## Goal\nBranch {n}", "fromId": "f"},
        ]
        changed.append(f"src/m{n}.py")
        summary = upsert_file_tags(update(messages, previous=summary), [], changed)
        sizes.append(len(summary))
    assert summary is not None
    assert sizes[-1] - sizes[-3] < 20  # saturated: every section (and file list) is at its cap
    assert max(sizes) < 4000
    assert summary.count("more items omitted)") == 4
    assert "- Step 0: you must keep rule 0.\n" in summary  # the first rules stay, and the last
    assert "- Step 23: you must keep rule 23.\n" in summary
    assert "(+4 more)" in section(summary, "## Critical Context")


def test_a_focus_on_a_path_quotes_what_touched_it_and_a_focus_of_stop_words_is_only_stated() -> (
    None
):
    summary = run(branch_request(SESSION, instructions="src/auth/tokens.py")).text
    critical = section(summary, "## Critical Context")
    assert "- On the focus (verbatim): edit `src/auth/tokens.py`\n" in critical
    vague = section(
        run(branch_request(SESSION, instructions="all of it")).text, "## Critical Context"
    )
    assert "- Requested focus: all of it\n" in vague
    assert "On the focus" not in vague
    assert "nothing in the summarized messages" not in vague


def test_short_summary_names_three_files_and_counts_the_rest() -> None:
    edits = [assistant(call(f"c{i}", "edit", path=f"src/m{i}.py")) for i in range(5)]
    results = [result(f"c{i}", "ok") for i in range(5)]
    messages = [x for pair in zip(edits, results, strict=True) for x in pair]
    history = run(history_request(messages, reserve_tokens=16384)).text
    short = run(short_summary_request([], summary=history, reserve_tokens=16384)).text
    assert short.startswith("I changed `src/m0.py`, `src/m1.py`, `src/m2.py` and 2 more files.")


_ERROR_PIECES = st.sampled_from(
    [
        "error", "Error", "ERROR", "exception", "ValueException", "Traceback", "failed",
        "FAILURE", "fatal", "panic", "denied", "not found", "not  found", "ENOENT", "eacces",
        "no such file", "no ſuch file", "eacceſ", "Command exited with code", "command exited",
        "KeyError", "_Error", "errors", " ", "\n", ".", ":", "x", "ok", "ſ", "K", "İ", "é",
    ]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_ERROR_PIECES, st.text(max_size=4)), max_size=12).map("".join))
def test_the_error_line_check_agrees_with_its_expression(line: str) -> None:
    """Issue 9: a cheap look for the words first; the answer is the expression's."""
    from orchestrator._models.offline_evidence import ERROR, reports_error

    assert reports_error(line) == (ERROR.search(line) is not None)


_LABEL_NAMES = ("User", "Assistant thinking", "Assistant tool calls", "Assistant", "Tool result")
_PARAGRAPH_HEAD = re.compile(r"(?:^|\n\n)\[(" + "|".join(map(re.escape, _LABEL_NAMES)) + r")\]: ")


def _paragraphs_by_regex(conversation: str) -> list[tuple[str, str]]:
    """How paragraphs were found before issue 9's scan: the expression at every position."""
    matches = list(_PARAGRAPH_HEAD.finditer(conversation))
    ends = [m.start() for m in matches[1:]] + [len(conversation)] if matches else []
    return [(m.group(1), conversation[m.end() : end]) for m, end in zip(matches, ends, strict=True)]


_PIECES = st.sampled_from(
    [
        "\n",
        "\n\n",
        "[",
        "]: ",
        "x",
        "[User]: ",
        "[Assistant]: ",
        "[Assistant tool calls]: ",
        "[Tool result]: ",
        "[Assistant thinking]: ",
        "[Foo]: ",
        "[User] ",
        "Assistant",
        "é🙂",
    ]
)


@settings(max_examples=400)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_paragraphs_are_found_where_the_expression_found_them(conversation: str) -> None:
    assert list(_paragraphs(conversation)) == _paragraphs_by_regex(conversation)


def test_paragraphs_of_a_serialized_conversation() -> None:
    text = "[User]: a\n\n[Foo]: b\n\n\n\n[Assistant]: c\n\n[Tool result]: [User]: d"
    assert list(_paragraphs(text)) == [
        ("User", "a\n\n[Foo]: b\n\n"),
        ("Assistant", "c"),
        ("Tool result", "[User]: d"),
    ]
