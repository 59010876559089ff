"""The pure fold: replay is a reduce, legality comes from the specs, errors name run, seq and step."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.errors import ChainBroken, CorruptEvent, IllegalTransition, SequenceGap
from effectlog.fold import Record, apply, initial, replay, replay_records
from effectlog.testing import sample_run
from strategies import (
    DONE,
    Walk,
    advance,
    build_event,
    legal_histories,
    legal_moves,
    legal_walks,
    spec_illegal_moves,
)

RUN_ID = "run-1"


def records_of(events: list[ev.Event], chain: Chain) -> list[Record]:
    """Stored rows for ``events`` the way a journal writes them: canonical bytes and chained hashes."""
    head, out = GENESIS, []
    for event in events:
        body = ev.encode(event)
        head = chain.link(head, body)
        out.append(Record(event.run_id, event.seq, body, head))
    return out


def where(exc: Any) -> tuple[str | None, int | None, str | None]:
    return exc.run_id, exc.seq, exc.step_id


def step_of(event: ev.Event) -> str | None:
    return event.step_id if isinstance(event, ev.StepEvent) else None


def walk_to(*events: ev.Event, plan_steps: tuple[str, ...] = ("s0",)) -> Walk:
    walk = Walk(run_id=RUN_ID, plan_steps=plan_steps)
    for event in events:
        walk = advance(walk, event)
    return walk


def started(steps: tuple[str, ...] = ("s0",)) -> ev.RunStarted:
    return ev.RunStarted(run_id=RUN_ID, seq=1, ts=1, plan={"steps": [{"id": s} for s in steps]})


# -- replay is a reduce -------------------------------------------------------------


@given(history=legal_histories(), data=st.data())
def test_replay_of_prefix_then_rest_equals_replay_of_all(history: list[ev.Event], data: st.DataObject) -> None:
    """For any legal history and any split point, replay(prefix) then the rest == replay(all)."""
    cut = data.draw(st.integers(0, len(history)), label="cut")
    prefix = replay(history[:cut], run_id=history[0].run_id)
    assert replay(history) == replay(history[cut:], prefix)


@given(history=legal_histories())
def test_replay_equals_applying_one_event_at_a_time(history: list[ev.Event]) -> None:
    """The live path (apply per event) and replay give the same state."""
    state = initial(history[0].run_id)
    for event in history:
        state = apply(state, event)
    assert replay(history) == state


@given(walk=legal_walks())
def test_replay_moves_run_and_steps_exactly_as_the_spec_walk(walk: Walk) -> None:
    """The fold ends in the states that the spec-driven walk (an independent model) predicts."""
    state = replay(walk.events)
    assert (walk.run_state, walk.seq) == (state.state, state.seq)
    expected = {sid: (m.state, m.attempt, m.resends) for sid, m in walk.steps.items()}
    assert expected == {sid: (s.state, s.attempt, s.resends) for sid, s in state.steps.items()}


def test_replay_of_nothing_needs_a_run_id() -> None:
    """With no events and no run id there is no run to return."""
    assert initial("r") == replay([], run_id="r")
    with pytest.raises(ValueError, match="run_id"):
        replay([])


# -- illegal events raise a typed error naming where, and change nothing ---------------


@given(walk=legal_walks(), data=st.data())
def test_event_the_spec_forbids_raises_illegal_transition(walk: Walk, data: st.DataObject) -> None:
    """Any event the step/run spec (or the run's admits) forbids raises IllegalTransition at its seq and step."""
    move = data.draw(st.sampled_from(spec_illegal_moves(walk)), label="move")
    event = build_event(data.draw, walk, move)
    state = replay(walk.events)
    with pytest.raises(IllegalTransition) as info:
        apply(state, event)
    assert (walk.run_id, event.seq, step_of(event)) == where(info.value)
    assert replay(walk.events) == state


@given(walk=legal_walks(), data=st.data())
def test_event_out_of_sequence_raises_sequence_gap(walk: Walk, data: st.DataObject) -> None:
    """An event whose seq does not continue the run raises SequenceGap naming run, seq and step."""
    moves = legal_moves(walk) or spec_illegal_moves(walk)
    seq = data.draw(st.integers(0, walk.seq + 50).filter(lambda n: n != walk.seq + 1), label="seq")
    event = build_event(data.draw, walk, data.draw(st.sampled_from(moves), label="move"), seq=seq)
    state = replay(walk.events)
    with pytest.raises(SequenceGap) as info:
        apply(state, event)
    assert (walk.run_id, seq, step_of(event)) == where(info.value)
    assert replay(walk.events) == state


@given(walk=legal_walks(), data=st.data())
def test_event_of_another_run_raises_corrupt_event(walk: Walk, data: st.DataObject) -> None:
    """An event carrying another run's id is refused, naming the run being folded, the seq and the step."""
    moves = legal_moves(walk) or spec_illegal_moves(walk)
    event = build_event(data.draw, walk, data.draw(st.sampled_from(moves), label="move"))
    event = msgspec.structs.replace(event, run_id=walk.run_id + "-other")
    state = replay(walk.events)
    with pytest.raises(CorruptEvent) as info:
        apply(state, event)
    assert (walk.run_id, event.seq, step_of(event)) == where(info.value)
    assert replay(walk.events) == state


# The fields each event type requires beyond run_id, seq, ts (and step_id for step events).
REQUIRED: dict[str, dict[str, Any]] = {
    "run.suspended": {"step_id": "s0"},
    "run.stopped": {"step_id": "s0"},
    "step.requested": {"adapter": "a", "idempotency_key": "k", "args_digest": "x"},
    "step.resent": {"resend": 1},
    "step.reconciled": {"outcome": "not_applied", "evidence": "e", "operator": "o"},
    "step.denied": {"decision": "require_approval"},
    "step.approved": {"by": "p", "args_digest": "x"},
    "run.repinned": {"adapters": {}, "by": "p", "reason": "r"},
    "step.carried": {"from_run": "parent", "from_seq": 1},
}


def minimal(tag: str, seq: int) -> ev.Event:
    """An event of type ``tag`` for step s0 of run-1 with only its required fields."""
    step = {"step_id": "s0"} if tag.startswith("step.") else {}
    return ev.TAGS[tag](run_id=RUN_ID, seq=seq, ts=9, **step, **REQUIRED.get(tag, {}))


@pytest.mark.parametrize("closing", ["run.completed", "run.failed", "run.cancelled"])
@pytest.mark.parametrize("tag", sorted(ev.TAGS))
def test_a_closed_run_accepts_nothing(closing: str, tag: str) -> None:
    """After completed, failed or cancelled, every event type raises IllegalTransition."""
    history = sample_run(RUN_ID, steps=1)
    if closing != "run.completed":
        history = [*history[:2], minimal(closing, 3)]
    state = replay(history)
    assert closing == ev.tag_of(history[-1])
    event = minimal(tag, state.seq + 1)
    with pytest.raises(IllegalTransition) as info:
        apply(state, event)
    assert (RUN_ID, state.seq + 1, step_of(event)) == where(info.value)
    assert replay(history) == state


def test_run_completed_with_an_unfinished_plan_step_is_illegal() -> None:
    """run.completed is refused while a plan step is not confirmed or reconciled, naming the step."""
    history = sample_run(RUN_ID, steps=2)[:-1]
    unfinished = history[:-1]  # s1 is effected, not confirmed
    state = replay(unfinished)
    with pytest.raises(IllegalTransition, match=r"unfinished steps: \['s1'\]") as info:
        apply(state, ev.RunCompleted(run_id=RUN_ID, seq=state.seq + 1, ts=1))
    assert (RUN_ID, state.seq + 1) == (info.value.run_id, info.value.seq)
    assert "completed" == apply(replay(history), ev.RunCompleted(run_id=RUN_ID, seq=len(history) + 1, ts=1)).state


@given(walk=legal_walks(), data=st.data())
def test_run_completed_needs_every_plan_step_done(walk: Walk, data: st.DataObject) -> None:
    """Whenever the running run has a plan step not done, run.completed is illegal; otherwise it is legal."""
    state = replay(walk.events)
    event = ev.RunCompleted(run_id=walk.run_id, seq=walk.seq + 1, ts=walk.ts)
    all_done = all(walk.step(s).state in DONE for s in walk.plan_steps)
    if walk.run_state == "running" and all_done:
        assert "completed" == apply(state, event).state
    else:
        with pytest.raises(IllegalTransition):
            apply(state, event)


# -- guards beyond the state table ------------------------------------------------------


def _requested(idempotent: bool) -> list[ev.Event]:
    return [
        started(),
        ev.StepRequested(
            run_id=RUN_ID,
            seq=2,
            ts=1,
            step_id="s0",
            adapter="a",
            idempotency_key="k",
            args_digest="x",
            idempotent=idempotent,
        ),
    ]


def test_resend_of_a_non_idempotent_tool_is_illegal() -> None:
    """Only a tool that honours idempotency keys may receive the same key again."""
    state = replay(_requested(idempotent=False))
    with pytest.raises(IllegalTransition, match="idempotency") as info:
        apply(state, ev.StepResent(run_id=RUN_ID, seq=3, ts=1, step_id="s0", resend=1))
    assert (RUN_ID, 3, "s0") == where(info.value)


@pytest.mark.parametrize("resend", [0, 2, 5])
def test_resend_counter_must_count_up_by_one(resend: int) -> None:
    """Resends are numbered 1, 2, 3...: a skipped or repeated number is illegal."""
    state = replay(_requested(idempotent=True))
    with pytest.raises(IllegalTransition, match="resend") as info:
        apply(state, ev.StepResent(run_id=RUN_ID, seq=3, ts=1, step_id="s0", resend=resend))
    assert (RUN_ID, 3, "s0") == where(info.value)
    assert 1 == apply(state, ev.StepResent(run_id=RUN_ID, seq=3, ts=1, step_id="s0", resend=1)).steps["s0"].resends


def _approved(expires_at: int | None = None) -> list[ev.Event]:
    return [
        started(),
        ev.StepDenied(run_id=RUN_ID, seq=2, ts=1, step_id="s0", decision="require_approval"),
        ev.StepApproved(run_id=RUN_ID, seq=3, ts=2, step_id="s0", by="ann", args_digest="good", expires_at=expires_at),
    ]


def _request(seq: int, digest: str, ts: int = 3, attempt: int = 1) -> ev.StepRequested:
    return ev.StepRequested(
        run_id=RUN_ID,
        seq=seq,
        ts=ts,
        step_id="s0",
        adapter="a",
        idempotency_key="k",
        args_digest=digest,
        attempt=attempt,
    )


def test_approval_binds_the_args_digest() -> None:
    """After approval the request must carry exactly the approved args digest."""
    state = replay(_approved())
    with pytest.raises(IllegalTransition, match="different arguments") as info:
        apply(state, _request(4, "other"))
    assert (RUN_ID, 4, "s0") == where(info.value)
    assert "requested" == apply(state, _request(4, "good")).steps["s0"].state


def test_expired_approval_cannot_be_used() -> None:
    """A request after the approval's expiry is illegal; at the expiry instant it is still allowed."""
    state = replay(_approved(expires_at=10))
    with pytest.raises(IllegalTransition, match="expired"):
        apply(state, _request(4, "good", ts=11))
    assert "requested" == apply(state, _request(4, "good", ts=10)).steps["s0"].state


def test_reconciled_not_applied_starts_a_new_attempt() -> None:
    """not_applied clears the step for attempt 2; an event still naming attempt 1 is then illegal."""
    history = [
        *_requested(idempotent=False),
        ev.StepUncertain(run_id=RUN_ID, seq=3, ts=1, step_id="s0"),
        ev.RunStopped(run_id=RUN_ID, seq=4, ts=1, step_id="s0"),
        ev.StepReconciled(run_id=RUN_ID, seq=5, ts=1, step_id="s0", outcome="not_applied", evidence="e", operator="o"),
        ev.RunResumed(run_id=RUN_ID, seq=6, ts=1),
    ]
    state = replay(history)
    assert ("pending", 2, "") == (state.steps["s0"].state, state.steps["s0"].attempt, state.steps["s0"].idempotency_key)
    with pytest.raises(IllegalTransition, match="attempt 1") as info:
        apply(state, _request(7, "x", attempt=1))
    assert (RUN_ID, 7, "s0") == where(info.value)
    retried = apply(state, _request(7, "x", attempt=2)).steps["s0"]
    assert ("requested", 2) == (retried.state, retried.attempt)


def test_step_outside_the_plan_is_illegal() -> None:
    """A plan run only accepts events for the steps its plan names."""
    state = replay([started(("s0",))])
    event = ev.StepRequested(
        run_id=RUN_ID, seq=2, ts=1, step_id="nope", adapter="a", idempotency_key="k", args_digest="x"
    )
    with pytest.raises(IllegalTransition, match="not in the run's plan") as info:
        apply(state, event)
    assert (RUN_ID, 2, "nope") == where(info.value)


def test_step_event_before_run_started_is_illegal() -> None:
    """A created run admits no step event: the run must start first."""
    with pytest.raises(IllegalTransition) as info:
        apply(initial(RUN_ID), _request(1, "x"))
    assert (RUN_ID, 1, "s0") == where(info.value)


# -- replay_records checks the chain over the stored bytes ------------------------------


@given(history=legal_histories(), keyed=st.booleans())
def test_replay_records_equals_replay_and_ends_on_the_chain_head(history: list[ev.Event], keyed: bool) -> None:
    """Untouched records replay to the same state as the events, with head = the last stored hash."""
    chain = Chain(b"secret" if keyed else None)
    records = records_of(history, chain)
    state = replay_records(records, chain, run_id=history[0].run_id)
    assert msgspec.structs.replace(replay(history), head=records[-1].hash) == state


@given(history=legal_histories(), data=st.data())
def test_replay_records_detects_one_changed_byte_at_its_seq(history: list[ev.Event], data: st.DataObject) -> None:
    """Flipping any bit pattern of any one stored byte is an integrity failure at that record's seq:
    ChainBroken, or CorruptEvent when the flip rewrote the body's own run id or seq, so that the row's
    columns now disagree with it (the column check names that; both are exit 7)."""
    chain = Chain()
    records = records_of(history, chain)
    i = data.draw(st.integers(0, len(records) - 1), label="record")
    body = bytearray(records[i].body)
    j = data.draw(st.integers(0, len(body) - 1), label="byte")
    body[j] ^= data.draw(st.integers(1, 255), label="mask")
    records[i] = msgspec.structs.replace(records[i], body=bytes(body))
    with pytest.raises((ChainBroken, CorruptEvent)) as info:
        replay_records(records, chain, run_id=history[0].run_id)
    assert (history[0].run_id, records[i].seq) == where(info.value)[:2]
    if isinstance(info.value, CorruptEvent):
        assert info.value.fields["column"] in ("run_id", "seq")


@given(history=legal_histories().filter(lambda h: len(h) > 1), data=st.data())
def test_replay_records_detects_a_lost_record(history: list[ev.Event], data: st.DataObject) -> None:
    """A record removed from the middle breaks the chain at the record that follows it."""
    records = records_of(history, Chain())
    i = data.draw(st.integers(0, len(records) - 2), label="lost")
    with pytest.raises(ChainBroken) as info:
        replay_records(records[:i] + records[i + 1 :], Chain(), run_id=history[0].run_id)
    assert records[i + 1].seq == info.value.seq


def test_replay_records_with_the_wrong_key_breaks_at_seq_1() -> None:
    """A keyed chain cannot be verified with another key: the first record already fails."""
    records = records_of(sample_run(RUN_ID), Chain(b"right"))
    with pytest.raises(ChainBroken) as info:
        replay_records(records, Chain(b"wrong"), run_id=RUN_ID)
    assert (RUN_ID, 1) == (info.value.run_id, info.value.seq)


def test_replay_records_refuses_a_body_that_does_not_decode() -> None:
    """A correctly chained body that is not an event is CorruptEvent at its seq."""
    chain = Chain()
    good = records_of(sample_run(RUN_ID), chain)[:2]
    bad_body = b'{"type":"step.nonsense","run_id":"run-1","seq":3,"ts":0}'
    good.append(Record(RUN_ID, 3, bad_body, chain.link(good[-1].hash, bad_body)))
    with pytest.raises(CorruptEvent) as info:
        replay_records(good, chain, run_id=RUN_ID)
    assert (RUN_ID, 3) == (info.value.run_id, info.value.seq)


def test_replay_records_refuses_a_body_that_disagrees_with_its_row() -> None:
    """A record whose row seq differs from the seq inside its body is CorruptEvent."""
    chain = Chain()
    records = records_of(sample_run(RUN_ID), chain)
    records[1] = msgspec.structs.replace(records[1], seq=7)
    with pytest.raises(CorruptEvent, match="disagrees") as info:
        replay_records(records, chain, run_id=RUN_ID)
    assert (RUN_ID, 7) == (info.value.run_id, info.value.seq)


def test_replay_records_continues_from_a_state() -> None:
    """Replaying the stored rest onto a replayed prefix gives the same state (and head) as all at once."""
    chain = Chain()
    records = records_of(sample_run(RUN_ID), chain)
    prefix = replay_records(records[:3], chain, run_id=RUN_ID)
    assert replay_records(records, chain, run_id=RUN_ID) == replay_records(records[3:], chain, prefix, run_id=RUN_ID)


def test_walk_helper_agrees_with_sample_run() -> None:
    """The walk model accepts the shipped sample run and ends completed (guards the test oracle itself)."""
    walk = walk_to(*sample_run(RUN_ID, steps=2), plan_steps=("s0", "s1"))
    assert ("completed", {"s0": "confirmed", "s1": "confirmed"}) == (
        walk.run_state,
        {sid: m.state for sid, m in walk.steps.items()},
    )


def test_a_resume_pins_an_effect_store_only_for_a_run_that_has_none() -> None:
    """``run.resumed`` naming a store pins it for a run that started without one (the next resume is
    checked against it), and is illegal for a run that has one pinned already (two stores for one run)."""
    store_a = ev.EffectStoreIdentity(store_id="es-a", path="/fx/a.db")
    store_b = ev.EffectStoreIdentity(store_id="es-b", path="/fx/b.db")
    unpinned = replay([started(), ev.RunResumed(run_id=RUN_ID, seq=2, ts=2, effect_store=store_a)])
    pinned = apply(initial(RUN_ID), msgspec.structs.replace(started(), effect_store=store_a))
    with pytest.raises(IllegalTransition) as info:
        apply(pinned, ev.RunResumed(run_id=RUN_ID, seq=2, ts=2, effect_store=store_b))
    assert (store_a, 2) == (unpinned.effect_store, info.value.seq)
