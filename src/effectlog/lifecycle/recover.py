"""Recovery at start-up: find every run nobody drives and drive the ones no person waits on.

``pending`` lists the open runs of a journal that have no live owner, and says for each
whether it waits for a person (an approval, or the reconciliation of an uncertain step)
or can be driven again now. ``arecover`` drives every such plan run from the plan its
own journal pinned (``effectlog.lifecycle.pinned``), all at once, each under its own
claim (``Journal.claim``): two recoveries at once never drive one run twice, because the
second one's claim is refused (``RunOwned``) and that run is reported as skipped, or it
finds the run already closed and writes nothing (a closed run never reopens). Session
runs are listed, not driven: only the application that owns their code can re-drive them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import msgspec

from effectlog.errors import EffectlogError, RunOwned
from effectlog.fleet.secrets import Provider
from effectlog.fold import RunState
from effectlog.journal import Journal, load_resumable, load_run
from effectlog.journal.ownership import describe
from effectlog.lifecycle.pinned import pinned_plan
from effectlog.plan import Plan
from effectlog.recovery import Action, still_blocked

if TYPE_CHECKING:
    from effectlog.runtime import Runtime

Waits = Literal["approval", "reconciliation"]


class PendingRun(msgspec.Struct, frozen=True, kw_only=True):
    """An open run that no live owner drives: what it is, and whether a person must act first."""

    run_id: str
    kind: str  # "plan" or "session"
    state: str  # the run machine's state: running (interrupted), suspended or stopped
    waits: Waits | None = None  # None: it can be driven again now
    blocked_step: str | None = None


class Recovered(msgspec.Struct, frozen=True, kw_only=True):
    """What one recovery did with one open run."""

    run_id: str
    action: Literal["resumed", "skipped", "refused"]
    state: str  # the run's state after it
    exit_status: int  # what `effectlog run` would have exited with for this run (0 for a skip)
    message: str


def pending(journal: Journal) -> list[PendingRun]:
    """Every open run of ``journal`` with no live owner, in run-id order."""
    return [run for run, owner in open_runs(journal) if owner is None]


def open_runs(journal: Journal, errors: dict[str, EffectlogError] | None = None) -> list[tuple[PendingRun, str | None]]:
    """Every open run of ``journal``, with its live owner described (``None`` when nobody drives it).

    A run whose history does not replay raises, unless ``errors`` collects it by run id.
    """
    found: list[tuple[PendingRun, str | None]] = []
    for run_id in journal.runs():
        owned = journal.owner(run_id)
        try:
            state = load_resumable(journal, run_id)  # a closed run is read from its seal, cheaply
        except EffectlogError as exc:
            if errors is None:
                raise
            errors[run_id] = exc
            continue
        if state.closed or state.seq == 0:
            continue
        found.append((_pending_of(state), describe(owned.owner) if owned.live else None))
    return found


def _pending_of(state: RunState) -> PendingRun:
    blocked = still_blocked(state)
    waits: Waits | None = None
    if blocked is Action.WAIT_APPROVAL:
        waits = "approval"
    elif blocked is Action.STOP_UNCERTAIN:
        waits = "reconciliation"
    return PendingRun(
        run_id=state.run_id, kind=state.kind, state=state.state, waits=waits, blocked_step=state.blocked_step
    )


async def arecover(
    runtime: Runtime, *, plans: Mapping[str, Plan] | None = None, secrets: Provider | None = None
) -> list[Recovered]:
    """Drive every open plan run nobody drives and no person waits on; report every open run it saw."""
    journal = runtime.journal
    report: dict[str, Recovered] = {}
    drives: dict[str, Plan] = {}
    unreadable: dict[str, EffectlogError] = {}
    for run, owner in open_runs(journal, unreadable):
        if owner is not None:  # another recovery, or any process, drives it: it is theirs
            report[run.run_id] = _skipped(run, f"driven by {owner}")
        elif run.kind != "plan":
            report[run.run_id] = _skipped(run, "a session run: the application that owns its code re-drives it")
        elif run.waits == "approval":
            report[run.run_id] = _skipped(run, f"step {run.blocked_step!r} waits for approval (effectlog approve|deny)")
        elif run.waits == "reconciliation":
            report[run.run_id] = _skipped(
                run, f"step {run.blocked_step!r} has an uncertain effect: reconcile it with evidence first"
            )
        else:
            try:
                given = (plans or {}).get(run.run_id)
                drives[run.run_id] = pinned_plan(load_run(journal, run.run_id), secrets=secrets, given=given)
            except EffectlogError as exc:
                report[run.run_id] = Recovered(
                    run_id=run.run_id, action="refused", state=run.state, exit_status=exc.exit_status, message=str(exc)
                )
    for run_id, error in unreadable.items():  # reported, not fatal: the other runs are still recovered
        report[run_id] = Recovered(
            run_id=run_id, action="refused", state="unknown", exit_status=error.exit_status, message=str(error)
        )
    results = await asyncio.gather(*(_drive(runtime, plan) for plan in drives.values()))
    report.update((r.run_id, r) for r in results)
    return [report[k] for k in sorted(report)]


def _skipped(run: PendingRun, why: str) -> Recovered:
    return Recovered(run_id=run.run_id, action="skipped", state=run.state, exit_status=0, message=why)


async def _drive(runtime: Runtime, plan: Plan) -> Recovered:
    try:
        outcome = await runtime.arun(plan)
    except RunOwned as exc:  # another recovery (or a process) claimed it first: it drives the run, not us
        owner = runtime.journal.owner(plan.run_id).owner
        return Recovered(
            run_id=plan.run_id,
            action="skipped",
            state="running",
            exit_status=0,
            message=f"driven by {describe(owner)} ({exc.message})",
        )
    except EffectlogError as exc:
        return Recovered(
            run_id=plan.run_id, action="refused", state="running", exit_status=exc.exit_status, message=str(exc)
        )
    if outcome.events_written == 0:
        # Someone else finished (or blocked) it between our look and our claim: nothing was driven here.
        return Recovered(
            run_id=plan.run_id,
            action="skipped",
            state=outcome.state,
            exit_status=0,
            message=f"already {outcome.state}: another process drove it",
        )
    return Recovered(
        run_id=plan.run_id,
        action="resumed",
        state=outcome.state,
        exit_status=outcome.exit_status,
        message=outcome.message,
    )
