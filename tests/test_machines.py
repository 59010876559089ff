"""Stateful tests: the ``transitions`` machines built from the specs move exactly as the specs say.

Hypothesis fires random triggers (with random values of the spec's ``by`` fields, and
triggers no spec declares) at ``step_machine()`` / ``run_machine()`` from any state. The
oracle is ``Compiled.next_state``, the table the fold uses: legal triggers move the
model there and emit the spec's event tag; illegal ones raise ``IllegalTransition``
and change neither the state nor what was emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from effectlog.errors import IllegalTransition
from effectlog.machines import SpecModel, attempt_machine, run_machine, step_machine
from effectlog.spec import compiled, load

NO_SUCH_TRIGGER = "no_such_trigger"


def machine_test(name: str, factory: Callable[..., SpecModel]) -> type[RuleBasedStateMachine]:
    """A stateful test of machine ``name`` against its compiled spec."""
    spec = load(name)
    table = compiled(name)
    event_of = {t.trigger: t.event for t in spec.transitions}
    by_field = {t.trigger: t.by for t in spec.transitions if t.by}
    dest_keys = {t.trigger: sorted(str(v) for v in t.destinations()) for t in spec.transitions if t.by}
    by_fields = sorted(set(by_field.values()))
    by_values = sorted({v for t in spec.transitions for v in t.destinations() if v is not None})
    value = st.sampled_from([*by_values, "bogus"]) | st.none()
    # Random `by` values (or none), plus a field no transition looks at: it must never matter.
    fields = st.fixed_dictionaries({}, optional={**{f: value for f in by_fields}, "reason": st.text(max_size=5)})

    class MachineDriver(RuleBasedStateMachine):
        model: SpecModel

        @initialize(start=st.sampled_from(spec.states) | st.none())
        def build(self, start: str | None) -> None:
            self.model = factory(start) if start is not None else factory()
            assert (start or spec.initial) == self.model.state

        @rule(trigger=st.sampled_from([*sorted(event_of), NO_SUCH_TRIGGER]), fields=fields)
        def fire_any(self, trigger: str, fields: dict[str, Any]) -> None:
            self.check(trigger, fields)

        # Random triggers mostly hit illegal ones; this rule keeps the walk moving through the spec.
        @precondition(lambda self: bool(self.model.allowed()))
        @rule(data=st.data())
        def fire_allowed(self, data: st.DataObject) -> None:
            trigger = data.draw(st.sampled_from(self.model.allowed()), label="trigger")
            by = by_field.get(trigger)
            if by is None:
                self.check(trigger, data.draw(fields, label="fields"))
            else:
                self.check(trigger, {by: data.draw(st.sampled_from(dest_keys[trigger]) | value, label=by)})

        def check(self, trigger: str, fields: dict[str, Any]) -> None:
            before, emitted = self.model.state, list(self.model.emitted)
            tag = event_of.get(trigger)
            expected = table.next_state(before, tag, fields) if tag is not None else None
            if expected is None:
                with pytest.raises(IllegalTransition):
                    self.model.fire(trigger, **fields)
                assert (before, emitted) == (self.model.state, self.model.emitted)
            else:
                assert expected == self.model.fire(trigger, **fields)
                assert (expected, [*emitted, (tag, fields)]) == (self.model.state, self.model.emitted)

        @invariant()
        def state_is_declared(self) -> None:
            assert self.model.state in spec.states

        @invariant()
        def allowed_triggers_are_those_of_the_compiled_table(self) -> None:
            state = self.model.state
            expected = sorted({t for t, tag in event_of.items() if (state, tag) in table.table})
            assert expected == self.model.allowed()

        @invariant()
        def terminal_states_allow_nothing(self) -> None:
            if self.model.state in spec.terminal:
                assert [] == self.model.allowed()

    MachineDriver.__name__ = f"{name.title()}MachineDriver"
    return MachineDriver


TestStepMachine = machine_test("step", step_machine).TestCase
TestStepMachine.__doc__ = (
    "Random triggers on step_machine() follow specs/step.toml exactly; illegal ones change nothing."
)

TestRunMachine = machine_test("run", run_machine).TestCase
TestRunMachine.__doc__ = "Random triggers on run_machine() follow specs/run.toml exactly; illegal ones change nothing."

TestAttemptMachine = machine_test("attempt", attempt_machine).TestCase
TestAttemptMachine.__doc__ = (
    "Random triggers on attempt_machine() follow specs/attempt.toml exactly; illegal ones change nothing."
)


def test_step_machine_write_ahead_path() -> None:
    """pending -> requested -> (re-sent, same state) -> effected -> confirmed, emitting each spec tag once."""
    model = step_machine()
    states = [model.fire(t) for t in ("request", "resend", "effect", "confirm")]
    assert ["requested", "requested", "effected", "confirmed"] == states
    expected = ["step.requested", "step.resent", "step.effected", "step.confirmed"]
    assert expected == [tag for tag, _ in model.emitted]


@pytest.mark.parametrize(
    ("by_value", "expected"),
    [("applied", "reconciled"), ("not_applied", "pending")],
)
def test_reconcile_destination_is_chosen_by_outcome(by_value: str, expected: str) -> None:
    """One trigger, one event tag: the outcome field picks the destination."""
    model = step_machine("uncertain")
    assert expected == model.fire("reconcile", outcome=by_value)
    assert [("step.reconciled", {"outcome": by_value})] == model.emitted


@pytest.mark.parametrize("outcome", [None, "maybe"])
def test_reconcile_without_a_known_outcome_is_illegal(outcome: str | None) -> None:
    """A `by` value the spec does not list (or none at all) is refused, and nothing moves."""
    model = step_machine("uncertain")
    fields = {} if outcome is None else {"outcome": outcome}
    with pytest.raises(IllegalTransition, match="no destination"):
        model.fire("reconcile", **fields)
    assert ("uncertain", []) == (model.state, model.emitted)


def test_unknown_trigger_is_an_illegal_transition() -> None:
    """A trigger the spec does not declare raises our own error, not a transitions error."""
    model = run_machine()
    with pytest.raises(IllegalTransition, match="no trigger 'reopen'"):
        model.fire("reopen")
    assert ("created", []) == (model.state, model.emitted)


@pytest.mark.parametrize("closed", ["completed", "failed", "cancelled"])
@pytest.mark.parametrize("trigger", sorted({t.trigger for t in load("run").transitions}))
def test_a_closed_run_never_reopens(closed: str, trigger: str) -> None:
    """No trigger leaves completed, failed or cancelled."""
    model = run_machine(closed)
    with pytest.raises(IllegalTransition):
        model.fire(trigger)
    assert closed == model.state
