"""The specs: committed diagrams match them, events and transitions map one to one, bad specs are refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.cli import main
from effectlog.diagrams import render
from effectlog.errors import SpecError
from effectlog.spec import load, parse_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("machine", ["step", "run"])
def test_committed_diagram_equals_the_generated_one(machine: str) -> None:
    """docs/diagrams/<machine>.mmd is exactly what the spec renders (run `make diagrams` after editing specs/)."""
    committed = (ROOT / "docs" / "diagrams" / f"{machine}.mmd").read_text(encoding="utf-8")
    assert render(machine, "mermaid") == committed


@pytest.mark.parametrize("machine", ["step", "run"])
@pytest.mark.parametrize("fmt", ["mermaid", "dot"])
def test_diagram_command_prints_every_state(machine: str, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectlog diagram` prints the rendered spec, and it names every state of the machine."""
    assert 0 == main(["diagram", machine, "--format", fmt])
    out = capsys.readouterr().out
    assert render(machine, fmt) == out  # type: ignore[arg-type]
    assert [] == [s for s in load(machine).states if s not in out]


def test_every_event_tag_is_emitted_by_exactly_one_transition() -> None:
    """Each tag in events.TAGS is named by exactly one step or run transition, and no transition names another."""
    emitted = Counter(t.event for name in ("step", "run") for t in load(name).transitions)
    assert dict.fromkeys(ev.TAGS, 1) == dict(emitted)


@pytest.mark.parametrize("name", ["step", "run"])
def test_each_machine_emits_only_its_own_kind_of_event(name: str) -> None:
    """The step spec emits step events (StepEvent), the run spec run events."""
    wrong = [t.event for t in load(name).transitions if issubclass(ev.TAGS[t.event], ev.StepEvent) != (name == "step")]
    assert [] == wrong


def test_run_admits_only_step_event_tags() -> None:
    """The run spec's `admits` table names step event tags (or `*`) and only non-terminal run states."""
    run = load("run")
    step_tags = {t.event for t in load("step").transitions}
    assert [] == [tag for tags in run.admits.values() for tag in tags if tag != "*" and tag not in step_tags]
    assert [] == [state for state in run.admits if state in run.terminal]


def test_specs_hold_the_states_the_design_requires() -> None:
    """The step and run machines have at least the states issue 2 lists."""
    step = {"pending", "requested", "effected", "confirmed", "uncertain", "denied", "reconciled", "failed"}
    run = {"created", "running", "suspended", "stopped", "completed", "failed", "cancelled"}
    assert (set(), set()) == (step - set(load("step").states), run - set(load("run").states))
    assert {"completed", "failed", "cancelled"} == set(load("run").terminal)


VALID = """
name = "m"
initial = "a"
terminal = ["z"]
states = ["a", "b", "z"]

[[transitions]]
trigger = "go"
source = ["a"]
dest = "b"
event = "m.went"

[[transitions]]
trigger = "end"
source = ["b"]
event = "m.ended"
by = "how"
dest = { ok = "z", again = "a" }
"""

MALFORMED = {
    "unknown source state": (
        VALID.replace('source = ["a"]', 'source = ["q"]'),
        "transitions[0] (go): unknown state 'q'",
    ),
    "unknown dest state": (VALID.replace('dest = "b"', 'dest = "q"'), "transitions[0] (go): unknown state 'q'"),
    "unknown state in a dest table": (
        VALID.replace('again = "a"', 'again = "q"'),
        "transitions[1] (end): unknown state 'q'",
    ),
    "leaving a terminal state": (
        VALID.replace('source = ["b"]', 'source = ["b", "z"]'),
        "transitions[1] (end): leaves terminal state 'z'",
    ),
    "by without a dest table": (
        VALID.replace('dest = "b"', 'dest = "b"\nby = "how"'),
        "transitions[0] (go): `by` needs a dest table",
    ),
    "dest table without by": (VALID.replace('by = "how"\n', ""), "transitions[1] (end): a dest table needs `by`"),
    "nondeterministic (state, event)": (
        VALID + '\n[[transitions]]\ntrigger = "jump"\nsource = ["a"]\ndest = "z"\nevent = "m.went"\n',
        "transitions[2] (jump): event 'm.went' from 'a' already handled by go",
    ),
    "trigger declared twice": (
        VALID + '\n[[transitions]]\ntrigger = "go"\nsource = ["b"]\ndest = "a"\nevent = "m.back"\n',
        "transitions[2] (go): trigger declared twice",
    ),
    "initial not a state": (VALID.replace('initial = "a"', 'initial = "q"'), "initial state 'q'"),
    "terminal not a state": (VALID.replace('terminal = ["z"]', 'terminal = ["q"]'), "terminal state 'q'"),
    "duplicate state": (VALID.replace('states = ["a", "b", "z"]', 'states = ["a", "b", "b", "z"]'), "duplicate state"),
    "admits an unknown state": (VALID + '\n[admits]\nq = ["*"]\n', "admits names unknown state 'q'"),
    "missing field": (VALID.replace('event = "m.went"\n', ""), "missing required field `event`"),
    "not TOML": (VALID + "\n[[transitions]\n", "at line 20"),
}


def test_the_valid_example_parses() -> None:
    """The base of the malformed cases is itself a valid spec, so each case fails for its own reason."""
    spec = parse_spec(VALID, "valid.toml")
    assert (("go", "end"), ("a", "b", "z")) == (tuple(t.trigger for t in spec.transitions), spec.states)


@pytest.mark.parametrize(("text", "reason"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_spec_is_refused_naming_the_file(tmp_path: Path, text: str, reason: str) -> None:
    """A malformed spec raises SpecError whose message starts with the file and says what is wrong."""
    path = tmp_path / "broken.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        parse_spec(path.read_text(encoding="utf-8"), str(path))
    assert str(info.value).startswith(f"{path}: ")
    assert reason in str(info.value)


def test_unknown_machine_is_a_spec_error() -> None:
    """Asking for a machine that is not one of MACHINES is refused by name."""
    with pytest.raises(SpecError, match="unknown machine 'nope'"):
        load("nope")
