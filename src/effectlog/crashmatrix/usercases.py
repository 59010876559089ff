"""The matrix for a user's own adapter: does it really honour its contract?

Declaring ``idempotent`` proves nothing. Each case kills a real worker at one
boundary and counts effects through the user's ledger function; an adapter that
keeps its contract ends every case with exactly one effect and a completed run.

An adapter declared not idempotent is tested the other way: a crash leaves the
step uncertain, ``effectlog reconcile --lookup`` (a separate process) asks the
adapter's own ``lookup``, and the resume must end with exactly one effect: the
recorded one when ``lookup`` found it, a new attempt when it said "not applied".
"""

from __future__ import annotations

from effectlog import events as ev
from effectlog.crashmatrix.cases import Action, Case, Check, Evidence, W, completed, never_uncertain, result_rebuilt

USER_TYPE = "user"
DEFAULT_ARGS = {"amount_cents": 1250, "to": "acct-42"}
LOOKUP = Action(do="reconcile-lookup")


def _w(arm: str) -> Action:
    return Action(do="worker", arm=arm)


USER_CASES: tuple[Case, ...] = (
    Case(
        name="user-no-crash",
        title="Your adapter: no crash",
        kind="idempotent",
        actions=(W,),
        effects=1,
        outcome="Completed",
    ),
    Case(
        name="user-after-request",
        title="Your adapter: after request",
        kind="idempotent",
        actions=(_w("after_request"), W),
        effects=1,
        outcome="Resumed with the same key",
    ),
    Case(
        name="user-after-effect",
        title="Your adapter: after effect",
        kind="idempotent",
        actions=(_w("after_effect"), W),
        effects=1,
        outcome="Existing effect recognised",
    ),
    Case(
        name="user-before-commit-effect",
        title="Your adapter: receipt written, not committed",
        kind="idempotent",
        actions=(_w("before_commit:step.effected"), W),
        effects=1,
        outcome="Existing effect recognised",
    ),
    Case(
        name="user-after-confirm",
        title="Your adapter: after confirmation",
        kind="idempotent",
        actions=(_w("after_confirm"), W),
        effects=1,
        outcome="Stored result rebuilt",
    ),
    Case(
        name="user-during-resend",
        title="Your adapter: crash again during the re-send",
        kind="idempotent",
        actions=(_w("after_request"), _w("after_resend"), W),
        effects=1,
        outcome="Re-sent twice with the same key",
    ),
)


def _lookups(e: Evidence) -> list[ev.StepReconciled]:
    return [x for x in e.events if isinstance(x, ev.StepReconciled)]


def found_by_lookup(e: Evidence) -> str | None:
    rec = _lookups(e)
    if len(rec) != 1 or rec[0].outcome != "applied" or not rec[0].automated or rec[0].adapter_identity is None:
        return "expected one automated reconciliation by the adapter's lookup with outcome applied"
    if 3 not in e.exits:
        return "the run never stopped (exit 3) before reconciliation"
    return None


def new_attempt_after_lookup(e: Evidence) -> str | None:
    rec = _lookups(e)
    req = [x for x in e.events if isinstance(x, ev.StepRequested)]
    if len(rec) != 1 or rec[0].outcome != "not_applied" or rec[0].adapter_identity is None:
        return "expected one reconciliation by the adapter's lookup with outcome not_applied"
    if [r.attempt for r in req] != [1, 2] or req[0].idempotency_key == req[1].idempotency_key:
        return "expected attempt 2 with a new key after not_applied"
    return None


USER_CONTROL_CASES: tuple[Case, ...] = (
    Case(
        name="user-control-no-crash",
        title="Your adapter (not idempotent): no crash",
        kind="control",
        actions=(W,),
        effects=1,
        outcome="Completed",
    ),
    Case(
        name="user-control-after-request",
        title="Your adapter (not idempotent): after request",
        kind="control",
        actions=(_w("after_request"), W, LOOKUP, W),
        effects=1,
        outcome="Lookup: not applied; new attempt with a new key",
    ),
    Case(
        name="user-control-after-effect",
        title="Your adapter (not idempotent): after effect",
        kind="control",
        actions=(_w("after_effect"), W, LOOKUP, W),
        effects=1,
        outcome="Stopped and reconciled by your lookup",
    ),
    Case(
        name="user-control-before-commit-effect",
        title="Your adapter (not idempotent): receipt written, not committed",
        kind="control",
        actions=(_w("before_commit:step.effected"), W, LOOKUP, W),
        effects=1,
        outcome="Stopped and reconciled by your lookup",
    ),
    Case(
        name="user-control-after-confirm",
        title="Your adapter (not idempotent): after confirmation",
        kind="control",
        actions=(_w("after_confirm"), W),
        effects=1,
        outcome="Stored result rebuilt",
    ),
)

USER_CHECKS: dict[str, tuple[Check, ...]] = {
    **{c.name: (completed,) for c in USER_CASES},
    "user-control-no-crash": (completed, never_uncertain),
    "user-control-after-request": (completed, new_attempt_after_lookup),
    "user-control-after-effect": (completed, found_by_lookup),
    "user-control-before-commit-effect": (completed, found_by_lookup),
    "user-control-after-confirm": (completed, result_rebuilt, never_uncertain),
}
USER_BY_NAME = {c.name: c for c in USER_CASES}
USER_CONTROL_BY_NAME = {c.name: c for c in USER_CONTROL_CASES}
assert set(USER_CHECKS) == set(USER_BY_NAME) | set(USER_CONTROL_BY_NAME)


def user_cases(idempotent: bool) -> dict[str, Case]:
    """The cases for a user's adapter, by the contract it declares."""
    return USER_BY_NAME if idempotent else USER_CONTROL_BY_NAME
