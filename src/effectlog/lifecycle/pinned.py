"""A run's plan as its own journal pinned it: what recover, fork and repin drive, with no plan file.

``run.started`` carries ``Plan.pinned()``: the plan with each secret arg replaced by
``{"$secret_sha256": HEX}``. A run without secret args is rebuilt exactly from it. A
secret value is never in the journal, so it is supplied again the way a fleet runner
supplies it (``effectlog.fleet.secrets``: a provider hook, else
``EFFECTLOG_SECRET_<NAME>`` in the environment) and checked against the digest; a run
whose values nobody supplies is refused by name, never run with a placeholder.
"""

from __future__ import annotations

import msgspec

from effectlog.errors import BadInput, PlanMismatch, UnknownRun
from effectlog.fleet.secrets import Provider, placeholder, resolve
from effectlog.fold import RunState
from effectlog.plan import Plan


def pinned_plan(state: RunState, *, secrets: Provider | None = None, given: Plan | None = None) -> Plan:
    """The plan ``state``'s run pinned, secrets supplied; ``given`` (the full plan) must be that very plan."""
    if state.kind != "plan" or state.plan is None:
        # Not UnknownRun: the run is there. Its steps are its program's calls, which only that program can make
        # again, so there is nothing to drive from the journal alone.
        raise BadInput(
            "a durable or session run has no pinned plan to retry, fork or recover from: "
            "its steps are its program's calls; resume it by running its code again",
            run_id=state.run_id,
        )
    if given is not None:
        if given.run_id != state.run_id or given.digest != state.plan_digest:
            raise PlanMismatch(
                f"the plan given is not the one the run pinned (journal has plan {state.plan_digest[:12]}, "
                f"given {given.digest[:12]} for run {given.run_id!r})",
                run_id=state.run_id,
            )
        return given
    try:
        plan = msgspec.convert(state.plan, Plan)
    except msgspec.ValidationError as exc:
        raise UnknownRun(f"the pinned plan does not decode as a plan ({exc})", run_id=state.run_id) from None
    plan = resolve(plan, secrets) if has_secrets(plan) else plan
    if plan.digest != state.plan_digest:
        raise PlanMismatch(
            f"the pinned plan rebuilt from run.started has digest {plan.digest[:12]}, "
            f"not the pinned {state.plan_digest[:12]}",
            run_id=state.run_id,
        )
    return plan


def has_secrets(plan: Plan) -> bool:
    """True when some secret arg of ``plan`` is still a digest placeholder (its value must be supplied)."""
    return any(placeholder(step.args.get(name)) is not None for step in plan.steps for name in step.secret)
