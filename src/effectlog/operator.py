"""Shared plumbing for operator actions (approve, deny, reconcile): they only append.

An operator action runs while the run's loop is not running (a person decides
later, from another process), so it replays the run, checks the step is in the
state the action needs, and appends one atomic batch. Nothing is written when a
check fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from effectlog.errors import NotReconcilable, RunOwned, UnknownRun, UnknownStep
from effectlog.fold import RunState, StepState
from effectlog.journal import Journal, load_run, refuse_cut
from effectlog.journal.ownership import describe
from effectlog.recorder import Clock, EventSpec, record_now
from effectlog.trace import Trace


def load_step(
    journal: Journal, run_id: str, step_id: str, *, needs: Sequence[str], action: str
) -> tuple[RunState, StepState]:
    found = journal.owner(run_id)
    if found.live and not found.waiting:
        # Said first, and plainly; the append itself is refused the same way if an owner comes in between.
        raise RunOwned(
            f"cannot {action}: the run is driven by {describe(found.owner)}; decide once it stops or waits",
            run_id=run_id,
            step_id=step_id,
        )
    refuse_cut(journal, run_id)  # a run whose tail was cut (under its seal or a segment) takes no decision: exit 7
    state = load_run(journal, run_id)
    if state.seq == 0:
        raise UnknownRun(f"no run {run_id!r} in {journal.location}", run_id=run_id)
    step = state.step(step_id)
    if step is None:
        if state.kind == "plan" and step_id not in state.plan_steps:
            raise UnknownStep("no such step in the run's plan", run_id=run_id, step_id=step_id)
        raise NotReconcilable(f"cannot {action}: the step has not started", run_id=run_id, step_id=step_id)
    if step.state not in needs:
        raise NotReconcilable(
            f"cannot {action}: the step is {step.state}, not {' or '.join(needs)}; nothing was written",
            run_id=run_id,
            step_id=step_id,
        )
    return state, step


def append(
    journal: Journal, state: RunState, specs: Sequence[EventSpec], clock: Clock, trace: Trace | None
) -> RunState:
    return record_now(journal, state, specs, clock, trace)
