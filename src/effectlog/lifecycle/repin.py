"""Re-pin after an upgrade: accept new adapter implementations for an open run, audited.

A run pins each adapter's identity in ``run.started``; a resume whose adapter differs is
refused (``PlanMismatch``, exit 5), because a changed implementation may do something
else with the same key. After an upgrade that is deliberate, an operator records
``run.repinned``: who, why, the fingerprints accepted (and those they replace) and the
effectlog version. Only implementations may change: the plan (steps, arguments, adapter
types, versions and contracts) stays the one pinned, and nothing is repinned while a
step's outcome is open (``requested`` or ``uncertain``), since that step was started by
the old implementation and must be finished or reconciled under it first.
"""

from __future__ import annotations

import time

import msgspec

from effectlog import events as ev
from effectlog.adapters.registry import AdapterContext, Registry
from effectlog.errors import BadInput, RepinRefused, RunOwned, UnknownRun
from effectlog.fold import RunState
from effectlog.journal import Journal, load_run, no_such_run, refuse_cut
from effectlog.journal.ownership import describe
from effectlog.observe import decision
from effectlog.plan import Plan
from effectlog.recorder import Clock, record_now
from effectlog.trace import Trace


class Repinned(msgspec.Struct, frozen=True, kw_only=True):
    """What a repin did: the adapters whose fingerprint it accepted (empty: nothing differed, nothing written)."""

    run_id: str
    state: str
    changed: dict[str, tuple[str, str]]  # adapter name -> (old fingerprint, new fingerprint)
    version: str


@decision("repin", on_step=False)  # an effectlog.repin span when OpenTelemetry is configured
def repin(
    journal: Journal,
    run_id: str,
    registry: Registry,
    context: AdapterContext,
    *,
    by: str,
    reason: str,
    plan: Plan | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> Repinned:
    """Record ``run.repinned`` accepting the current implementations; ``plan``, when given, must be the pinned one."""
    from effectlog import __version__

    if not by.strip() or not reason.strip():
        raise BadInput("repin needs --by (who) and --reason (why): both are recorded", run_id=run_id)
    found = journal.owner(run_id)
    if found.live:
        raise RunOwned(f"cannot repin: the run is driven by {describe(found.owner)}", run_id=run_id)
    refuse_cut(journal, run_id)  # nothing is recorded over a cut tail (exit 7)
    state = load_run(journal, run_id)
    if state.seq == 0:
        raise no_such_run(journal, run_id)
    # What the run is before what state it is in: the closed-run advice (fork it) is no way on for a
    # durable or session run, which fork refuses too.
    if state.kind != "plan" or state.plan is None:
        raise RepinRefused(
            "a durable or session run pins no adapters to accept: its steps are its program's calls", run_id=run_id
        )
    if state.closed:
        raise RepinRefused(
            f"the run is {state.state}: a closed run never reopens (fork it to run steps again)", run_id=run_id
        )
    decls = _pinned_decls(state, plan)  # a plan that is not the pinned one is refused first, whatever its steps
    for step in state.ordered_steps():
        if step.state in ("requested", "uncertain"):
            raise RepinRefused(
                f"step {step.step_id!r} is {step.state}: its outcome is open under the implementation that "
                "started it; resume it with that implementation or reconcile it first; nothing was written",
                run_id=run_id,
                step_id=step.step_id,
            )
    identities = registry.build(decls, context).identities
    changed_new: dict[str, ev.AdapterIdentity] = {}
    changed_old: dict[str, ev.AdapterIdentity] = {}
    for name in sorted(set(state.adapters) | set(identities)):
        old, new = state.adapters.get(name), identities.get(name)
        if (
            old is None
            or new is None
            or (old.type, old.version, old.idempotent)
            != (
                new.type,
                new.version,
                new.idempotent,
            )
        ):
            raise RepinRefused(
                f"adapter {name!r} is not the pinned one in more than its implementation "
                f"(pinned {old!r}, now {new!r}): only implementations may change; start a new run",
                run_id=run_id,
            )
        if old.fingerprint != new.fingerprint:
            changed_old[name], changed_new[name] = old, new
    if changed_new:
        state = record_now(
            journal,
            state,
            [
                (
                    ev.RunRepinned,
                    {
                        "adapters": changed_new,
                        "previous": changed_old,
                        "version": __version__,
                        "by": by,
                        "reason": reason,
                    },
                )
            ],
            clock,
            trace,
        )
    return Repinned(
        run_id=run_id,
        state=state.state,
        changed={n: (changed_old[n].fingerprint, changed_new[n].fingerprint) for n in changed_new},
        version=__version__,
    )


def _pinned_decls(state: RunState, plan: Plan | None) -> Plan:
    """The pinned plan's adapter declarations (secret args stay digests: building adapters needs none)."""
    if plan is not None:
        if plan.run_id != state.run_id or plan.digest != state.plan_digest:
            raise RepinRefused(
                f"the plan given differs from the pinned one (journal has plan {state.plan_digest[:12]}, "
                f"given {plan.digest[:12]}): only implementations may change, not steps or arguments",
                run_id=state.run_id,
            )
        return plan
    try:
        return msgspec.convert(state.plan, Plan)
    except msgspec.ValidationError as exc:
        raise UnknownRun(f"the pinned plan does not decode as a plan ({exc})", run_id=state.run_id) from None
