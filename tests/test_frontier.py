"""A resume from the last checkpoint segment alone (``journal/frontier.py``) knows every step: the
lazy step map answers each step exactly as the full replay does, before and after its done steps
are loaded, over random legal histories, random segment points and random cut points; the
frontier ``verify`` checks is the one the writer's tracker wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.chain import Chain
from effectlog.errors import CorruptEvent
from effectlog.fold import RunState, StepState, replay, replay_records, replay_records_fast
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, checkpoint, load_run, resume_point
from effectlog.journal import frontier as fr
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash
from strategies import legal_histories
from test_fold_fast import records_of, through_crash_stages


def _plan_ids(history: list[ev.Event]) -> list[str]:
    started = history[0]
    assert isinstance(started, ev.RunStarted)
    return [s["id"] for s in (started.plan or {})["steps"]]


def _written(history: list[ev.Event], points: list[int], ids: list[str]) -> list[tuple[int, fr.Frontier]]:
    """The frontiers the actor's tracker writes with segments at ``points`` (seqs of open states), as
    stored and decoded (slim steps, JSON round trip); each one also passes ``verify``'s check."""
    tracker, last, out, proved = fr.Tracker(ids), 0, [], 0
    positions = {sid: i for i, sid in enumerate(ids)}
    for seq in points:
        state = replay(history[:seq])
        changed = {e.step_id for e in history[last:seq] if isinstance(e, ev.StepEvent)}
        tracker, front = tracker.advance(state, changed)
        _, _, body = checkpoint.segment_row(state, changed, front)
        stored = checkpoint._decode(body).frontier
        assert stored is not None
        assert front == stored
        proved = fr.check(stored, state, ids, positions, proved)
        out.append((seq, stored))
        last = seq
    return out


def _lazy(front: fr.Frontier, ids: list[str], load: Any) -> fr.LazySteps:
    return fr.LazySteps.at(front, ids, {sid: i for i, sid in enumerate(ids)}, load)


@settings(max_examples=300, deadline=None)
@given(history=legal_histories(max_events=60), data=st.data())
def test_the_lazy_state_equals_the_full_replay_for_every_step_and_field(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """Segments at random open points, a resume at a random later cut: the state built from the
    last segment's frontier plus the events after it equals the full replay at the cut (every run
    field, every step), and before anything is loaded each step's ``get``, ``done``, membership and
    the step count already agree with the full replay (a fresh map per question, so no answer
    comes from an earlier load). A non-existent step is "no state" in both."""
    ids = _plan_ids(history)
    chain = Chain()
    records = records_of(history, chain)
    run_id = history[0].run_id
    open_points = [i for i in range(1, len(history) + 1) if not replay(history[:i]).closed]
    points = sorted(data.draw(st.sets(st.sampled_from(open_points), min_size=1), label="segments"))
    written = _written(history, points, ids)
    seg_seq, front = written[-1]
    cut = data.draw(st.integers(seg_seq, len(history)), label="cut")
    full = replay_records(records[:cut], chain, run_id=run_id)
    at_segment = replay(history[:seg_seq])
    # The loader may run later than the resume, on a longer journal: done steps never change.
    later = data.draw(st.sampled_from([seg_seq, cut, len(history)]), label="loaded at")
    loaded = replay(history[:later]).steps

    def base(steps: Any) -> RunState:
        state = checkpoint.state_at(
            checkpoint._decode(checkpoint.segment_row(at_segment, [])[2]), records[seg_seq - 1].hash, steps
        )
        return msgspec.structs.replace(state, plan=full.plan, plan_steps=full.plan_steps)

    def resumed() -> RunState:
        return replay_records_fast(records[seg_seq:cut], chain, base(_lazy(front, ids, lambda: loaded)), run_id=run_id)

    for sid in [*ids, "not-a-step"]:
        steps: Any = resumed().steps
        assert full.steps.get(sid) == steps.get(sid)
        assert (full.steps.get(sid) is not None and full.steps[sid].done) == fr.is_done(resumed().steps, sid)
        assert (sid in full.steps) == (sid in resumed().steps)
    assert len(full.steps) == len(resumed().steps)
    assert all(full.steps[sid].done for sid in ids[: front.prefix])
    assert full == resumed()
    assert full == fr.loaded(resumed())
    # The resumed actor's next segment: its tracker, started from the stored frontier and given the
    # steps the tail touched, writes what a tracker that saw the whole history writes.
    if cut > seg_seq and not full.closed:
        touched = {e.step_id for e in history[seg_seq:cut] if isinstance(e, ev.StepEvent)}
        _, resumed_front = fr.Tracker.of(ids, front).advance(resumed(), touched)
        assert _written(history, [*points, cut], ids)[-1][1] == resumed_front


@settings(max_examples=100, deadline=None)
@given(history=legal_histories(max_events=40), data=st.data())
def test_a_frontier_that_does_not_account_for_every_step_is_refused(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """``verify`` refuses a frontier with a step dropped from ``open`` or ``done_after``, moved from one
    to the other, or a prefix one too long; the same dropped step makes the frontier inconsistent, so a
    resume does not use it either."""
    ids = _plan_ids(history)
    open_points = [i for i in range(1, len(history) + 1) if not replay(history[:i]).closed]
    seq = data.draw(st.sampled_from(open_points), label="segment")
    ((_, front),) = _written(history, [seq], ids)
    state = replay(history[:seq])
    positions = {sid: i for i, sid in enumerate(ids)}
    dropped: list[fr.Frontier] = []  # a step left out, the count kept: inconsistent on its face
    if front.open:
        dropped.append(msgspec.structs.replace(front, open=front.open[1:]))
    if front.done_after:
        dropped.append(msgspec.structs.replace(front, done_after=front.done_after[1:]))
    shifted: list[fr.Frontier] = []  # consistent counts, wrong steps: only the replay shows it
    if front.done_after:
        shifted.append(msgspec.structs.replace(front, done_after=front.done_after[1:], prefix=front.prefix + 1))
    if front.prefix < len(ids):
        shifted.append(msgspec.structs.replace(front, prefix=front.prefix + 1, count=front.count + 1))
    for wrong in dropped + shifted:
        with pytest.raises(CorruptEvent):
            fr.check(wrong, state, ids, positions, 0)
    assert [False] * len(dropped) == [wrong.consistent() for wrong in dropped]


def test_a_done_step_the_segments_do_not_have_stops_the_load() -> None:
    """A frontier that names a step done which the loaded states lack (or hold not done): the load
    raises ``CorruptEvent`` instead of answering "no state" (which would run the step again)."""
    front = fr.Frontier(prefix=2, count=2)
    only_one = {"a": StepState(step_id="a", index=0, state="confirmed")}
    with pytest.raises(CorruptEvent):
        _lazy(front, ["a", "b"], lambda: only_one).get("b")
    not_done = {**only_one, "b": StepState(step_id="b", index=1, state="requested")}
    with pytest.raises(CorruptEvent):
        list(_lazy(front, ["a", "b"], lambda: not_done).values())
    assert fr.is_done(_lazy(front, ["a", "b"], lambda: {}), "b")  # known done without loading anything


@pytest.mark.parametrize("every", [1, 2, 3, 5])
@pytest.mark.parametrize("point", ["after_request", "after_effect", "after_confirm"])
def test_a_real_run_cut_anywhere_resumes_lazily_into_the_full_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int, point: str
) -> None:
    """Real runs (SQLite, segments every 1-5 events) stopped at each step: the resume reads the last
    segment only (its step map is lazy, its walk starts at the done prefix) and, with the journal
    still open, equals the full replay; driven on, the run completes and verifies."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", every)
    plan = Plan(
        run_id="r",
        adapters={"t": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="t", args={"i": i}) for i in range(8)),
    )
    for stop in range(1, 8):
        path = tmp_path / f"{stop}.db"

        def hook(where: str, sid: str, stop: int = stop) -> None:
            if where == point and sid == f"s{stop}":
                raise SimulatedCrash(where)

        with Runtime(path, crash_hook=hook) as rt, pytest.raises(SimulatedCrash):
            rt.run(plan)
        with SqliteJournal(path) as journal:
            resumed = resume_point(journal, "r", plan)
            assert isinstance(resumed.state.steps, fr.LazySteps)
            full = load_run(journal, "r")
            assert all(full.steps[f"s{i}"].done for i in range(resumed.skip))
            assert full == resumed.state
        with Runtime(path) as rt:
            assert "completed" == rt.run(plan).state
        with SqliteJournal(path, writer=False) as journal:
            assert load_run(journal, "r") == verify_run(journal, "r")


@pytest.mark.parametrize("point", ["after_request", "after_effect", "after_confirm", "before_commit"])
@pytest.mark.parametrize("adapter_type", ["effects.idempotent", "effects.control"])
def test_the_lazy_resume_equals_the_full_replay_on_crash_matrix_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, adapter_type: str
) -> None:
    """The journals the crash matrix leaves (crashed at each boundary, then resumed; a stopped run
    reconciled from the ledger and resumed again), with a segment in every batch: at every stage an
    open run resumes from its last segment's frontier (lazy map) into the full replay's state."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)

    def compare(journal_path: Path, plan: Plan) -> None:
        with SqliteJournal(journal_path) as journal:
            full = load_run(journal, "crash")
            if full.closed:
                return
            resumed = resume_point(journal, "crash", plan)
            assert isinstance(resumed.state.steps, fr.LazySteps)
            assert full == resumed.state

    journal_path = through_crash_stages(tmp_path, point, adapter_type, compare)
    with SqliteJournal(journal_path, writer=False) as journal:
        assert load_run(journal, "crash") == verify_run(journal, "crash")


def test_a_journal_whose_segments_have_no_frontier_resumes_from_every_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments written before frontiers existed (none in their body): the resume folds every segment
    as before (a full step map, not a lazy one) into the full replay's state; the segments the
    resumed run then writes carry a frontier, the next resume is lazy, and everything verifies."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 2)
    plan = Plan(
        run_id="r",
        adapters={"t": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="t") for i in range(10)),
    )
    path = tmp_path / "j.db"

    def stop_at(step: str) -> Any:
        def hook(where: str, sid: str) -> None:
            if where == "after_confirm" and sid == step:
                raise SimulatedCrash(where)

        return hook

    with monkeypatch.context() as old:
        old.setattr(fr.Tracker, "advance", lambda self, state, changed: (self, None))
        with Runtime(path, crash_hook=stop_at("s3")) as rt, pytest.raises(SimulatedCrash):
            rt.run(plan)
    with SqliteJournal(path) as journal:
        assert all(checkpoint._decode(row[3]).frontier is None for row in journal.stored_checkpoints("r"))
        resumed = resume_point(journal, "r", plan)
        assert not isinstance(resumed.state.steps, fr.LazySteps)
        assert 0 < resumed.segment_seq
        assert load_run(journal, "r") == resumed.state
    with Runtime(path, crash_hook=stop_at("s6")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(path) as journal:
        resumed = resume_point(journal, "r", plan)
        assert isinstance(resumed.state.steps, fr.LazySteps)
        assert load_run(journal, "r") == resumed.state
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan).state
    with SqliteJournal(path, writer=False) as journal:
        assert load_run(journal, "r") == verify_run(journal, "r")
