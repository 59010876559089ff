"""Reconciliation: resolving an uncertain step with external evidence. Only appends.

``applied`` counts the step as done; ``not_applied`` lets the next resume run it as
a new attempt with a new idempotency key. The event records who asserted it and
whether it was a person or an automated inspection: effectlog records the claim,
it cannot prove the outside world.

Three sources of evidence:

- a person (``reconcile``): an outcome, the evidence in words, and who asserts it;
- the step's own adapter (``reconcile_by_lookup``): the adapter the run pinned is
  built again and its ``lookup(request)`` asked about the recorded request (real
  args, key, attempt); ``None`` means it cannot tell and the step stays uncertain;
- the built-in effect store (``reconcile_from_ledger``): a shortcut for steps whose
  adapter writes into it. Only the store the run pinned is evidence; it is opened
  read-only, so a wrong file is refused and never written to.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Literal

import msgspec

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import Evidence, Request
from effectlog.adapters.registry import AdapterContext, Registry
from effectlog.errors import (
    BadInput,
    EvidenceStale,
    LedgerBehind,
    LedgerMismatch,
    LookupUndecided,
    PlanMismatch,
    describe,
    printable,
)
from effectlog.fold import RunState, StepState
from effectlog.journal import Journal
from effectlog.observe import decision
from effectlog.operator import append, load_step, refuse_unreached_attempt
from effectlog.outcome import reconcile_hint
from effectlog.plan import Plan, StepDecl, own_copy, redact
from effectlog.recorder import Clock
from effectlog.trace import Trace

Outcome = Literal["applied", "not_applied"]
LEDGER_OPERATOR = "effectlog:ledger-inspection"
LOOKUP_OPERATOR = "effectlog:adapter-lookup"
LOOKUP_TIMEOUT_S = 60.0  # a lookup of a step that declares no timeout_s


@decision("reconcile:operator")
def reconcile(
    journal: Journal,
    run_id: str,
    step_id: str,
    *,
    outcome: Outcome,
    evidence: str,
    operator: str,
    automated: bool = False,
    adapter: ev.AdapterIdentity | None = None,
    about: int | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    """Record ``outcome`` for the step's uncertain attempt; ``about``: the attempt the evidence was
    gathered for (a lookup, a ledger), refused with ``EvidenceStale`` if the step has moved on since."""
    if outcome not in ("applied", "not_applied"):
        raise BadInput(f"--outcome must be applied or not-applied, not {outcome!r}")
    if not evidence.strip():
        raise BadInput("reconcile needs --evidence: what external fact shows the outcome")
    if not operator.strip():
        raise BadInput("reconcile needs --operator: who asserts it")
    state, step = load_step(journal, run_id, step_id, needs=("uncertain",), action="reconcile")
    _check_attempt(state, step, about)
    fields: dict[str, object] = {
        "step_id": step_id,
        "attempt": step.attempt,
        "outcome": outcome,
        "evidence": evidence,
        "operator": operator,
        "automated": automated,
    }
    if adapter is not None:
        fields["adapter_identity"] = adapter
    return append(journal, state, [(ev.StepReconciled, fields)], clock, trace)


def _check_attempt(state: RunState, step: StepState, about: int | None) -> None:
    """``EvidenceStale`` unless the step's uncertain attempt is the one the evidence is ``about``."""
    refuse_unreached_attempt(step, about, state.run_id, "reconcile")
    if about is not None and step.attempt != about:
        raise EvidenceStale(
            f"the evidence is about attempt {about}, but the step is at attempt {step.attempt} now (another "
            "decision and run came in between); nothing was recorded: look again, then reconcile attempt "
            f"{step.attempt}",
            run_id=state.run_id,
            step_id=step.step_id,
        )


# -- the recorded request ---------------------------------------------------------------


def pinned_plan(state: RunState) -> Plan:
    """The plan as ``run.started`` pinned it (secret args are ``{"$secret_sha256": ...}`` placeholders)."""
    if state.kind != "plan" or state.plan is None:
        raise BadInput("only a plan run can be reconciled through its adapter", run_id=state.run_id)
    return msgspec.convert(state.plan, Plan)


def recorded_request(state: RunState, step: StepState, plan: Plan | None = None) -> tuple[Request, StepDecl]:
    """The request the step's current attempt sent: the pinned args, its key and attempt.

    ``plan`` (the same plan, by digest) supplies the real values of secret args, which
    the journal holds only as digests; without it they stay placeholders.
    """
    if plan is not None and plan.digest != state.plan_digest:
        raise PlanMismatch(
            f"the plan given is not the run's (journal has plan {state.plan_digest[:12]}, given {plan.digest[:12]})",
            run_id=state.run_id,
        )
    decl = (plan or pinned_plan(state)).step(step.step_id)
    request = Request(
        run_id=state.run_id,
        step_id=step.step_id,
        attempt=step.attempt,
        idempotency_key=step.idempotency_key,
        args=own_copy(decl.args),
        timeout_s=decl.timeout_s,
        # Without the plan a secret arg is a placeholder whose digest is not the body's: the journal's
        # digest of the real args lets a ledger tell this request's effect from another body's.
        args_digest=step.args_digest or None,
    )
    return request, decl


# -- through the step's own adapter ---------------------------------------------------------


@decision("reconcile:lookup")
def reconcile_by_lookup(
    journal: Journal,
    run_id: str,
    step_id: str,
    registry: Registry,
    *,
    effects: str | None = None,
    plan: Plan | None = None,
    attempt: int | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    """Build the step's adapter as the run pinned it, ask its ``lookup`` and record the answer
    (about the step's current attempt; ``attempt``: only if that is this one, else ``EvidenceStale``).

    Refused with nothing written: an adapter whose identity differs from the pinned one
    (``PlanMismatch``), an effect store that is not the run's (``LedgerMismatch``), an
    adapter without ``lookup`` (``BadInput``); ``lookup`` answering ``None`` or raising
    is ``LookupUndecided`` (exit 3): the step stays uncertain.
    """
    state, step = load_step(journal, run_id, step_id, needs=("uncertain",), action="reconcile")
    _check_attempt(state, step, attempt)
    request, decl = recorded_request(state, step, plan)
    name = step.adapter
    adapter_decl = pinned_plan(state).adapters[name]
    pinned_store = state.effect_store
    context = AdapterContext(effects=effects or (pinned_store.path if pinned_store else None), read_only=True)
    try:
        adapter, identity = registry.build_one(name, adapter_decl, context)
        if identity != state.adapters.get(name):
            raise PlanMismatch(
                f"adapter {name!r} ({adapter_decl.type}) is not the implementation the run pinned "
                "(fingerprint or declaration differs): its lookup is no evidence for this run",
                run_id=run_id,
                step_id=step_id,
            )
        # The store given, opened now if the factory did not (an adapter may open it on first use, in
        # ``lookup`` itself): another store's silence is no evidence for this run. With no --effects and
        # the pinned store's file gone there is nothing to mistake for it, and a lookup that asks its
        # own service still answers.
        named = effects is not None or (context.effects is not None and os.path.lexists(context.effects))
        _check_store(state, context.store_to_pin() if named else context.pinned_store(), f"--effects {context.effects}")
        lookup = getattr(adapter, "lookup", None)
        if not callable(lookup):
            raise BadInput(
                f"adapter {name!r} ({adapter_decl.type}) has no lookup(request): reconcile by hand with evidence",
                run_id=run_id,
                step_id=step_id,
            )
        found = _ask(lookup, request, decl, f"adapter {name!r} ({adapter_decl.type})", journal.location)
    finally:
        context.close()
    who = f"adapter {name!r} ({identity.type} v{identity.version}, fingerprint {identity.fingerprint[:12]})"
    return reconcile(
        journal,
        run_id,
        step_id,
        outcome="applied" if found.applied else "not_applied",
        evidence=f"automated lookup by {who}, not a person: {found.detail}",
        operator=f"{LOOKUP_OPERATOR}:{name}",
        automated=True,
        adapter=identity,
        about=request.attempt,
        clock=clock,
        trace=trace,
    )


def _ask(lookup: Any, request: Request, decl: StepDecl, who: str, journal: str) -> Evidence:
    hint = reconcile_hint(journal, request.run_id, request.step_id, request.attempt)
    # Bounded as a send is (the step's timeout_s, else LOOKUP_TIMEOUT_S): a provider that never answers
    # held the console's worker (and the operator's page) for ever. The thread is left to end on its own.
    limit = decl.timeout_s if decl.timeout_s is not None else LOOKUP_TIMEOUT_S
    answered: list[Any] = []
    failed: list[BaseException] = []

    def ask() -> None:
        try:
            answered.append(lookup(request))
        except BaseException as exc:  # handed to the caller below, as if raised there
            failed.append(exc)

    adapter = getattr(lookup, "__self__", None)
    if not getattr(adapter, "blocking", True) and decl.timeout_s is None:
        ask()  # as the runtime sends to it: an adapter that says it never blocks is called on this thread
    else:
        worker = threading.Thread(target=ask, name="effectlog-lookup", daemon=True)
        worker.start()
        worker.join(limit)
    if not (answered or failed):
        raise LookupUndecided(
            f"{who}: lookup did not answer within {limit:g}s; the step stays uncertain: {hint}",
            run_id=request.run_id,
            step_id=request.step_id,
        )
    try:
        if failed:
            raise failed[0]
        found = answered[0] if answered else None
    except KeyboardInterrupt:
        raise  # the operator's Ctrl-C during an inline lookup: nothing was recorded (exit 130)
    except BaseException as exc:  # an Exception, or sys.exit() / GeneratorExit from the lookup: no answer
        raise LookupUndecided(
            redact(decl, f"{who}: lookup failed ({describe(exc)}); the step stays uncertain: {hint}"),
            run_id=request.run_id,
            step_id=request.step_id,
        ) from None
    if found is None:
        raise LookupUndecided(
            f"{who}: lookup cannot tell whether attempt {request.attempt}'s effect exists; "
            f"the step stays uncertain; reconcile by hand with evidence: {hint}",
            run_id=request.run_id,
            step_id=request.step_id,
        )
    if not isinstance(found, Evidence):
        raise BadInput(
            f"{who}: lookup returned {type(found).__name__}, expected Evidence or None; nothing was recorded",
            run_id=request.run_id,
            step_id=request.step_id,
        )
    # Evidence is a Struct whose constructor checks no types: Evidence(applied=None) ("the provider could not
    # tell") or applied="false" would be read by truthiness, a new attempt or an effect taken as done.
    if not isinstance(found.applied, bool):
        raise BadInput(
            f"{who}: lookup returned Evidence.applied={printable(found.applied)[:60]} "
            f"({type(found.applied).__name__}), expected True or False (return None when it cannot tell); "
            "nothing was recorded",
            run_id=request.run_id,
            step_id=request.step_id,
        )
    return msgspec.structs.replace(found, detail=printable(found.detail))


# -- the built-in effect store's shortcut --------------------------------------------------


def open_run_store(state: RunState, path: str) -> EffectStore:
    """The effect store at ``path``, read-only, if and only if it is the one the run pinned."""
    try:
        store = EffectStore(path, read_only=True)
    except BadInput as exc:
        raise BadInput(f"--from-ledger {exc.message}", run_id=state.run_id) from None
    try:
        if state.effect_store is None and not any(a.type.startswith("effects.") for a in state.adapters.values()):
            raise BadInput(
                f"--from-ledger {path}: run {state.run_id!r} uses no effect store (its adapters keep their own "
                "records): reconcile with --lookup, or by hand; nothing was written"
            )
        _check_store(state, store.identity, f"--from-ledger {path}")
    except BaseException:
        store.close()
        raise
    return store


def store_users(journal: Journal, state: RunState) -> tuple[str, ...]:
    """The adapters of the run that asked for the effect store when built (``run.started.store_adapters``;
    empty for a run older than that field)."""
    first = next(iter(journal.read(state.run_id)), None)
    started = ev.decode(first.body) if first is not None else None
    return started.store_adapters if isinstance(started, ev.RunStarted) else ()


def _refuse_if_not_a_store_user(users: tuple[str, ...], adapter: str, path: str, run_id: str) -> None:
    """The effect store is evidence only for steps whose adapter writes it: refused (``BadInput``) for
    an adapter the run recorded as not asking for the store. Its absence from the store's rows says
    nothing about an effect made elsewhere. A run older than ``run.started.store_adapters`` cannot tell."""
    if users and adapter not in users:
        raise BadInput(
            f"--from-ledger {path}: the step's adapter {adapter!r} does not write the effect store (it keeps its "
            "own records), so the store's rows are no evidence for it: reconcile with --lookup, or by hand; "
            "nothing was written",
            run_id=run_id,
        )


def _refuse_if_behind(store: EffectStore, state: RunState, users: tuple[str, ...], path: str) -> None:
    """``LedgerBehind`` when the store is older than the journal, so that a row's absence in it says nothing.

    Two signs, since a copy of the store carries the store's id: the file is not the one at the location the
    run pinned (a backup beside it: the pinned path names another file from here), or it lacks the effect of
    a step of the run the journal recorded as confirmed through the store (a store restored from a backup, in
    place or elsewhere). A copy made after the run's last confirmed effect and before the uncertain one
    shows neither: the limit of what the store's own rows can tell (docs/plan.md)."""
    pinned = state.effect_store
    if pinned is not None and pinned.path and os.path.exists(pinned.path):
        try:
            same = os.path.samefile(pinned.path, path)
        except OSError:
            same = False
        if not same:
            raise LedgerBehind(
                f"--from-ledger {path}: not the run's effect store but another file with its id (a copy?): the run "
                f"pinned {pinned.path}, which is there. A copy's missing row is no evidence that the effect did not "
                f"happen; give --from-ledger {pinned.path}, or reconcile by hand; nothing was recorded",
                run_id=state.run_id,
            )
    writes = users or tuple(name for name, a in state.adapters.items() if a.type.startswith("effects."))
    # By key, not by run and step: a fork's carried steps were made under its parent's run id.
    done = [s for s in state.ordered_steps() if s.state == "confirmed" and s.adapter in writes and s.idempotency_key]
    missing = store.missing_keys({step.idempotency_key for step in done})
    for step in done:
        if step.idempotency_key in missing:
            raise LedgerBehind(
                f"--from-ledger {path}: the store holds no effect of step {step.step_id!r}, which the journal "
                "recorded as confirmed through it: the store is older than the journal (restored from a backup?), "
                "so its missing rows are no evidence; reconcile by hand; nothing was recorded",
                run_id=state.run_id,
                step_id=step.step_id,
            )


def _check_store(state: RunState, given: ev.EffectStoreIdentity | None, where: str) -> None:
    pinned = state.effect_store
    if pinned is None or given is None or pinned.store_id == given.store_id:
        return  # a run older than pinned stores cannot say which store is its own
    raise LedgerMismatch(
        f"{where}: effect store id {given.store_id or 'none (a store older than store ids)'} is not the one "
        f"the run pinned ({pinned.store_id}, at {pinned.path}): its ledger is no evidence for this run; "
        "nothing was recorded or written",
        run_id=state.run_id,
    )


@decision("reconcile:ledger")
def reconcile_from_ledger(
    journal: Journal,
    run_id: str,
    step_id: str,
    path: str,
    *,
    attempt: int | None = None,
    clock: Clock = time.time_ns,
    trace: Trace | None = None,
) -> RunState:
    """Automated reconciliation: ask the run's own effect store whether this attempt's effect exists."""
    state, step = load_step(journal, run_id, step_id, needs=("uncertain",), action="reconcile")
    _check_attempt(state, step, attempt)
    request, _ = recorded_request(state, step)
    users = store_users(journal, state)
    _refuse_if_not_a_store_user(users, step.adapter, path, state.run_id)
    store = open_run_store(state, path)
    try:
        _refuse_if_behind(store, state, users, path)
        found = store.lookup(request, body=step.args_digest or None)  # the journal's digest of the real args
        pinned = "" if state.effect_store is None else f" (store id {store.store_id}, pinned by the run)"
    finally:
        store.close()
    return reconcile(
        journal,
        run_id,
        step_id,
        outcome="applied" if found.applied else "not_applied",
        evidence=f"automated ledger inspection, not a person: {found.detail}{pinned}",
        operator=LEDGER_OPERATOR,
        automated=True,
        about=request.attempt,
        clock=clock,
        trace=trace,
    )
