"""Approval and denial, written by the harness (a person decides while the loop is not running).

An approval is bound to the digest of the step's exact args (the digest recorded
when the step was held), may expire, and is used once: the next request consumes it.
A person's "deny" is final and fails the run. Neither is ever an uncertain outcome.
"""

from __future__ import annotations

import re
import time

from effectlog import events as ev
from effectlog.errors import BadInput, DecisionStale, DigestMismatch
from effectlog.fold import RunState, StepState
from effectlog.journal import Journal
from effectlog.observe import decision
from effectlog.operator import append, load_step, refuse_unreached_attempt
from effectlog.recorder import Clock
from effectlog.trace import Trace

_DIGEST = re.compile(r"[0-9a-f]{64}")  # an args digest: SHA-256 of the canonical args, in hex


@decision("approve")
def approve(
    journal: Journal,
    run_id: str,
    step_id: str,
    *,
    by: str,
    reason: str = "",
    expires_at: int | None = None,
    expect_digest: str | None = None,
    attempt: int | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    """Approve the held call; with ``expect_digest``, only if its args digest is that one.

    The digest is what the approver saw (``status``/``timeline`` show it): if the held call
    is another one by now, ``DigestMismatch`` (exit 5) and nothing is written. ``attempt``:
    only if the held call is that attempt (the one the console's page showed), else
    ``DecisionStale`` (exit 5): the same args held again after an uncertain send are a new call.
    """
    if expect_digest is not None and not _DIGEST.fullmatch(expect_digest.strip().lower()):
        raise BadInput(
            f"expected digest {expect_digest!r} (--expect-digest): not an args digest (64 hex digits, as status "
            "and timeline show it); nothing was written"
        )
    state, step = load_step(journal, run_id, step_id, needs=("awaiting_approval",), action="approve")
    _check_attempt(step, attempt, run_id, step_id, "approve")
    if expect_digest is not None and expect_digest.strip().lower() != step.args_digest:
        raise DigestMismatch(
            f"the held call's args digest is {step.args_digest}, not the expected {expect_digest}; "
            "look at it again (effectlog status --run-id) before approving; nothing was written",
            run_id=run_id,
            step_id=step_id,
            expected=expect_digest,
            actual=step.args_digest,
        )
    return append(
        journal,
        state,
        [
            (
                ev.StepApproved,
                {
                    "step_id": step_id,
                    "attempt": step.attempt,
                    "by": by,
                    "reason": reason,
                    "args_digest": step.args_digest,
                    "expires_at": expires_at,
                },
            )
        ],
        clock,
        trace,
    )


@decision("deny")
def deny(
    journal: Journal,
    run_id: str,
    step_id: str,
    *,
    by: str,
    reason: str = "",
    attempt: int | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    state, step = load_step(journal, run_id, step_id, needs=("awaiting_approval", "approved"), action="deny")
    _check_attempt(step, attempt, run_id, step_id, "deny")
    specs: list[tuple[type[ev.Event], dict[str, object]]] = [
        (
            ev.StepDenied,
            {
                "step_id": step_id,
                "attempt": step.attempt,
                "decision": "deny",
                "by": by,
                "reason": reason or "denied by a person",
                "args_digest": step.args_digest,
            },
        ),
    ]
    if not state.closed:
        specs.append((ev.RunFailed, {"step_id": step_id, "reason": f"step denied by {by}"}))
    return append(journal, state, specs, clock, trace)


def _check_attempt(step: StepState, attempt: int | None, run_id: str, step_id: str, action: str) -> None:
    """``DecisionStale`` unless the held call is the ``attempt`` the decider saw (None: not bound)."""
    refuse_unreached_attempt(step, attempt, run_id, action)
    if attempt is not None and step.attempt != attempt:
        raise DecisionStale(
            f"cannot {action}: the decision is about attempt {attempt}, but the step is at attempt "
            f"{step.attempt} now; look at it again before deciding; nothing was written",
            run_id=run_id,
            step_id=step_id,
        )
