"""Reconciliation: resolving an uncertain step with external evidence. Only appends.

``applied`` counts the step as done; ``not_applied`` lets the next resume run it as
a new attempt with a new idempotency key. The event records who asserted it and
whether it was a person or an automated ledger inspection: effectlog records the
claim, it cannot prove the outside world.
"""

from __future__ import annotations

import time
from typing import Literal

from effectlog import events as ev
from effectlog.adapters.protocol import Request, SupportsLookup
from effectlog.errors import BadInput
from effectlog.fold import RunState
from effectlog.journal import Journal
from effectlog.operator import append, load_step
from effectlog.recorder import Clock
from effectlog.trace import Trace

Outcome = Literal["applied", "not_applied"]
LEDGER_OPERATOR = "effectlog:ledger-inspection"


def reconcile(
    journal: Journal,
    run_id: str,
    step_id: str,
    *,
    outcome: Outcome,
    evidence: str,
    operator: str,
    automated: bool = False,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    if outcome not in ("applied", "not_applied"):
        raise BadInput(f"--outcome must be applied or not-applied, not {outcome!r}")
    if not evidence.strip():
        raise BadInput("reconcile needs --evidence: what external fact shows the outcome")
    if not operator.strip():
        raise BadInput("reconcile needs --operator: who asserts it")
    state, step = load_step(journal, run_id, step_id, needs=("uncertain",), action="reconcile")
    specs: list[tuple[type[ev.Event], dict[str, object]]] = [
        (
            ev.StepReconciled,
            {
                "step_id": step_id,
                "attempt": step.attempt,
                "outcome": outcome,
                "evidence": evidence,
                "operator": operator,
                "automated": automated,
            },
        ),
    ]
    return append(journal, state, specs, clock, trace)


def reconcile_from_lookup(
    journal: Journal,
    run_id: str,
    step_id: str,
    source: SupportsLookup,
    *,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    """Automated reconciliation: ask the tool's ledger whether this attempt's effect exists."""
    _, step = load_step(journal, run_id, step_id, needs=("uncertain",), action="reconcile")
    request = Request(
        run_id=run_id, step_id=step_id, attempt=step.attempt, idempotency_key=step.idempotency_key, args={}
    )
    found = source.lookup(request)
    if found is None:
        raise BadInput(
            "the ledger cannot tell whether the effect exists; reconcile by hand with evidence",
            run_id=run_id,
            step_id=step_id,
        )
    return reconcile(
        journal,
        run_id,
        step_id,
        outcome="applied" if found.applied else "not_applied",
        evidence=f"automated ledger inspection, not a person: {found.detail}",
        operator=LEDGER_OPERATOR,
        automated=True,
        clock=clock,
        trace=trace,
    )
