"""Shared plumbing for operator actions (approve, deny, reconcile): they only append.

An operator action runs while the run's loop is not running (a person decides
later, from another process), so it replays the run, checks the step is in the
state the action needs, and appends one atomic batch. Nothing is written when a
check fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from effectlog import events as ev
from effectlog import spelling
from effectlog.errors import BadInput, DecisionStale, EventConflict, NotReconcilable, RunOwned, UnknownStep
from effectlog.fold import RunState, StepState
from effectlog.journal import Journal, load_run, no_such_run, refuse_cut
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
        raise no_such_run(journal, run_id)
    step = state.step(step_id)
    if step is None:
        other = spelling.twin(step_id, state.steps)
        if other is not None:
            raise UnknownStep(
                f"cannot {action}: no step {step_id!a} in the run, but {other!a} is ({state.steps[other].state}), "
                "the same id in another Unicode spelling (composed against decomposed accents, or an invisible "
                "character): give it as the run has it (copy it from effectlog status); nothing was written",
                run_id=run_id,
                step_id=step_id,
            )
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


def refuse_unreached_attempt(step: StepState, attempt: int | None, run_id: str, action: str) -> None:
    """``BadInput`` for a decision naming an attempt above the step's: an attempt that never happened (a
    mistyped number), not evidence gone stale; an attempt below it is the decider's to look at again."""
    if attempt is not None and attempt > step.attempt:
        raise BadInput(
            f"cannot {action} attempt {attempt}: the step has reached attempt {step.attempt} only; give "
            f"--attempt {step.attempt} (as status shows it); nothing was written",
            run_id=run_id,
            step_id=step.step_id,
        )


def append(
    journal: Journal, state: RunState, specs: Sequence[EventSpec], clock: Clock, trace: Trace | None
) -> RunState:
    """Append the decision after ``state``, the run as it was read. Another decision (or a pass of the run)
    written since takes the same seq first: this one is then about a step that is not as it was seen, and is
    refused as stale (exit 5), naming what was written meanwhile, not as a seq clash."""
    try:
        return record_now(journal, state, specs, clock, trace)
    except EventConflict:
        meanwhile = [ev.decode(record.body) for record in journal.read(state.run_id, state.seq)]
        if not meanwhile:
            raise
        shown = ", ".join(_described(event) for event in meanwhile[:3]) + (", ..." if len(meanwhile) > 3 else "")
        step_id = str(specs[0][1].get("step_id", "")) if specs else ""
        raise DecisionStale(
            f"the run was written after this decision read it: {shown} (seq {meanwhile[0].seq} on); "
            "look at the step again before deciding; nothing was written",
            run_id=state.run_id,
            step_id=step_id or None,
        ) from None


def _described(event: ev.AnyEvent) -> str:
    """An event as the timeline names it: its tag, step and who decided (``step.denied s1 by bob``)."""
    tag = type(event).__struct_config__.tag
    step = getattr(event, "step_id", None)
    who = getattr(event, "by", None) or getattr(event, "operator", None)
    return " ".join(str(part) for part in (tag, step, f"by {who}" if who else None) if part)
