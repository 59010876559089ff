"""The soak: SIGKILL a worker at random moments (not at checkpoints), over and over.

Each kill is followed by a fresh worker process that resumes the run; a run that
stops on an uncertain step is reconciled automatically from the ledger, as an
operator with that evidence would. When the kill budget is spent, the current run
is driven to completion. Then the invariants are checked against the journal and
the independent effect store, and reported as counts.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.crashmatrix.processes import START, effectlog_argv, run_process
from effectlog.errors import EffectlogError
from effectlog.journal import load_run, open_journal

Progress = Callable[[str], None]


class SoakResult(msgspec.Struct, kw_only=True):
    seed: int
    kills_requested: int
    kills: int = 0
    processes: int = 0
    runs: int = 0
    steps_per_run: int = 0
    resumes: int = 0
    uncertain: int = 0
    reconciled_applied: int = 0
    reconciled_not_applied: int = 0
    resends: int = 0
    effects: int = 0
    idempotent_steps: int = 0
    idempotent_exactly_once: int = 0
    control_steps: int = 0
    control_at_most_once: int = 0
    unknown_outcomes_reexecuted_without_reconciliation: int = 0
    confirmed_results: int = 0
    confirmed_results_surviving: int = 0
    runs_verified: int = 0
    violations: int = 0
    problems: list[str] = []


def soak_plan(run_id: str, steps: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "adapters": {
            "ledger": {"type": "effects.idempotent", "version": "1", "idempotent": True},
            "notify": {"type": "effects.control", "version": "1", "idempotent": False},
        },
        "steps": [
            {"id": f"s{i:02d}", "adapter": "ledger" if i % 2 == 0 else "notify", "args": {"n": i}} for i in range(steps)
        ],
    }


def _blocked_step(journal: str, run_id: str) -> str | None:
    j = open_journal(journal, writer=False)
    try:
        return load_run(j, run_id).blocked_step
    finally:
        j.close()


def run_soak(workdir: Path, *, kills: int, seed: int, steps: int, progress: Progress | None = None) -> SoakResult:
    rng = random.Random(seed)
    journal, effects = str(workdir / "journal.db"), workdir / "effects.db"
    result = SoakResult(seed=seed, kills_requested=kills, steps_per_run=steps)
    run_ids: list[str] = []

    def new_run() -> tuple[str, Path]:
        run_id = f"soak-{seed}-{len(run_ids) + 1:03d}"
        run_ids.append(run_id)
        path = workdir / f"{run_id}.json"
        path.write_text(json.dumps(soak_plan(run_id, steps)))
        return run_id, path

    def worker(plan: Path, kill_after: float | None) -> tuple[int | None, float]:
        argv = effectlog_argv(
            "crash-matrix", "worker", "--plan", str(plan), "--journal", journal, "--effects", str(effects)
        )
        rec = run_process("worker", argv, arm=START, kill_after_s=kill_after)
        result.processes += 1
        return rec.exit_status, rec.after_reached_s

    # Calibrate: how long does one uninterrupted run take here, from its start?
    _, calibration = new_run()
    status, full = worker(calibration, None)
    if status != 0:
        result.problems.append(f"calibration run exited {status}")
    run_id, plan = new_run()
    finishing = False
    while True:
        kill_after = None if finishing else rng.uniform(0.0, full)
        status, _ = worker(plan, kill_after)
        if status is None:
            result.kills += 1
            if progress is not None and result.kills % 10 == 0:
                progress(f"soak: {result.kills}/{kills} kills, {len(run_ids) - 1} run(s)")
            if result.kills >= kills:
                finishing = True
            continue
        if status == 3:  # stopped on an uncertain step: reconcile from the ledger, then resume
            step = _blocked_step(journal, run_id)
            rec = run_process(
                "reconcile",
                effectlog_argv(
                    "reconcile",
                    "--journal",
                    journal,
                    "--run-id",
                    run_id,
                    "--step",
                    str(step),
                    "--from-ledger",
                    str(effects),
                ),
            )
            result.processes += 1
            if rec.exit_status != 0:
                result.problems.append(f"{run_id}: reconcile of {step} exited {rec.exit_status}: {rec.stderr_tail}")
                break
            continue
        if status != 0:
            result.problems.append(f"{run_id}: worker exited {status}")
            break
        if finishing:
            break
        run_id, plan = new_run()
    check_invariants(result, journal, effects, run_ids)
    return result


def check_invariants(result: SoakResult, journal_path: str, effects_path: Path, run_ids: list[str]) -> None:
    store = EffectStore(effects_path)
    journal = open_journal(journal_path, writer=False)
    try:
        rows = store.rows()
        per_step = Counter((r.run_id, r.step_id) for r in rows)
        by_id = {r.effect_id: r for r in rows}
        result.effects = len(rows)
        result.runs = len(run_ids)
        for run_id in run_ids:
            try:
                state = load_run(journal, run_id)
            except EffectlogError as exc:
                result.problems.append(f"{run_id}: journal does not verify: {exc}")
                continue
            result.runs_verified += 1
            if state.state != "completed":
                result.problems.append(f"{run_id}: ended {state.state}, not completed")
            events = [ev.decode(r.body) for r in journal.read(run_id)]
            _check_run(result, run_id, events, per_step, by_id)
    finally:
        store.close()
        journal.close()
    result.violations = len(result.problems)


def _check_run(
    result: SoakResult,
    run_id: str,
    events: list[ev.AnyEvent],
    per_step: Counter[tuple[str, str]],
    by_id: dict[int, Any],
) -> None:
    idempotent: dict[str, bool] = {}
    doubted: set[str] = set()
    for e in events:
        if isinstance(e, ev.RunResumed):
            result.resumes += 1
        elif isinstance(e, ev.StepRequested):
            idempotent[e.step_id] = e.idempotent
            if e.step_id in doubted:
                result.unknown_outcomes_reexecuted_without_reconciliation += 1
                result.problems.append(
                    f"{run_id}/{e.step_id}: re-requested after an unknown outcome without a reconciliation"
                )
        elif isinstance(e, ev.StepResent):
            result.resends += 1
        elif isinstance(e, ev.StepUncertain):
            result.uncertain += 1
            doubted.add(e.step_id)
        elif isinstance(e, ev.StepReconciled):
            doubted.discard(e.step_id)
            if e.outcome == "applied":
                result.reconciled_applied += 1
            else:
                result.reconciled_not_applied += 1
        elif isinstance(e, ev.StepEffected):
            result.confirmed_results += 1
            effect_id = e.receipt.get("effect_id") if isinstance(e.receipt, dict) else None
            row = by_id.get(effect_id) if isinstance(effect_id, int) else None
            if row is not None and row.run_id == run_id and row.step_id == e.step_id:
                result.confirmed_results_surviving += 1
            else:
                result.problems.append(f"{run_id}/{e.step_id}: recorded receipt {e.receipt} has no effect row")
    for step_id, is_idem in idempotent.items():
        n = per_step[(run_id, step_id)]
        if is_idem:
            result.idempotent_steps += 1
            if n == 1:
                result.idempotent_exactly_once += 1
            else:
                result.problems.append(f"{run_id}/{step_id}: idempotent step has {n} effects")
        else:
            result.control_steps += 1
            if n <= 1:
                result.control_at_most_once += 1
            else:
                result.problems.append(f"{run_id}/{step_id}: non-idempotent step has {n} effects")


def save_soak(result: SoakResult, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=1) + b"\n")


def render_soak(result: SoakResult) -> str:
    rows = [
        ("kills (SIGKILL at random moments)", result.kills),
        ("worker processes started", result.processes),
        ("runs completed and verified", f"{result.runs_verified}/{result.runs}"),
        ("resumes recorded", result.resumes),
        ("uncertain steps (stopped, not guessed)", result.uncertain),
        (
            "ledger reconciliations: applied / not applied",
            f"{result.reconciled_applied} / {result.reconciled_not_applied}",
        ),
        ("idempotent re-sends with the same key", result.resends),
        ("idempotent steps with exactly one effect", f"{result.idempotent_exactly_once}/{result.idempotent_steps}"),
        ("non-idempotent steps with at most one effect", f"{result.control_at_most_once}/{result.control_steps}"),
        (
            "unknown outcomes re-executed without reconciliation",
            result.unknown_outcomes_reexecuted_without_reconciliation,
        ),
        (
            "confirmed results surviving in the effect store",
            f"{result.confirmed_results_surviving}/{result.confirmed_results}",
        ),
        ("violations", result.violations),
    ]
    width = max(len(r[0]) for r in rows)
    text = [f"soak (seed {result.seed}, {result.steps_per_run} steps per run)"]
    text += [f"  {name.ljust(width)}  {value}" for name, value in rows]
    text += [f"  ! {p}" for p in result.problems]
    return "\n".join(text) + "\n"
