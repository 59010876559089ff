"""The recovery service: what an expired lease means, decided from the run's journal.

``decide_expired`` is pure. It reads the journal events the run recorded since the
lease began: if no step was requested (or re-sent) in that window, no tool can have
been invoked by that attempt (the request is durable before any call), so the attempt
is ``lost`` and the request re-queued with a new attempt and token. In every other
case the attempt and the request go to ``needs_operator``: the outcome may be
ambiguous, and a person decides.

``recover_once`` applies it to every expired lease. Like the runtime's own recovery
it only appends: for a run left with a non-idempotent step requested and no result,
it records ``step.uncertain`` and ``run.stopped`` (what the run would record itself
on resume), so the operator can reconcile it with evidence right away.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from effectlog import events as ev
from effectlog.errors import Conflict, IntegrityError
from effectlog.fleet import attempts as am
from effectlog.fleet.model import Recovered, Verdict
from effectlog.fleet.protocol import FleetStore
from effectlog.journal import load_run
from effectlog.recorder import record_now
from effectlog.recovery import Action, decide, still_blocked

_INVOKING = (ev.StepRequested, ev.StepResent)


def decide_expired(bodies: Sequence[bytes]) -> Verdict:
    """Pure: ``lose`` when the journal since the lease began shows no step requested, else ``expire``."""
    requested = [e for e in map(ev.decode, bodies) if isinstance(e, _INVOKING)]
    if not requested:
        return Verdict(
            trigger="lose",
            reason="lease expired; the run's journal shows no step requested during this attempt, "
            "so nothing can have run: re-queued with a new attempt",
            detail={"events": len(bodies)},
        )
    steps = sorted({e.step_id for e in requested})
    last = requested[-1]
    return Verdict(
        trigger="expire",
        reason=f"lease expired after step(s) {', '.join(steps)} were requested (last at seq {last.seq}); "
        "their outcome may be ambiguous: an operator decides",
        detail={"events": len(bodies), "requested": steps, "last_requested_seq": last.seq},
    )


def mark_uncertain(store: FleetStore, run_id: str) -> str | None:
    """Record ``step.uncertain`` + ``run.stopped`` for a run left with an unanswered non-idempotent step.

    Returns the step, or ``None`` when there is nothing to mark (idempotent steps are
    re-sent with the same key by the next attempt). A concurrent writer makes this a no-op.
    """
    journal = store.journal()
    if journal.head(run_id)[0] == 0:
        return None
    state = load_run(journal, run_id)
    if state.closed or still_blocked(state) is not None:
        return None
    for step in state.ordered_steps():
        if decide(step) is Action.STOP_UNCERTAIN:
            try:
                record_now(
                    journal,
                    state,
                    [
                        (
                            ev.StepUncertain,
                            {
                                "step_id": step.step_id,
                                "attempt": step.attempt,
                                "reason": "the runner's lease expired after the request; no result recorded",
                            },
                        ),
                        (ev.RunStopped, {"step_id": step.step_id, "reason": "uncertain effect"}),
                    ],
                    time.time_ns,
                )
            except (Conflict, IntegrityError):
                return None  # someone else wrote first; the next pass looks again
            return step.step_id
    return None


def recover_once(store: FleetStore, *, limit: int = 100) -> list[Recovered]:
    """One pass: decide every expired lease; mark the uncertain step of each run it sent to an operator.

    If a process dies between the two, nothing is lost: the next attempt's runtime
    records the same ``step.uncertain`` on resume and the request comes back to an operator.
    """
    done: list[Recovered] = []
    for expired in store.expired(limit):
        outcome = store.recover(expired.attempt_id, expired.token, decide_expired)
        if outcome is None:
            continue
        done.append(outcome)
        if outcome.state in am.AWAITING_OPERATOR:
            # A run whose history does not replay is for `effectlog verify` and a person; the others go on.
            with contextlib.suppress(IntegrityError):
                mark_uncertain(store, expired.run_id)
    return done
