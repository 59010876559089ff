"""fold.apply_receipt: a step's receipt and confirmation applied as one batch (the actor's happy path)
is the pure fold applied to each in turn: the same state, or the same refusal."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.errors import EffectlogError
from effectlog.fold import RunState, apply, apply_receipt, replay
from strategies import legal_histories


def outcome(apply_pair: Any, state: RunState, effected: ev.StepEffected, confirmed: ev.StepConfirmed) -> Any:
    """The state after the pair, or the refusal as (type, message, run, seq, step)."""
    try:
        return apply_pair(state, effected, confirmed)
    except EffectlogError as exc:
        return (type(exc).__name__, str(exc), exc.run_id, exc.seq, exc.step_id)


def one_at_a_time(state: RunState, effected: ev.StepEffected, confirmed: ev.StepConfirmed) -> RunState:
    return apply(apply(state, effected), confirmed)


@given(history=legal_histories(), data=st.data())
def test_a_receipt_and_its_confirmation_fold_as_the_pure_fold_folds_them(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """At any point of any legal history, for a step of the run or another id, any attempt, a seq in
    order or not, a run id right or wrong, and the confirmation's attempt and ``rebuilt`` drawn apart:
    apply_receipt gives what apply gives event by event (legal pairs land on the same state; illegal
    ones raise the same error naming the same place)."""
    cut = data.draw(st.integers(1, len(history)), label="cut")
    state = replay(history[:cut])
    steps = sorted(state.steps.keys()) or ["s0"]
    requested = [s for s in steps if s in state.steps and state.steps[s].state == "requested"]  # legal pairs, often
    sid = data.draw(st.sampled_from([*requested, *requested, *requested, *steps, "elsewhere"]), label="step")
    other = data.draw(st.sampled_from([sid, *steps]), label="confirmed step")
    known = state.steps.get(sid)
    attempt = data.draw(st.sampled_from([known.attempt if known else 1, 2]), label="attempt")
    seq = state.seq + data.draw(st.sampled_from([1, 1, 1, 2, 0]), label="first seq offset")
    gap = data.draw(st.sampled_from([1, 1, 1, 2]), label="second seq offset")
    run_id = data.draw(st.sampled_from([state.run_id, state.run_id, "another"]), label="run id")
    ok = data.draw(st.booleans(), label="ok")
    # The confirmation's own attempt and flag: its checks and its changes are made apart from the receipt's.
    confirmed_attempt = data.draw(st.sampled_from([attempt, attempt, attempt, 1, 2]), label="confirmed attempt")
    rebuilt = data.draw(st.booleans(), label="rebuilt")
    effected = ev.StepEffected(run_id=run_id, seq=seq, ts=5, step_id=sid, attempt=attempt, receipt={"n": 1}, ok=ok)
    confirmed = ev.StepConfirmed(
        run_id=state.run_id, seq=seq + gap, ts=6, step_id=other, attempt=confirmed_attempt, rebuilt=rebuilt
    )

    assert outcome(one_at_a_time, state, effected, confirmed) == outcome(apply_receipt, state, effected, confirmed)


def _requested(attempt_key: str = "k") -> list[ev.Event]:
    return [
        ev.RunStarted(run_id="r", seq=1, ts=1, plan={"steps": [{"id": "s0"}, {"id": "s1"}]}),
        ev.StepRequested(
            run_id="r", seq=2, ts=2, step_id="s0", attempt=1, adapter="a", idempotency_key=attempt_key, args_digest="d"
        ),
    ]


def test_a_requested_steps_receipt_and_confirmation_land_where_the_pure_fold_lands() -> None:
    """The happy path itself (a requested step, its receipt, its confirmation, then the same for a second
    step and a stop): the state apply_receipt gives equals the pure fold's, confirmed, at the last seq."""
    state = replay(_requested())
    pair = (
        ev.StepEffected(run_id="r", seq=3, ts=3, step_id="s0", attempt=1, receipt={"n": 1}),
        ev.StepConfirmed(run_id="r", seq=4, ts=4, step_id="s0", attempt=1),
    )
    after = apply_receipt(state, *pair)
    assert one_at_a_time(state, *pair) == after
    assert ("confirmed", 4, 4, {"n": 1}) == (
        after.steps["s0"].state,
        after.seq,
        after.updated_ts,
        after.steps["s0"].receipt,
    )
    state = apply(
        after,
        ev.StepRequested(
            run_id="r", seq=5, ts=5, step_id="s1", attempt=1, adapter="a", idempotency_key="k2", args_digest="d"
        ),
    )
    pair = (
        ev.StepEffected(run_id="r", seq=6, ts=6, step_id="s1", attempt=1, receipt=[1], ok=False),
        ev.StepConfirmed(run_id="r", seq=7, ts=7, step_id="s1", attempt=1),
    )
    assert one_at_a_time(state, *pair) == apply_receipt(state, *pair)
