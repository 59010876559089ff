"""Fork and retry: a new run that carries a closed run's results up to a step and runs the rest.

``R`` is closed and stays closed. The fork ``R2`` starts from ``R``'s pinned plan (its own
run id, so new idempotency keys), and each step before the fork point is recorded in
``R2`` as ``step.carried``: ``R``'s receipt and key, with the seq of ``R``'s event that made
the step done, never executed again. The steps from the fork point on run as a new run's.

Where the lineage lives: ``R2``'s ``run.started`` names its parent (``forked_from``,
``from_step``, ``by``, ``reason``) and each carried step names ``R``'s event. ``R`` records
nothing: a closed run's history is final, its chain head and seal never move after its
closing event, and two forks of one run never contend for it. ``forks_of`` finds the
children by reading the first event of each run of the journal.

The fork pins the effect store as any run does, and it must be the parent's own
(``LedgerMismatch`` otherwise): the carried receipts and keys live there, and a fork's
reconciliation reads no other ledger.

A step from the fork point on that failed with an unknown outcome on an **idempotent** tool
(every send of its key lost) is sent again, under the parent's key: the fork's first batch
records it ``step.requested`` with that key and ``key_from`` naming the parent, and the
fork re-sends it as a resume re-sends any idempotent request. The tool deduplicates by its
key, so its effect happens once whichever send landed. A fork that closed before it sent such
a step (forked from an earlier step that failed) holds it ``requested``: its retry sends the
same key again, in the same way. The key goes only to the implementation the parent sent it to
(the adapter identity it pinned), as on a resume.

Refused (``ForkRefused``, exit 5) whenever a new run could repeat an effect nobody knows
the outcome of: a parent that is still open (resume it instead), a step before the fork
point that is not done, or a step from the fork point on that is uncertain, or requested on a
tool that is not idempotent, or of unknown outcome behind a step the fork makes again (done in
the parent): the parent's key would hand the fork the parent's effect as its own.
Those are reconciled, or looked up by their key, first: nothing uncertain is guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.errors import BadInput, ForkRefused, LedgerMismatch, RunOwned, UnknownStep
from effectlog.fleet.secrets import Provider
from effectlog.fold import RunState, StepState
from effectlog.journal import Journal, load_run, no_such_run
from effectlog.journal.ownership import describe
from effectlog.lifecycle.pinned import pinned_plan
from effectlog.outcome import RunOutcome
from effectlog.plan import ID_PATTERN, Plan, args_digest

if TYPE_CHECKING:
    from effectlog.actor import RunActor
    from effectlog.runtime import Runtime

_ID = re.compile(ID_PATTERN)


class ForkPoint(msgspec.Struct, frozen=True, kw_only=True):
    """What a fork will do, decided from the parent's recorded state alone (nothing written yet)."""

    parent: str
    child: str
    from_step: str
    carried: tuple[str, ...]  # the steps before the fork point, in plan order
    resent: tuple[str, ...] = ()  # idempotent steps of unknown outcome: sent again under the parent's key
    plan: Plan  # the child's plan: the parent's, under the child's run id


class ForkRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One fork of a run, as its child's run.started records it."""

    run_id: str
    forked_from: str
    from_step: str
    by: str
    reason: str
    ts: int


def _is_done(step: StepState | None) -> bool:
    """Carried by a fork: confirmed, reconciled as applied, or effected with a durable good receipt.

    An effected step's receipt is durable: a resume would only confirm it from the record
    (``Action.CONFIRM_RECORDED``), so a fork carries it rather than repeat a known effect.
    """
    if step is None:
        return False
    return step.state in ("confirmed", "reconciled") or (step.state == "effected" and step.ok is True)


def _unknown_outcome(step: StepState) -> str | None:
    """Why the step's effect is not known (so it must not run again under a new key), or None."""
    if step.state == "uncertain":
        return "is uncertain: reconcile it with evidence first"
    if step.state == "requested" and not step.idempotent:
        return "was requested and its outcome never recorded: resume or reconcile it first"
    if _lost(step) and not step.idempotent:
        return (
            f"failed with an unknown outcome ({step.reason}); its effect may exist under key "
            f"{step.idempotency_key}: effectlog will not run it again under a new key"
        )
    return None


def _lost(step: StepState) -> bool:
    """The outcome under the step's key is unknown in a closed run: failed with no answer, or still
    requested (a fork's re-sent step, recorded in its first batch, when the fork ended before it)."""
    return step.state == "requested" or (step.state == "failed" and step.applied is None and step.ok is None)


def first_unfinished(state: RunState, plan: Plan) -> str | None:
    """The first step of the plan that is not done in ``state`` (where a retry starts)."""
    return next((d.id for d in plan.steps if not _is_done(state.step(d.id))), None)


def fork_point(
    journal: Journal,
    run_id: str,
    new_run_id: str,
    *,
    from_step: str | None = None,
    plan: Plan | None = None,
    secrets: Provider | None = None,
) -> ForkPoint:
    """Check that ``run_id`` may be forked as ``new_run_id`` from ``from_step``; raises naming why not."""
    if not _ID.match(new_run_id):
        raise BadInput(f"--new-run-id {new_run_id!r} is not a valid run id (letters, digits, . _ : @ -)")
    if new_run_id == run_id:
        raise BadInput("--new-run-id must differ from --run-id: a fork is a new run", run_id=run_id)
    found = journal.owner(run_id)
    if found.live:
        raise RunOwned(f"cannot fork: the run is driven by {describe(found.owner)}", run_id=run_id)
    parent = load_run(journal, run_id)
    if parent.seq == 0:
        raise no_such_run(journal, run_id)
    if not parent.closed:
        raise ForkRefused(
            f"the run is still open ({parent.state}): resume it (effectlog recover, or run its plan again) "
            "or cancel it before forking; two open runs of one plan could both do its remaining steps",
            run_id=run_id,
        )
    if journal.head(new_run_id)[0] != 0:
        raise ForkRefused(f"run {new_run_id!r} already exists; choose a new run id", run_id=run_id)
    base = pinned_plan(parent, secrets=secrets, given=plan)
    start = from_step if from_step is not None else first_unfinished(parent, base)
    if start is None:
        raise ForkRefused(
            "every step of the run is done, so nothing is left to retry: to make steps again, fork it from one "
            f"(effectlog fork --run-id {run_id} --new-run-id NEW --from-step STEP --by NAME --reason TEXT)",
            run_id=run_id,
        )
    ids = [d.id for d in base.steps]
    if start not in ids:
        raise UnknownStep("no such step in the run's plan", run_id=run_id, step_id=start)
    cut = ids.index(start)
    for sid in ids[:cut]:
        step = parent.step(sid)
        if not _is_done(step):
            raise ForkRefused(
                f"step {sid!r} before the fork point is {step.state if step else 'pending'}, not done: "
                f"fork from {sid!r} or earlier",
                run_id=run_id,
                step_id=sid,
            )
    resent: list[str] = []
    again: str | None = None  # the first step from the fork point on done in the parent: made again on purpose
    for sid in ids[cut:]:
        step = parent.step(sid)
        why = _unknown_outcome(step) if step is not None else None
        if why is not None:
            raise ForkRefused(f"cannot fork from {start!r}: step {sid!r} {why}", run_id=run_id, step_id=sid)
        if again is None and _is_done(step):
            again = sid
        if step is not None and _lost(step):
            if again is not None:
                raise ForkRefused(  # under the parent's key, the fork would take the parent's effect as its own
                    f"cannot fork from {start!r}: step {sid!r} has an unknown outcome under the parent's key "
                    f"{step.idempotency_key}, and this fork makes {again!r} again on purpose: under that key it "
                    f"would take the parent's effect as its own, under a new one it could make it twice. Retry "
                    f"the run first (sends that key again), then fork that run from {start!r}",
                    run_id=run_id,
                    step_id=sid,
                )
            decl = base.step(sid)
            if not (base.adapters[decl.adapter].idempotent and args_digest(decl) == step.args_digest):
                raise ForkRefused(  # the pinned plan is the parent's: a mismatch means a damaged record
                    f"cannot fork from {start!r}: step {sid!r} failed with an unknown outcome and the plan no "
                    "longer declares the same idempotent request: it will not be sent again",
                    run_id=run_id,
                    step_id=sid,
                )
            resent.append(sid)
    return ForkPoint(
        parent=run_id,
        child=new_run_id,
        from_step=start,
        carried=tuple(ids[:cut]),
        resent=tuple(resent),
        plan=msgspec.structs.replace(base, run_id=new_run_id),
    )


def carried_specs(parent: RunState, point: ForkPoint, by: str, reason: str, actor: RunActor) -> list[Any]:
    """The child's first batch: run.started naming its parent, then one step.carried per step before the cut."""
    specs: list[Any] = [
        (
            ev.RunStarted,
            {
                "plan": point.plan.pinned(),
                "plan_digest": point.plan.digest,
                "adapters": actor.identities,
                "effect_store": actor.rt.context.store_to_pin(),
                "store_adapters": actor.store_users,
                "forked_from": point.parent,
                "from_step": point.from_step,
                "by": by,
                "reason": reason,
            },
        )
    ]
    for sid in point.carried:
        step = parent.step(sid)
        assert step is not None
        specs.append(
            (
                ev.StepCarried,
                {
                    "step_id": sid,
                    "from_run": point.parent,
                    "from_seq": step.last_seq,
                    "from_attempt": step.attempt,
                    "from_state": "reconciled" if step.state == "reconciled" else "confirmed",
                    "adapter": step.adapter,
                    "idempotency_key": step.idempotency_key,
                    "args_digest": step.args_digest,
                    "receipt": step.receipt,
                },
            )
        )
    for sid in point.resent:
        step = parent.step(sid)
        assert step is not None
        specs.append(
            (
                ev.StepRequested,
                {
                    "step_id": sid,
                    "attempt": 1,
                    "adapter": step.adapter,
                    "idempotency_key": step.idempotency_key,
                    "args_digest": step.args_digest,
                    "idempotent": True,
                    "key_from": point.parent,
                },
            )
        )
        actor.first_sends[sid] = f"the parent run {point.parent} never heard back from this key: same key"
    return specs


async def afork(
    runtime: Runtime,
    run_id: str,
    new_run_id: str,
    *,
    by: str,
    reason: str,
    from_step: str | None = None,
    plan: Plan | None = None,
    secrets: Provider | None = None,
    turn_held: bool = False,
) -> RunOutcome:
    """Fork ``run_id`` as ``new_run_id`` and drive the fork; the parent is only read.

    From its checks to its first commit the fork holds the parent's retry turn (``fork_turn``), unless
    its caller, a retry, holds it already (``turn_held``): a retry checks that the run has no fork, and a
    fork written between that check and the retry's own first commit went unseen.
    """
    if not by.strip() or not reason.strip():
        raise BadInput("a fork needs --by (who) and --reason (why): both are recorded", run_id=run_id)
    async with contextlib.AsyncExitStack() as turn:
        if not turn_held:
            await turn.enter_async_context(fork_turn(runtime.journal, run_id))
        return await _fork(runtime, run_id, new_run_id, turn, by, reason, from_step, plan, secrets)


async def _fork(  # noqa: PLR0917 - afork's arguments, with the turn to give up once the fork exists
    runtime: Runtime,
    run_id: str,
    new_run_id: str,
    turn: contextlib.AsyncExitStack,
    by: str,
    reason: str,
    from_step: str | None,
    plan: Plan | None,
    secrets: Provider | None,
) -> RunOutcome:
    from effectlog.actor import RunActor, refuse_other_store

    journal = runtime.journal
    point = fork_point(journal, run_id, new_run_id, from_step=from_step, plan=plan, secrets=secrets)
    # The child is claimed before anything is written, so no recovery can pick it up half-made.
    claim = journal.claim(new_run_id, "run")
    try:
        parent = load_run(journal, run_id)  # again, under the claim: what is carried is what is recorded
        _refuse_other_store_unopened(parent.effect_store, runtime.context.effects, run_id=run_id)
        if point.resent and parent.effect_store is None and runtime.context.effects is not None:
            raise ForkRefused(  # the key's record may be in any store: nothing shows the one given is it
                f"cannot fork from {point.from_step!r}: step {point.resent[0]!r} would be sent again under the "
                f"parent's key, but the parent pinned no effect store, so nothing shows that "
                f"{runtime.context.effects} is where that key was recorded; if the step's tool keeps its own "
                "keys, retry without --effects",
                run_id=run_id,
                step_id=point.resent[0],
            )
        actor = RunActor(runtime, point.plan)
        if actor.state.seq != 0:
            raise ForkRefused(f"run {new_run_id!r} already exists; choose a new run id", run_id=run_id)
        refuse_other_store(parent.effect_store, runtime.context.store_to_pin(), run_id=run_id)
        _refuse_other_sender(parent, point, actor.identities)
        runtime.writer.active_runs += 1
        try:
            await actor._record(*carried_specs(parent, point, by, reason, actor))  # one atomic batch
            await turn.aclose()  # the fork exists: a retry checking from now on sees it
            return await actor.drive()
        finally:
            runtime.writer.active_runs -= 1
    finally:
        journal.release(claim)


def _refuse_other_store_unopened(pinned: ev.EffectStoreIdentity | None, given: str | None, *, run_id: str) -> None:
    """``LedgerMismatch`` if ``given`` is not the store the parent pinned, found before the adapters open it:
    their writer open makes a store of a missing path or of an existing empty file. Read-only here, so a
    refused fork changes no file."""
    if pinned is None or given is None:
        return
    moved = not os.path.exists(pinned.path)
    where = f"the run pinned the store {pinned.store_id} at {pinned.path}" + (
        ", which is not there any more: give --effects where that store is now"
        if moved
        else f": give --effects {pinned.path}"
    )
    if not os.path.exists(given):
        raise LedgerMismatch(f"effect store {given} does not exist; {where}", run_id=run_id)
    store = EffectStore(given, read_only=True)  # BadInput (exit 2) for a file that is no effect store
    try:
        identity = store.identity
    finally:
        store.close()
    if identity.store_id != pinned.store_id:
        raise LedgerMismatch(
            f"effect store {given} (id {identity.store_id or 'none'}) is not the one the run pinned; {where}",
            run_id=run_id,
        )


def _refuse_other_sender(parent: RunState, point: ForkPoint, identities: dict[str, ev.AdapterIdentity]) -> None:
    """``ForkRefused`` if a step re-sent under the parent's key would go to another adapter than the
    parent sent it to: as for a resume (and ``repin``, refused while a step is requested), a new
    implementation may not know the key, and the effect would happen a second time."""
    for sid in point.resent:
        step = parent.step(sid)
        assert step is not None
        pinned, given = parent.adapters.get(step.adapter), identities.get(step.adapter)
        if pinned != given:
            raise ForkRefused(
                f"cannot fork from {point.from_step!r}: step {sid!r} would be sent again under the parent's key "
                f"{step.idempotency_key}, but adapter {step.adapter!r} is not the implementation the parent sent "
                "it to (its pinned identity differs): a new implementation may not know that key. Retry with "
                "the adapter the parent pinned",
                run_id=point.parent,
                step_id=sid,
            )


@contextlib.contextmanager
def retry_turn(journal: Journal, run_id: str) -> Iterator[None]:
    """Hold ``run_id``'s retry turn: a claim on a name no run can have (run ids have no spaces), so two
    retries of one run, in any processes, never both pass ``retry_run_id`` before either fork is written;
    the second is refused (``RunOwned``, exit 6). The parent itself is not claimed (nothing is written to
    it, and a run of a fleet request stays retryable)."""
    try:
        turn = journal.claim(f"{run_id} retry", "run")
    except RunOwned:
        raise RunOwned(
            "another retry of this run is under way in another process; nothing was written: when it ends, "
            "retry its fork instead",
            run_id=run_id,
        ) from None
    try:
        yield
    finally:
        journal.release(turn)


FORK_TURN_WAIT_S = 10.0  # another fork's checks and first commit take this long at most; a retry, its whole run


@contextlib.asynccontextmanager
async def fork_turn(journal: Journal, run_id: str, wait_s: float = FORK_TURN_WAIT_S) -> AsyncIterator[None]:
    """Hold ``run_id``'s retry turn (``retry_turn``'s) while a fork checks and writes its first commit.

    Another fork holds it only that long, so the turn is waited for; a retry holds it for the whole of its
    run, so a fork started meanwhile is refused (``RunOwned``, exit 6, nothing written) once ``wait_s`` is
    out: fork again when the retry has ended (its fork is then the run's, and a fork on purpose goes on)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            turn = journal.claim(f"{run_id} retry", "run")
            break
        except RunOwned:
            if time.monotonic() >= deadline:
                raise RunOwned(
                    "a retry of this run (or another fork's first commit) is under way in another process; "
                    "nothing was written: fork again when it has ended (effectlog lineage shows its fork)",
                    run_id=run_id,
                ) from None
        await asyncio.sleep(0.02)
    try:
        yield
    finally:
        journal.release(turn)


def retry_run_id(journal: Journal, run_id: str) -> str:
    """The run id ``effectlog retry`` gives its fork: the first free ``R.retryN``.

    A run is retried once: when it already has a fork, that fork carries on its work, and a
    second retry would run its remaining steps a second time under new keys. Retry the
    fork instead (or fork explicitly, which says so on purpose).
    """
    existing = forks_of(journal, run_id)
    if existing:
        names = ", ".join(f.run_id for f in existing)
        raise ForkRefused(
            f"the run was already forked as {names}: retry that run instead, or use effectlog fork to run its "
            "steps again on purpose",
            run_id=run_id,
        )
    n = 1
    while journal.head(f"{run_id}.retry{n}")[0] != 0:
        n += 1
    return f"{run_id}.retry{n}"


def forks_of(journal: Journal, run_id: str) -> list[ForkRecord]:
    """Every run of ``journal`` forked from ``run_id``, by reading each run's first event."""
    found: list[ForkRecord] = []
    for other in journal.runs():
        first = next(iter(journal.read(other)), None)
        if first is None:
            continue
        try:
            event = ev.decode(first.body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # `effectlog verify` reports it; a lineage listing only reads
        if isinstance(event, ev.RunStarted) and event.forked_from == run_id:
            found.append(
                ForkRecord(
                    run_id=other,
                    forked_from=run_id,
                    from_step=event.from_step,
                    by=event.by,
                    reason=event.reason,
                    ts=event.ts,
                )
            )
    return found
