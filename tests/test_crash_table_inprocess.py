"""The published crash matrix's table (the one effectlog reproduces), in-process.

| case                                   | effects | outcome                        |
|----------------------------------------|---------|--------------------------------|
| idempotent: after request              | 1       | resumed with the same key      |
| idempotent: after effect               | 1       | existing receipt recovered     |
| idempotent: after confirmation         | 1       | recorded result rebuilt        |
| not idempotent: after request          | 0       | stopped, unresolved            |
| not idempotent: after effect           | 1       | stopped, reconciled by ledger  |
| not idempotent: after confirmation     | 1       | recorded result rebuilt        |
| reference: blind retry                 | 2       | duplicated effect              |
| control without a crash                | 1       | completed                      |

A crash is ``SimulatedCrash`` raised by the runtime's crash hook: the run actor stops
dead, writing nothing more. A NEW runtime (the old one closed, its lock released)
then resumes by running the same plan again. Effects are counted in the separate
effect store, never in the journal. Real SIGKILL crashes are tested elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.adapters import EffectStore, idempotency_key
from effectlog.blind import blind_run
from effectlog.errors import ExitStatus
from effectlog.plan import Plan, parse_plan
from effectlog.reconcile import LEDGER_OPERATOR
from effectlog.runtime import RunOutcome, Runtime, SimulatedCrash, reconcile_hint

STEP = "charge"
POINTS = ("after_request", "after_effect", "after_confirm")


def make_plan(run_id: str, adapter_type: str) -> Plan:
    idempotent = adapter_type == "effects.idempotent"
    return parse_plan(
        (
            f'{{"run_id": "{run_id}", '
            f'"adapters": {{"tool": {{"type": "{adapter_type}", "version": "1", '
            f'"idempotent": {"true" if idempotent else "false"}}}}}, '
            f'"steps": [{{"id": "{STEP}", "adapter": "tool", "args": {{"amount_cents": 1299}}}}]}}'
        ).encode()
    )


def crash_at(point: str) -> Callable[[str, str], None]:
    """A crash hook that kills the run actor at ``point`` of the step, and nowhere else."""

    def hook(where: str, step_id: str) -> None:
        if where == point and step_id == STEP:
            raise SimulatedCrash(f"{point}:{step_id}")

    return hook


class Paths:
    def __init__(self, tmp_path: Path) -> None:
        self.journal = str(tmp_path / "journal.db")
        self.effects = str(tmp_path / "effects.db")


def crash_once(paths: Paths, plan: Plan, point: str) -> None:
    """Run the plan until the crash hook fires at ``point``; then drop the runtime like a dead process would."""
    rt = Runtime(paths.journal, effects=paths.effects, crash_hook=crash_at(point))
    try:
        with pytest.raises(SimulatedCrash):
            rt.run(plan)
    finally:
        rt.close()


def resume(paths: Paths, plan: Plan) -> RunOutcome:
    """A fresh runtime (a new process, in spirit) runs the same plan again."""
    with Runtime(paths.journal, effects=paths.effects) as rt:
        return rt.run(plan)


def effects_of(paths: Paths, run_id: str) -> int:
    store = EffectStore(paths.effects)
    try:
        return store.count(run_id=run_id)
    finally:
        store.close()


def tags_of(paths: Paths, run_id: str) -> list[str]:
    with Runtime(paths.journal) as rt:
        return [ev.tag_of(ev.decode(r.body)) for r in rt.journal.read(run_id)]


@dataclass(frozen=True)
class Row:
    """One row of the table: how it is produced, and what the run and the store must say."""

    adapter_type: str
    point: str | None  # the crash point; None: no crash
    effects: int  # the table's "final effects"
    state: str  # the run's state after the first resume ("stopped" = detenido)
    exit_status: int
    resume_calls: int  # adapter calls made by the first resume
    reconcile_from_ledger: bool = False  # then resume again; the run must complete
    blind: bool = False  # the blind-retry reference instead of effectlog


DONE, STOPPED = int(ExitStatus.DONE), int(ExitStatus.STOPPED_UNCERTAIN)
ROWS = {
    "idempotent-after-request": Row("effects.idempotent", "after_request", 1, "completed", DONE, 1),
    "idempotent-after-effect": Row("effects.idempotent", "after_effect", 1, "completed", DONE, 1),
    "idempotent-after-confirm": Row("effects.idempotent", "after_confirm", 1, "completed", DONE, 0),
    "control-after-request": Row("effects.control", "after_request", 0, "stopped", STOPPED, 0),
    "control-after-effect": Row(
        "effects.control", "after_effect", 1, "stopped", STOPPED, 0, reconcile_from_ledger=True
    ),
    "control-after-confirm": Row("effects.control", "after_confirm", 1, "completed", DONE, 0),
    "blind-retry-reference": Row("effects.control", "after_effect", 2, "", 0, 1, blind=True),
    "control-no-crash": Row("effects.control", None, 1, "completed", DONE, 1),
}


def test_the_table_has_the_published_counts() -> None:
    """The rows below are the seed's table, in its order: 1, 1, 1, 0, 1, 1, 2, 1 effects."""
    assert [1, 1, 1, 0, 1, 1, 2, 1] == [row.effects for row in ROWS.values()]


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_each_row_ends_with_the_tables_effect_count(tmp_path: Path, row: Row) -> None:
    """Each row reproduced in-process: a crash at the row's point, then a resume by a new
    runtime (plus a ledger reconciliation and another resume where the table says so), or the
    blind-retry reference, or no crash. The effect store ends with exactly the table's count,
    and the run ends in the state and exit status the table names."""
    paths = Paths(tmp_path)
    plan = make_plan("r-" + (row.point or "none"), row.adapter_type)
    if row.blind:
        results = tmp_path / "blind-results.json"
        with pytest.raises(SimulatedCrash):
            blind_run(plan, results, effects=paths.effects, crash_hook=crash_at(row.point or ""))
        assert row.resume_calls == blind_run(plan, results, effects=paths.effects)
        assert row.effects == effects_of(paths, plan.run_id)
        return
    if row.point is not None:
        crash_once(paths, plan, row.point)

    outcome = resume(paths, plan)

    assert (row.state, row.exit_status, row.resume_calls) == (
        outcome.state,
        outcome.exit_status,
        outcome.adapter_calls,
    )
    if row.reconcile_from_ledger:
        with Runtime(paths.journal, effects=paths.effects) as rt:
            rt.reconcile_from_ledger(plan.run_id, STEP)
        final = resume(paths, plan)
        assert ("completed", DONE, 0) == (final.state, final.exit_status, final.adapter_calls)
    assert row.effects == effects_of(paths, plan.run_id)


def test_control_after_effect_reconciled_from_the_ledger_completes_with_one_effect(tmp_path: Path) -> None:
    """Not idempotent, crash after the effect: the resume stops (exit 3) rather than guess; an
    automated ledger inspection finds the effect and reconciles it as applied; the next resume
    completes without calling the tool again. One effect in the end, as the table says."""
    paths = Paths(tmp_path)
    plan = make_plan("r-ctl-effect", "effects.control")
    crash_once(paths, plan, "after_effect")
    stopped = resume(paths, plan)
    assert ("stopped", int(ExitStatus.STOPPED_UNCERTAIN)) == (stopped.state, stopped.exit_status)

    with Runtime(paths.journal, effects=paths.effects) as rt:
        state = rt.reconcile_from_ledger(plan.run_id, STEP)
    step = state.step(STEP)
    assert step is not None
    assert ("reconciled", "applied", LEDGER_OPERATOR, True) == (
        step.state,
        step.outcome,
        step.operator,
        step.automated,
    )
    assert step.evidence is not None
    assert step.evidence.startswith("automated ledger inspection, not a person")

    done = resume(paths, plan)

    assert ("completed", int(ExitStatus.DONE), 0) == (done.state, done.exit_status, done.adapter_calls)
    assert 1 == effects_of(paths, plan.run_id)


def test_control_after_request_stops_with_zero_effects_and_names_the_reconcile_command(tmp_path: Path) -> None:
    """Not idempotent, crash after the request: the resume records the step as uncertain, stops
    (exit 3) with zero effects, and its message names the step and the exact reconcile command."""
    paths = Paths(tmp_path)
    plan = make_plan("r-ctl-request", "effects.control")
    crash_once(paths, plan, "after_request")

    outcome = resume(paths, plan)

    assert 0 == effects_of(paths, plan.run_id)
    assert ("stopped", int(ExitStatus.STOPPED_UNCERTAIN), STEP) == (
        outcome.state,
        outcome.exit_status,
        outcome.step_id,
    )
    assert f"step {STEP!r}" in outcome.message
    assert reconcile_hint(paths.journal, plan.run_id, STEP, 1) in outcome.message
    assert [("charge", "uncertain", 1)] == [(s.id, s.state, s.attempt) for s in outcome.steps]
    assert ["step.uncertain", "run.stopped"] == tags_of(paths, plan.run_id)[-2:]


def test_control_after_request_stays_stopped_on_every_further_resume(tmp_path: Path) -> None:
    """An unresolved uncertain step stays stopped: further resumes call no tool and write nothing."""
    paths = Paths(tmp_path)
    plan = make_plan("r-ctl-again", "effects.control")
    crash_once(paths, plan, "after_request")
    resume(paths, plan)
    before = tags_of(paths, plan.run_id)

    again = resume(paths, plan)

    assert ("stopped", 0, 0) == (again.state, again.adapter_calls, again.events_written)
    assert before == tags_of(paths, plan.run_id)
    assert 0 == effects_of(paths, plan.run_id)


def test_idempotent_after_request_is_resent_with_the_same_key(tmp_path: Path) -> None:
    """Idempotent, crash after the request: the resume re-sends the SAME key (step.resent), and
    the one effect in the store carries the key of attempt 1."""
    paths = Paths(tmp_path)
    plan = make_plan("r-idem-request", "effects.idempotent")
    crash_once(paths, plan, "after_request")

    resume(paths, plan)

    store = EffectStore(paths.effects)
    try:
        rows = store.rows(run_id=plan.run_id)
    finally:
        store.close()
    assert [idempotency_key(plan.run_id, STEP, 1)] == [r.idempotency_key for r in rows]
    tags = tags_of(paths, plan.run_id)
    assert 1 == tags.count("step.resent")
    assert 1 == tags.count("step.requested")


def test_idempotent_after_effect_recovers_the_existing_receipt(tmp_path: Path) -> None:
    """Idempotent, crash after the effect: the re-sent key finds the stored receipt, which the
    journal records (marked replayed) instead of a second effect."""
    paths = Paths(tmp_path)
    plan = make_plan("r-idem-effect", "effects.idempotent")
    crash_once(paths, plan, "after_effect")

    resume(paths, plan)

    store = EffectStore(paths.effects)
    try:
        (row,) = store.rows(run_id=plan.run_id)
    finally:
        store.close()
    with Runtime(paths.journal) as rt:
        step = rt.load(plan.run_id).step(STEP)
    assert step is not None
    assert {**row.receipt, "replayed": True} == step.receipt


@pytest.mark.parametrize("adapter_type", ["effects.idempotent", "effects.control"])
def test_after_confirm_rebuilds_the_recorded_result_without_a_tool_call(tmp_path: Path, adapter_type: str) -> None:
    """Crash after the confirmation, either adapter: the resume reuses the recorded receipt
    (the one the store holds), calls no tool, and only closes the run."""
    paths = Paths(tmp_path)
    plan = make_plan("r-confirm", adapter_type)
    crash_once(paths, plan, "after_confirm")

    outcome = resume(paths, plan)

    store = EffectStore(paths.effects)
    try:
        (row,) = store.rows(run_id=plan.run_id)
    finally:
        store.close()
    with Runtime(paths.journal) as rt:
        step = rt.load(plan.run_id).step(STEP)
    assert step is not None
    assert (row.receipt, "confirmed") == (step.receipt, step.state)
    assert 0 == outcome.adapter_calls
    assert ["run.resumed", "run.completed"] == tags_of(paths, plan.run_id)[-2:]
