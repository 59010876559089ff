"""Recovery by contract: what a step's recorded state means, decided purely.

Recovery never calls a tool and never writes: it hands an ``Action`` back to the
runtime, which records events and invokes adapters.
"""

from __future__ import annotations

from enum import Enum

from effectlog.fold import RunState, StepState


class Action(Enum):
    SKIP = "skip"  # confirmed or reconciled as applied: reuse the recorded result
    EXECUTE = "execute"  # never requested (or cleared for a new attempt, or approved)
    RESEND = "resend"  # requested, outcome unknown, idempotent: send the SAME key again
    CONFIRM_RECORDED = "confirm_recorded"  # the receipt is durable: rebuild the result from it
    STOP_UNCERTAIN = "stop_uncertain"  # requested, outcome unknown, not idempotent: stop, never guess
    WAIT_APPROVAL = "wait_approval"  # held for a person: a known outcome, not an uncertain one
    FAIL = "fail"  # denied or definitely failed
    WAIT_UNTIL = "wait_until"  # a durable sleep: wait what is left until its recorded wake-up time


def decide(step: StepState | None) -> Action:
    """The action for a step, from its recorded state alone."""
    if step is None:
        return Action.EXECUTE
    state = step.state
    if state in ("confirmed", "reconciled"):
        return Action.SKIP
    if state in ("pending", "approved"):
        return Action.EXECUTE
    if state == "requested":
        return Action.RESEND if step.idempotent else Action.STOP_UNCERTAIN
    if state == "effected":
        return Action.CONFIRM_RECORDED
    if state == "uncertain":
        return Action.STOP_UNCERTAIN
    if state == "awaiting_approval":
        return Action.WAIT_APPROVAL
    if state == "sleeping":
        return Action.WAIT_UNTIL
    return Action.FAIL


def still_blocked(run: RunState) -> Action | None:
    """For a suspended or stopped run: the action if nobody has unblocked it yet."""
    if run.state not in ("suspended", "stopped") or run.blocked_step is None:
        return None
    action = decide(run.steps.get(run.blocked_step))
    if action in (Action.WAIT_APPROVAL, Action.STOP_UNCERTAIN):
        return action
    return None
