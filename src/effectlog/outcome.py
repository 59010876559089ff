"""What a call to run returns, and the types the runtime takes (policy, crash hooks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from effectlog.errors import ExitStatus
from effectlog.fold import RunState

Decision = Literal["allow", "deny", "require_approval"]
CrashHook = Callable[[str, str], None]


class PolicyRequest(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    step_id: str
    adapter: str
    args: dict[str, Any]
    idempotent: bool


Policy = Callable[[PolicyRequest], Decision]


class SimulatedCrash(BaseException):
    """Raised by an in-process crash hook: the run actor stops dead, writing nothing more."""


class StepSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # two strings and an int: never a cycle
    id: str
    state: str
    attempt: int


class RunOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a call to ``run`` ended, and what it cost."""

    run_id: str
    state: str
    exit_status: int
    message: str
    step_id: str | None = None
    steps: list[StepSummary] = []
    events_written: int = 0
    adapter_calls: int = 0


def outcome_of(
    state: RunState,
    message: str = "",
    *,
    events_written: int = 0,
    adapter_calls: int = 0,
    steps: list[StepSummary] | None = None,
) -> RunOutcome:
    """The outcome a run's recorded state stands for (``steps``: its rows, when already known from a seal)."""
    status = {
        "completed": ExitStatus.DONE,
        "failed": ExitStatus.RUN_FAILED,
        "cancelled": ExitStatus.RUN_FAILED,
        "stopped": ExitStatus.STOPPED_UNCERTAIN,
        "suspended": ExitStatus.SUSPENDED,
    }.get(state.state, ExitStatus.RUN_FAILED)
    if not message:
        message = _describe(state)
    return RunOutcome(
        run_id=state.run_id,
        state=state.state,
        exit_status=int(status),
        message=message,
        step_id=state.blocked_step,
        steps=steps
        if steps is not None
        else [StepSummary(id=s.step_id, state=s.state, attempt=s.attempt) for s in state.ordered_steps()],
        events_written=events_written,
        adapter_calls=adapter_calls,
    )


def reconcile_hint(journal: str, run_id: str, step_id: str) -> str:
    return (
        f"effectlog reconcile --journal {journal} --run-id {run_id} --step {step_id} "
        "--outcome applied|not-applied --evidence TEXT --operator NAME"
    )


def _describe(state: RunState) -> str:
    if state.state == "completed":
        return f"run {state.run_id} completed"
    if state.state == "suspended":
        return f"run {state.run_id} suspended: step {state.blocked_step!r} waits for approval"
    if state.state == "stopped":
        return f"run {state.run_id} stopped: step {state.blocked_step!r} has an uncertain effect"
    return f"run {state.run_id} {state.state}" + (f": {state.reason}" if state.reason else "")
