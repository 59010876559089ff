"""Sealed runs: a closed run's re-run answers from its seal, and the seal equals a full replay."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog.errors import ChainBroken, EventConflict
from effectlog.fold import replay
from effectlog.journal import SqliteJournal, load_resumable, load_run
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash, outcome_of
from effectlog.seal import seal_row, sealed_view, state_from_seal
from effectlog.testing import sample_run


def noop_plan(run_id: str, steps: int = 3, *, approval: bool = False) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(
            StepDecl(id=f"s{i}", adapter="noop", approval="required" if approval and i == steps - 1 else None)
            for i in range(steps)
        ),
    )


def deny_all(request: Any) -> str:
    return "deny"


CLOSINGS = {
    "completed": ({}, noop_plan("closed-completed")),
    "failed by policy": ({"policy": deny_all}, noop_plan("closed-denied")),
}


@pytest.mark.parametrize("name", sorted(CLOSINGS))
def test_the_seal_equals_the_full_replay_of_the_closed_run(tmp_path: Path, name: str) -> None:
    """The runtime seals a run when it closes; the seal's state is exactly what a full
    replay gives, projected on what a seal keeps (``sealed_view``)."""
    options, plan = CLOSINGS[name]
    with Runtime(tmp_path / "j.db", **options) as rt:
        outcome = rt.run(plan)
        found = rt.journal.sealed(plan.run_id)  # type: ignore[attr-defined]
        full = load_run(rt.journal, plan.run_id)
    assert full.closed
    assert found is not None
    assert sealed_view(full) == state_from_seal(*found)
    assert outcome.state == full.state


@pytest.mark.parametrize("name", sorted(CLOSINGS))
def test_rerunning_a_sealed_run_replays_nothing_and_reports_the_same_outcome(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-run of a closed run reads its seal, never the whole history: with the replay
    made to fail, the re-run returns exactly the outcome the fully replayed state stands for."""
    options, plan = CLOSINGS[name]
    with Runtime(tmp_path / "j.db", **options) as rt:
        rt.run(plan)
        expected = outcome_of(load_run(rt.journal, plan.run_id))

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("a sealed run was replayed")

    monkeypatch.setattr("effectlog.journal.replay_records_fast", no_replay)
    with Runtime(tmp_path / "j.db", **options) as rt:
        again = rt.run(plan)
    assert expected == again
    assert (0, 0) == (again.events_written, again.adapter_calls)


def test_an_open_run_has_no_seal_and_resumes_by_full_replay(tmp_path: Path) -> None:
    """Only closed runs are sealed: a run stopped by a crash is replayed in full on resume."""

    def crash(point: str, step_id: str) -> None:
        if point == "after_confirm" and step_id == "s1":
            raise SimulatedCrash(point)

    plan = noop_plan("open-1")
    with Runtime(tmp_path / "j.db", crash_hook=crash) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(tmp_path / "j.db") as rt:
        assert rt.journal.sealed(plan.run_id) is None  # type: ignore[attr-defined]
        assert load_run(rt.journal, plan.run_id) == load_resumable(rt.journal, plan.run_id)
        assert "completed" == rt.run(plan).state
        assert rt.journal.sealed(plan.run_id) is not None  # type: ignore[attr-defined]


def test_a_seal_not_bound_to_the_chain_head_refuses_the_rerun(tmp_path: Path) -> None:
    """A seal whose hash does not link to the run's last event is evidence of an edit, not a
    cache miss: the re-run raises ChainBroken (exit 7) and appends nothing."""
    plan = noop_plan("tampered")
    with Runtime(tmp_path / "j.db") as rt:
        rt.run(plan)
    db = sqlite3.connect(tmp_path / "j.db")
    with db:
        db.execute("DROP TRIGGER seals_append_only_update")
        db.execute("UPDATE seals SET hash = zeroblob(32)")
    db.close()
    with Runtime(tmp_path / "j.db") as rt:
        before = rt.journal.head(plan.run_id)
        assert rt.journal.sealed(plan.run_id) is None  # type: ignore[attr-defined]
        with pytest.raises(ChainBroken) as caught:
            rt.run(plan)
        assert (plan.run_id, before) == (caught.value.run_id, rt.journal.head(plan.run_id))


def test_the_seal_is_written_in_the_same_transaction_as_the_closing_event(tmp_path: Path) -> None:
    """A crash just before the closing commit leaves neither the closing event nor a seal."""

    def crash(point: str, step_id: str) -> None:
        if point == "before_commit:run.completed":
            raise SimulatedCrash(point)

    plan = noop_plan("atomic")
    with Runtime(tmp_path / "j.db", crash_hook=crash) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(tmp_path / "j.db", writer=False) as journal:
        assert "running" == load_run(journal, plan.run_id).state
        assert journal.sealed(plan.run_id) is None


@pytest.mark.parametrize("sql", ["UPDATE seals SET body = body", "DELETE FROM seals"])
def test_the_database_rejects_update_and_delete_of_seals(tmp_path: Path, sql: str) -> None:
    """Seals are append-only like events: the database itself refuses changes."""
    with Runtime(tmp_path / "j.db") as rt:
        rt.run(noop_plan("append-only"))
    db = sqlite3.connect(tmp_path / "j.db")
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"), db:
            db.execute(sql)
    finally:
        db.close()


def test_a_journal_without_the_seals_table_still_opens_and_replays(tmp_path: Path) -> None:
    """A journal written before seals existed: readers see no seal, a writer adds the table."""
    path = tmp_path / "j.db"
    with SqliteJournal(path) as journal:
        journal.append(sample_run("old"))
    db = sqlite3.connect(path)
    with db:
        db.execute("DROP TABLE seals")
    db.close()
    with SqliteJournal(path, writer=False) as reader:
        assert reader.sealed("old") is None
        assert "completed" == load_resumable(reader, "old").state
    with SqliteJournal(path) as writer:
        assert writer.sealed("old") is None
        assert writer._db.execute("SELECT name FROM sqlite_master WHERE name = 'seals'").fetchone()


def test_a_seal_must_follow_the_last_event_and_is_written_once(tmp_path: Path) -> None:
    """The journal binds a seal to its run's last event; a second, different seal is a conflict,
    the same seal again is a no-op."""
    history = sample_run("r")
    state = replay(history)
    row = seal_row(state)
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.append(history[:-1])
        with pytest.raises(Exception, match="last event"):
            journal.append_sealed([], [row])
        journal.append_sealed(history[-1:], [row])
        journal.append_sealed([], [row])
        other = (row[0], row[1], seal_row(replay(sample_run("r", steps=1)))[2])
        with pytest.raises(EventConflict):
            journal.append_sealed([], [other])
        found = journal.sealed("r")
        assert found is not None
        assert sealed_view(load_run(journal, "r")) == state_from_seal(*found)


@given(st.text("abc-_.:09", min_size=1, max_size=12), st.integers(1, 6), st.data())
def test_a_seal_round_trips_to_the_sealed_view_of_any_state(run_id: str, steps: int, data: st.DataObject) -> None:
    """Encoding a state as a seal and decoding it gives ``sealed_view`` of that state, for every
    prefix of a legal history (the runtime only seals closed runs; the encoding does not care)."""
    history = sample_run(run_id, steps)
    state = replay(history[: data.draw(st.integers(1, len(history)))])
    _, _, body = seal_row(state)
    assert sealed_view(state) == state_from_seal(body, state.head)


def test_a_seal_keeps_every_run_level_field_of_the_fold() -> None:
    """A field added to RunState must be sealed too, or verify finds every seal disagreeing with its replay."""
    from effectlog.fold import RunState
    from effectlog.seal import RunSeal

    # The plan is not sealed, the head is the chain's, steps are sealed apart, and the traceparent
    # only links a later drive's span (a closed run is never driven again): sealed_view drops them.
    derived = {"plan", "plan_steps", "head", "steps", "traceparent"}
    assert set() == set(RunState.__struct_fields__) - set(RunSeal.__struct_fields__) - derived
