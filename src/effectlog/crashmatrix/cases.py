"""The crash-matrix cases: what each one does, and what its evidence must show.

The first eight are the published crash matrix effectlog reproduces, with its counts; the
rest go further and arm a crash at every other boundary the step machine has.
Expectations live here, in code, never in a report: ``verify`` checks a report's
evidence against them and does not trust any pass flag the report carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from effectlog import events as ev

Kind = Literal["idempotent", "control"]


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One process the parent starts for a case."""

    do: Literal["worker", "blind", "reconcile-ledger", "reconcile-lookup", "approve"]
    arm: str | None = None  # crash point armed in this worker; None runs to the end


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """What verification reads: decoded events, effect rows, per-process exit statuses."""

    events: list[ev.AnyEvent]
    effects: int
    exits: list[int | None]  # per action: exit status, or None when killed
    signals: list[int | None]
    reached: list[str | None]
    receipts: list[Any]


Check = Callable[[Evidence], str | None]  # None when it holds, else what is wrong


class Case(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    title: str
    kind: Kind
    actions: tuple[Action, ...]
    effects: int
    outcome: str  # the published wording of the result
    approval: bool = False
    published: bool = False  # one of the eight cases of the published crash matrix
    journal: bool = True  # False for the blind reference (it keeps no journal)

    def check(self, evidence: Evidence) -> list[str]:
        problems: list[str] = []
        if evidence.effects != self.effects:
            problems.append(f"expected {self.effects} effect(s) in the effect store, found {evidence.effects}")
        for i, action in enumerate(self.actions):
            if action.arm is not None:
                if evidence.reached[i] != action.arm:
                    problems.append(f"process {i + 1} did not report reaching {action.arm}")
                if evidence.signals[i] != 9:
                    problems.append(f"process {i + 1} was not ended by SIGKILL")
        checks = CHECKS.get(self.name) or _user_checks(self.name)
        problems.extend(p for p in (check(evidence) for check in checks) if p)
        return problems


def _user_checks(name: str) -> tuple[Check, ...]:
    from effectlog.crashmatrix.usercases import USER_CHECKS

    return USER_CHECKS[name]


def _tags(e: Evidence) -> list[str]:
    return [ev.tag_of(x) for x in e.events]


def final_run_state(e: Evidence) -> str:
    from effectlog.fold import replay

    return replay(e.events).state if e.events else "none"


def _step(e: Evidence) -> Any:
    """The case's step as the events left it; None when the workers wrote no event at all (a journal they
    could not open): replay() of nothing raised, a traceback in place of a failed case."""
    from effectlog.fold import replay

    return replay(e.events).step("pay") if e.events else None


def completed(e: Evidence) -> str | None:
    state = final_run_state(e)
    if state != "completed":
        return f"run ended {state}, not completed"
    if e.exits[-1] != 0:
        return f"last process exited {e.exits[-1]}, not 0"
    return None


def stopped_unresolved(e: Evidence) -> str | None:
    step = _step(e)
    if final_run_state(e) != "stopped" or step is None or step.state != "uncertain":
        return "run is not stopped on an uncertain step"
    if e.exits[-1] != 3:
        return f"last process exited {e.exits[-1]}, not 3 (stopped on an uncertain effect)"
    return None


def resent_same_key(e: Evidence) -> str | None:
    keys = {x.idempotency_key for x in e.events if isinstance(x, ev.StepRequested)}
    if len(keys) != 1:
        return f"expected one idempotency key, saw {len(keys)}"
    if "step.resent" not in _tags(e):
        return "no step.resent: the pending request was not sent again"
    return None


def receipt_replayed(e: Evidence) -> str | None:
    effected = [x for x in e.events if isinstance(x, ev.StepEffected)]
    if len(effected) != 1 or not isinstance(effected[0].receipt, dict) or not effected[0].receipt.get("replayed"):
        return "the recorded receipt is not the store's existing receipt (replayed)"
    return None


def result_rebuilt(e: Evidence) -> str | None:
    """After the crash, the resumed process called no tool: the result came from the journal."""
    tags = _tags(e)
    if tags.count("step.effected") != 1 or "step.resent" in tags or "step.uncertain" in tags:
        return "the step was executed again instead of rebuilt from the journal"
    return None


def reconciled_from_ledger(e: Evidence) -> str | None:
    rec = [x for x in e.events if isinstance(x, ev.StepReconciled)]
    if len(rec) != 1 or rec[0].outcome != "applied" or not rec[0].automated:
        return "expected one automated ledger reconciliation with outcome applied"
    if 3 not in e.exits:
        return "the run never stopped (exit 3) before reconciliation"
    return None


def never_uncertain(e: Evidence) -> str | None:
    return "the step became uncertain" if "step.uncertain" in _tags(e) else None


def intent_rolled_back(e: Evidence) -> str | None:
    requested = [x for x in e.events if isinstance(x, ev.StepRequested)]
    if len(requested) != 1:
        return f"expected one durable step.requested, found {len(requested)}"
    resumed = [x for x in e.events if isinstance(x, ev.RunResumed)]
    if not resumed or requested[0].seq < resumed[0].seq:
        return "the request became durable before the crash, but its commit was never reached"
    return None


def resent_twice(e: Evidence) -> str | None:
    resends = [x.resend for x in e.events if isinstance(x, ev.StepResent)]
    return None if resends == [1, 2] else f"expected re-sends [1, 2], saw {resends}"


def approved_once(e: Evidence) -> str | None:
    tags = _tags(e)
    if tags.count("step.approved") != 1 or tags.count("step.requested") != 1:
        return "expected one approval used by exactly one request"
    if 4 not in e.exits:
        return "the run was never suspended for approval (exit 4)"
    return None


def new_attempt(e: Evidence) -> str | None:
    rec = [x for x in e.events if isinstance(x, ev.StepReconciled)]
    req = [x for x in e.events if isinstance(x, ev.StepRequested)]
    if len(rec) != 1 or rec[0].outcome != "not_applied":
        return "expected one ledger reconciliation with outcome not_applied"
    if [r.attempt for r in req] != [1, 2] or req[0].idempotency_key == req[1].idempotency_key:
        return "expected attempt 2 with a new key after not_applied"
    return None


def duplicated(e: Evidence) -> str | None:
    return None if e.effects == 2 else "the blind retry did not duplicate the effect"


W = Action(do="worker")


def _w(arm: str) -> Action:
    return Action(do="worker", arm=arm)


LEDGER = Action(do="reconcile-ledger")
APPROVE = Action(do="approve")

CASES: tuple[Case, ...] = (
    Case(
        name="idempotent-after-request",
        title="Idempotent: after request",
        kind="idempotent",
        published=True,
        actions=(_w("after_request"), W),
        effects=1,
        outcome="Resumed with the same key",
    ),
    Case(
        name="idempotent-after-effect",
        title="Idempotent: after effect",
        kind="idempotent",
        published=True,
        actions=(_w("after_effect"), W),
        effects=1,
        outcome="Existing receipt recovered",
    ),
    Case(
        name="idempotent-after-confirm",
        title="Idempotent: after confirmation",
        kind="idempotent",
        published=True,
        actions=(_w("after_confirm"), W),
        effects=1,
        outcome="Stored result rebuilt",
    ),
    Case(
        name="control-after-request",
        title="Not idempotent: after request",
        kind="control",
        published=True,
        actions=(_w("after_request"), W),
        effects=0,
        outcome="Stopped, unresolved",
    ),
    Case(
        name="control-after-effect",
        title="Not idempotent: after effect",
        kind="control",
        published=True,
        actions=(_w("after_effect"), W, LEDGER, W),
        effects=1,
        outcome="Stopped and reconciled with the ledger",
    ),
    Case(
        name="control-after-confirm",
        title="Not idempotent: after confirmation",
        kind="control",
        published=True,
        actions=(_w("after_confirm"), W),
        effects=1,
        outcome="Stored result rebuilt",
    ),
    Case(
        name="blind-retry",
        title="Reference: blind retry",
        kind="control",
        published=True,
        journal=False,
        actions=(Action(do="blind", arm="after_effect"), Action(do="blind")),
        effects=2,
        outcome="Effect duplicated",
    ),
    Case(
        name="control-no-crash",
        title="Control without interruption",
        kind="control",
        published=True,
        actions=(W,),
        effects=1,
        outcome="Completed",
    ),
    # -- further than the source: every other boundary -------------------------------------
    Case(
        name="idempotent-before-commit-request",
        title="Idempotent: request written, not committed",
        kind="idempotent",
        actions=(_w("before_commit:step.requested"), W),
        effects=1,
        outcome="Intent rolled back; executed as never attempted",
    ),
    Case(
        name="control-before-commit-request",
        title="Not idempotent: request written, not committed",
        kind="control",
        actions=(_w("before_commit:step.requested"), W),
        effects=1,
        outcome="Intent rolled back; executed as never attempted",
    ),
    Case(
        name="idempotent-before-commit-effect",
        title="Idempotent: receipt written, not committed",
        kind="idempotent",
        actions=(_w("before_commit:step.effected"), W),
        effects=1,
        outcome="Existing receipt recovered",
    ),
    Case(
        name="control-before-commit-effect",
        title="Not idempotent: receipt written, not committed",
        kind="control",
        actions=(_w("before_commit:step.effected"), W, LEDGER, W),
        effects=1,
        outcome="Stopped and reconciled with the ledger",
    ),
    Case(
        name="idempotent-during-resend",
        title="Idempotent: crash again during the re-send",
        kind="idempotent",
        actions=(_w("after_request"), _w("after_resend"), W),
        effects=1,
        outcome="Re-sent twice with the same key",
    ),
    Case(
        name="control-after-approval",
        title="Approval: crash after the approval",
        kind="control",
        approval=True,
        actions=(W, APPROVE, _w("after_approval"), W),
        effects=1,
        outcome="Approved once, executed once",
    ),
    Case(
        name="control-after-reconcile",
        title="Reconciled not applied: crash before the new attempt",
        kind="control",
        actions=(_w("after_request"), W, LEDGER, _w("after_reconcile"), W),
        effects=1,
        outcome="New attempt with a new key, executed once",
    ),
)

CHECKS: dict[str, tuple[Check, ...]] = {
    "idempotent-after-request": (completed, resent_same_key),
    "idempotent-after-effect": (completed, resent_same_key, receipt_replayed),
    "idempotent-after-confirm": (completed, result_rebuilt),
    "control-after-request": (stopped_unresolved,),
    "control-after-effect": (completed, reconciled_from_ledger),
    "control-after-confirm": (completed, result_rebuilt, never_uncertain),
    "blind-retry": (duplicated,),
    "control-no-crash": (completed, never_uncertain),
    "idempotent-before-commit-request": (completed, intent_rolled_back),
    "control-before-commit-request": (completed, intent_rolled_back, never_uncertain),
    "idempotent-before-commit-effect": (completed, resent_same_key, receipt_replayed),
    "control-before-commit-effect": (completed, reconciled_from_ledger),
    "idempotent-during-resend": (completed, resent_same_key, resent_twice),
    "control-after-approval": (completed, approved_once, never_uncertain),
    "control-after-reconcile": (completed, new_attempt),
}

BY_NAME = {c.name: c for c in CASES}
assert set(CHECKS) == set(BY_NAME)


def plan_for(
    case: Case, run_id: str, adapter_type: str | None = None, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The one-step plan a case runs: a payment through the case's kind of tool (``args``: a user's own)."""
    idempotent = case.kind == "idempotent"
    step: dict[str, Any] = {"id": "pay", "adapter": "tool", "args": args or {"amount_cents": 1250, "to": "acct-42"}}
    if case.approval:
        step["approval"] = "required"
    return {
        "run_id": run_id,
        "adapters": {
            "tool": {"type": adapter_type or f"effects.{case.kind}", "version": "1", "idempotent": idempotent}
        },
        "steps": [step],
    }
