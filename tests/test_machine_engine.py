"""The generic engine: loading rules, the runner, refusal, observers and rendering."""

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator._core.errors import DefinitionError, TransitionError
from orchestrator._lifecycle.guards import (
    TURN_GUARDS,
    GuardSet,
    NavigationFacts,
    OperationFacts,
    SessionFacts,
    TurnFacts,
)
from orchestrator._lifecycle.machine import MachineDef, Runner, Step, load_machine, step
from orchestrator._lifecycle.render import main, render_markdown, render_mermaid, render_table

MINI = """\
[machine]
name = "mini"
initial = "a"
final = ["z"]
doc = "A tiny machine for tests."

[states.a]
doc = "Start."

[states.b]
doc = "Middle | with a pipe."

[states.z]
doc = "End."

[[transitions]]
source = "a"
event = "go"
dest = "b"
guards = ["over_threshold"]
effects = ["poke"]
doc = "Only over the threshold."

[[transitions]]
source = "a"
event = "go"
dest = "a"
unless = ["context_full"]
effects = ["poke", "prod"]
doc = "Stay put."

[[transitions]]
source = ["a", "b"]
event = "finish"
dest = "z"
"""

EFFECTS = ("poke", "prod")


def mini(text: str = MINI) -> MachineDef:
    return MachineDef.parse(text, source="mini.toml", guards=TURN_GUARDS, effects=EFFECTS)


def load_bad(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DefinitionError) as caught:
        MachineDef.load(path, guards=TURN_GUARDS, effects=EFFECTS)
    assert str(caught.value).startswith(f"{path}: ")
    return str(caught.value)


def test_mini_loads_with_states_rows_and_events_in_file_order() -> None:
    defn = mini()
    assert defn.name == "mini"
    assert defn.initial == "a"
    assert defn.final == frozenset({"z"})
    assert list(defn.states) == ["a", "b", "z"]
    assert [r.index for r in defn.rows] == [0, 1, 2]
    assert defn.events == ("go", "finish")
    assert defn.rows[2].sources == ("a", "b")
    assert defn.rows[1].unless == ("context_full",)


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mini.toml"
    path.write_text(MINI, encoding="utf-8")
    assert MachineDef.load(path, guards=TURN_GUARDS, effects=EFFECTS).source == str(path)


# --- one test per loading rule ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("[machine\n", "not valid TOML", id="toml-syntax"),
        pytest.param(
            MINI + "\n[extra]\nx = 1\n", "unknown key(s) in the file: extra", id="top-key"
        ),
        pytest.param(
            MINI.replace('doc = "A tiny', 'colour = "red"\ndoc = "A tiny'),
            "unknown key(s) in [machine]: colour",
            id="machine-key",
        ),
        pytest.param(
            MINI.replace('doc = "Start."', 'doc = "Start."\nentry = "x"'),
            "unknown key(s) in [states.a]: entry",
            id="state-key",
        ),
        pytest.param(
            MINI.replace('dest = "b"', 'dest = "b"\nwhen = "x"'),
            "unknown key(s) in transition #1: when",
            id="row-key",
        ),
        pytest.param(MINI.split("[states.a]")[0], "[states] must declare", id="no-states"),
        pytest.param("[states.a]\ndoc = 'x'\n", "missing the [machine] table", id="no-machine"),
        pytest.param(MINI.replace('name = "mini"\n', ""), "non-empty string 'name'", id="no-name"),
        pytest.param(MINI.replace('doc = "End."', 'doc = ""'), "non-empty string 'doc'", id="doc"),
        pytest.param(MINI.replace('initial = "a"', 'initial = "q"'), "state 'q'", id="initial"),
        pytest.param(MINI.replace('final = ["z"]', 'final = ["y"]'), "state 'y'", id="final"),
        pytest.param(
            MINI.replace('final = ["z"]', "final = []"), "final lists no state", id="nofin"
        ),
        pytest.param(MINI.replace('final = ["z"]', "final = [1]"), "list of strings", id="types"),
        pytest.param(MINI.replace('dest = "b"', 'dest = "q"'), "undeclared state 'q'", id="dest"),
        pytest.param(
            MINI.replace('guards = ["over_threshold"]', 'guards = ["sunny"]'),
            "unregistered guard 'sunny'",
            id="guard",
        ),
        pytest.param(
            MINI.replace('unless = ["context_full"]', 'unless = ["rainy"]'),
            "unregistered guard 'rainy'",
            id="unless",
        ),
        pytest.param(
            MINI.replace('effects = ["poke"]', 'effects = ["launch"]'),
            "unregistered effect 'launch'",
            id="effect",
        ),
        pytest.param(
            MINI + '\n[states.lost]\ndoc = "Nobody comes here."\n'
            '\n[[transitions]]\nsource = "lost"\nevent = "finish"\ndest = "z"\n',
            "unreachable from 'a': lost",
            id="unreachable",
        ),
        pytest.param(
            MINI.replace('source = ["a", "b"]', 'source = "a"'),
            "trap) from: b",
            id="trap",
        ),
        pytest.param(
            MINI + '\n[[transitions]]\nsource = "z"\nevent = "again"\ndest = "a"\n',
            "final state 'z' has an outgoing transition (again)",
            id="final-outgoing",
        ),
        pytest.param(
            MINI + '\n[[transitions]]\nsource = "b"\nevent = "finish"\ndest = "a"\n',
            "transition #4 can never fire from 'b': transition #3 has no guard",
            id="shadowed",
        ),
        pytest.param(MINI.replace('event = "go"', 'event = "Go!"'), "'Go!' is not", id="ev-name"),
        pytest.param(
            MINI.replace('event = "finish"', 'event = "trigger"'), "'trigger' is not", id="reserved"
        ),
        pytest.param(
            MINI.replace("[states.b]", "[states.is_b]").replace('"b"', '"is_b"'),
            "'is_b' is not",
            id="prefix",
        ),
        pytest.param(MINI.replace('source = ["a", "b"]', "source = []"), "empty source", id="src"),
        pytest.param(
            MINI.replace('doc = "Stay put."', "doc = 3"), "doc must be a string", id="row-doc"
        ),
        pytest.param(
            MINI.replace("[[transitions]]", "[transitions.x]", 1).split("[[transitions]]")[0],
            "array of tables",
            id="rows-shape",
        ),
        pytest.param(
            MINI.replace("[states.a]", "[states]\na = 1\n[states.q]"),
            "[states.a] must be a table",
            id="state-shape",
        ),
    ],
)
def test_each_loading_rule_names_the_file_and_the_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    assert reason in load_bad(tmp_path, text)


def test_unreadable_file_is_a_definition_error(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read"):
        MachineDef.load(tmp_path / "missing.toml")


def test_a_machine_without_a_registered_effect_vocabulary_is_refused() -> None:
    with pytest.raises(DefinitionError, match="no effect vocabulary registered for machine 'mini'"):
        MachineDef.parse(MINI, source="mini.toml")


def test_a_custom_guard_registry_is_honoured() -> None:
    def sunny(f: NavigationFacts) -> bool:
        return f.has_entries

    guards = GuardSet("mini", NavigationFacts, {"sunny": sunny, "context_full": lambda f: False})
    defn = MachineDef.parse(MINI.replace("over_threshold", "sunny"), guards=guards, effects=EFFECTS)
    assert step(defn, "a", "go", NavigationFacts(has_entries=True)).dest == "b"
    assert Runner(defn).fire("go").dest == "a"  # the omitted facts are the registry's record
    with pytest.raises(TypeError, match="mini: guards read NavigationFacts, not TurnFacts"):
        step(defn, "a", "go", TurnFacts())


def test_a_machine_without_a_guard_registry_is_refused() -> None:
    with pytest.raises(DefinitionError, match="mini.toml: no guard registry for machine 'mini'"):
        MachineDef.parse(MINI, source="mini.toml", effects=EFFECTS)


def test_a_table_naming_another_machines_guard_fails_at_load(tmp_path: Path) -> None:
    turn = Path(load_machine("turn").source).read_text(encoding="utf-8")
    path = tmp_path / "turn.toml"
    path.write_text(turn.replace('guards = ["will_retry"]', 'guards = ["has_work"]', 1))
    with pytest.raises(DefinitionError) as caught:
        MachineDef.load(path)
    assert str(path) in str(caught.value)
    assert "names guard 'has_work' of the operation machine; turn guards read TurnFacts" in str(
        caught.value
    )


def test_another_machines_facts_are_refused_at_the_step() -> None:
    turn = load_machine("turn")
    with pytest.raises(TypeError, match="turn: guards read TurnFacts, not OperationFacts"):
        step(turn, "idle", "user_prompt", OperationFacts())
    with pytest.raises(TypeError, match="turn: guards read TurnFacts, not SessionFacts"):
        Runner(turn).fire("user_prompt", SessionFacts())


# --- the runner -------------------------------------------------------------------------------


def test_first_row_whose_guards_hold_wins() -> None:
    runner = Runner(mini())
    stay = runner.fire("go", TurnFacts(over_threshold=False))
    assert stay == Step(machine="mini", source="a", event="go", dest="a", effects=("poke", "prod"))
    assert runner.state == "a"
    moved = runner.fire("go", TurnFacts(over_threshold=True, context_full=True))
    assert (moved.dest, moved.effects) == ("b", ("poke",))
    assert runner.state == "b"


def test_an_unlisted_event_raises_and_leaves_the_state_unchanged() -> None:
    runner = Runner(mini())
    runner.fire("go", TurnFacts(over_threshold=True))
    with pytest.raises(TransitionError) as caught:
        runner.fire("go")
    assert (caught.value.machine, caught.value.state, caught.value.event) == ("mini", "b", "go")
    assert str(caught.value) == "mini: can't go when in b"
    assert runner.state == "b"


def test_an_unknown_event_raises_transition_error_not_attribute_error() -> None:
    runner = Runner(mini())
    with pytest.raises(TransitionError):
        runner.fire("fly")
    assert runner.state == "a"


def test_an_event_whose_guards_all_fail_is_refused_with_the_state_unchanged() -> None:
    runner = Runner(mini())
    with pytest.raises(TransitionError, match="can't go when in a"):
        runner.fire("go", TurnFacts(over_threshold=False, context_full=True))
    assert runner.state == "a"
    with pytest.raises(TransitionError):
        step(runner.defn, "a", "go", TurnFacts(context_full=True))


def test_observers_see_every_step_in_order_and_not_refusals() -> None:
    seen: list[Step] = []
    late: list[Step] = []
    runner = Runner(mini(), observers=[seen.append])
    runner.fire("go", TurnFacts(over_threshold=True))
    runner.subscribe(late.append)
    with pytest.raises(TransitionError):
        runner.fire("go")
    runner.fire("finish")
    assert [(s.source, s.event, s.dest) for s in seen] == [("a", "go", "b"), ("b", "finish", "z")]
    assert late == seen[1:]
    assert runner.done


def test_runner_can_resume_in_a_given_state() -> None:
    runner = Runner(mini(), state="b")
    assert runner.state == "b"
    assert not runner.done
    assert runner.listed_events() == ("finish",)
    with pytest.raises(DefinitionError, match="no state 'q'"):
        Runner(mini(), state="q")


def test_facts_default_when_omitted() -> None:
    assert Runner(mini()).fire("go").dest == "a"


def test_shipped_tables_are_cached_and_loaded_from_the_machines_folder() -> None:
    assert load_machine("turn") is load_machine("turn")
    assert load_machine("turn").source.endswith("machines/turn.toml")
    with pytest.raises(DefinitionError, match="not a machine name"):
        load_machine("../turn")
    with pytest.raises(DefinitionError, match="cannot read"):
        load_machine("nonesuch")


# --- rendering --------------------------------------------------------------------------------

MINI_MERMAID = """\
stateDiagram-v2
    [*] --> a
    a --> b: go [over_threshold]
    a --> a: go [not context_full]
    a --> z: finish
    b --> z: finish
    z --> [*]
"""

MINI_TABLE = """\
| State | Meaning |
|---|---|
| `a` (initial) | Start. |
| `b` | Middle \\| with a pipe. |
| `z` (final) | End. |

| # | From | Event | Guards | To | Effects | Why |
|---|---|---|---|---|---|---|
| 1 | `a` | `go` | over_threshold | `b` | `poke` | Only over the threshold. |
| 2 | `a` | `go` | not context_full | `a` | `poke`, `prod` | Stay put. |
| 3 | `a`, `b` | `finish` |  | `z` |  |  |
"""


def test_render_mermaid_snapshot() -> None:
    assert render_mermaid(mini()) == MINI_MERMAID


def test_render_table_snapshot() -> None:
    assert render_table(mini()) == MINI_TABLE


def test_render_markdown_wraps_the_diagram_and_tables() -> None:
    text = render_markdown(mini())
    assert text == (
        "### `mini`\n\nA tiny machine for tests.\n\n```mermaid\n"
        + MINI_MERMAID
        + "```\n\n"
        + MINI_TABLE
    )


def test_render_cli_prints_each_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["navigation", "--mermaid"]) == 0
    assert capsys.readouterr().out == render_mermaid(load_machine("navigation"))
    assert main(["navigation", "--table"]) == 0
    assert capsys.readouterr().out == render_table(load_machine("navigation"))
    assert main(["navigation"]) == 0
    assert capsys.readouterr().out == render_markdown(load_machine("navigation"))


@pytest.mark.parametrize("argv", [[], ["turn", "--svg"], ["turn", "--table", "--mermaid"], ["x"]])
def test_render_cli_refuses_bad_arguments(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err


def test_render_cli_reports_a_broken_shipped_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import orchestrator._lifecycle.render as render

    def broken(name: str) -> MachineDef:
        raise DefinitionError(f"{name}.toml: broken")

    monkeypatch.setattr(render, "load_machine", broken)
    assert main(["turn"]) == 2
    assert capsys.readouterr().err == "turn.toml: broken\n"


@pytest.mark.slow
def test_render_module_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "machines", "turn", "--mermaid"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == render_mermaid(load_machine("turn"))
