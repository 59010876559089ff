"""What the console's pages show, read from a journal (and a fleet store): no HTTP, no writes.

Each function takes an open journal and returns plain records for a template. The
reading reuses what the CLI reads with: ``summary.summary`` (a closed run from its
seal, not a full replay), ``Journal.owner`` (whether a live process drives an open
run), ``recovery.still_blocked`` (whether a person must act), ``stake.at_stake`` (what
is at stake at a blocked step, secret values only as digests) and the step machine
from ``specs/``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from effectlog import events as ev
from effectlog.cli.run_views import HELD, condition, when
from effectlog.errors import EffectlogError
from effectlog.fleet.model import AttemptView, HistoryRow, RequestView
from effectlog.fleet.protocol import FleetStore
from effectlog.fold import RunState, StepState, replay_records
from effectlog.journal import Journal, load_sealed, no_such_run
from effectlog.recovery import Action, still_blocked
from effectlog.stake import AtStake, at_stake
from effectlog.summary import RUN_STATES, summary

PAGE_SIZE = 50
UNREADABLE = "unreadable"  # a run whose history does not replay (cut, gap, broken chain)
Why = Literal["held for approval", "uncertain", "interrupted", "ready to resume", "needs_operator", "unreadable"]


class Attention(msgspec.Struct, frozen=True, kw_only=True):
    """One run (or fleet request) that waits for a person."""

    why: Why
    run_id: str
    since: str  # when it started waiting: the run's last event (a request's creation)
    since_ts: float
    step_id: str = ""
    kind: str = "run"  # run | request
    request_id: int | None = None
    detail: str = ""


class TimelineRow(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    time: str
    label: str
    step_id: str
    attempt: str
    detail: str
    blocking: bool


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool returned for one attempt (``step.effected``), or a fork carried from its parent."""

    attempt: int
    ok: bool
    receipt: Any
    seq: int
    carried_from: str = ""  # the parent run, for a receipt carried by a fork


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One thing recorded about a step that a person weighs: a doubt, a decision, a failure."""

    seq: int
    attempt: int
    what: str  # uncertain | reconciled | approved | held | denied | failed | expired
    by: str  # who: an operator, a policy, an automated inspection ("" for the runtime)
    text: str  # the evidence, reason or error as recorded


class StepRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    state: str
    attempt: int
    decided: str  # who decided it and on what evidence, so far ("" when nobody has)
    idempotency_key: str = ""
    receipts: list[Receipt] = []
    evidence: list[Evidence] = []


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    state: RunState
    condition: str
    timeline: list[TimelineRow]
    stakes: list[AtStake]
    steps: list[StepRow]  # in step order


def attention(journal: Journal, store: FleetStore | None = None) -> list[Attention]:
    """Everything that waits for a person, oldest first."""
    found: list[Attention] = []
    for run_id in journal.runs():
        try:
            state = summary(journal, run_id)
        except EffectlogError as exc:  # one run that does not replay must not hide the others
            found.append(Attention(why="unreadable", run_id=run_id, since="", since_ts=0.0, detail=str(exc)))
            continue
        if state.closed or state.seq == 0:
            continue
        item = _waits(journal, state)
        if item is not None:
            found.append(item)
    if store is not None:
        for r in store.requests(["needs_operator"]):
            found.append(
                Attention(
                    why="needs_operator",
                    run_id=r.run_id,
                    since=when(int(r.created_at * 1e9)),
                    since_ts=r.created_at,
                    kind="request",
                    request_id=r.request_id,
                    detail=f"fleet request {r.request_id} ({r.scope}/{r.key}), attempt {r.attempt_no}",
                )
            )
    found.sort(key=lambda a: (a.since_ts, a.run_id))
    return found


def _waits(journal: Journal, state: RunState) -> Attention | None:
    blocked = still_blocked(state)
    why: Why
    if blocked is Action.WAIT_APPROVAL:
        why = "held for approval"
    elif blocked is Action.STOP_UNCERTAIN:
        why = "uncertain"
    elif journal.owner(state.run_id).live:
        return None  # a live process drives it
    elif state.state == "running":
        why = "interrupted"
    else:
        why = "ready to resume"  # decided by a person; nobody has resumed it yet
    step = state.blocked_step or ""
    detail = {
        "held for approval": f"step {step} waits for approve or deny",
        "uncertain": f"step {step} has an uncertain effect: reconcile it with evidence",
        "interrupted": "no live process drives it: resume or recover it",
        "ready to resume": f"step {step} was decided: resume the run",
    }[why]
    return Attention(
        why=why,
        run_id=state.run_id,
        since=when(state.updated_ts),
        since_ts=state.updated_ts / 1e9,
        step_id=step,
        detail=detail,
    )


def counts(items: list[Attention]) -> dict[str, int]:
    found: dict[str, int] = {}
    for a in items:
        found[a.why] = found.get(a.why, 0) + 1
    return found


def runs(journal: Journal, *, state: str = "", page: int = 1) -> tuple[list[tuple[RunState, str]], bool]:
    """One page of runs, newest first, in ``state`` (all when empty), each with its condition; and if more follow."""
    states = (state,) if state in RUN_STATES else ()
    readable: list[RunState] = []
    broken: list[tuple[RunState, str]] = []
    for run_id in journal.runs():
        try:
            found = summary(journal, run_id)
        except EffectlogError as exc:  # one run that does not replay must not hide the others
            broken.append((RunState(run_id=run_id, state=UNREADABLE), f"{UNREADABLE}: {exc}"))
            continue
        if not states or found.state in states:
            readable.append(found)
    readable.sort(key=lambda s: (-s.started_ts, s.run_id))
    rows = readable[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    shown = [(s, condition(s, journal.owner(s.run_id)) if s.state == "running" else s.state) for s in rows]
    # Unreadable runs have no start time to sort by: they head the first page, whatever the filter.
    return (broken if page == 1 else []) + shown, len(readable) > page * PAGE_SIZE


def run_page(journal: Journal, run_id: str) -> RunPage:
    if run_id not in journal.runs():
        raise no_such_run(journal, run_id, tagged=False)
    load_sealed(journal, run_id)  # a closed run whose tail was cut raises, as in `status`
    records = list(journal.read(run_id))
    state = replay_records(records, journal.chain, run_id=run_id)
    events = [ev.decode(r.body) for r in records]
    stakes = at_stake(state, journal.location)
    blocking = {a.step_id for a in stakes}
    timeline = [_row(e, blocking) for e in events]
    receipts, evidence = _recorded(events)
    steps = [
        StepRow(
            id=s.step_id,
            state=s.state,
            attempt=s.attempt,
            decided=_decided(s),
            idempotency_key=s.idempotency_key,
            receipts=receipts.get(s.step_id, []),
            evidence=evidence.get(s.step_id, []),
        )
        for s in state.ordered_steps()
    ]
    return RunPage(
        state=state,
        condition=condition(state, journal.owner(run_id)),
        timeline=timeline,
        stakes=stakes,
        steps=steps,
    )


def _recorded(events: list[Any]) -> tuple[dict[str, list[Receipt]], dict[str, list[Evidence]]]:
    """Per step, every receipt and every piece of evidence the journal holds, in journal order."""
    receipts: dict[str, list[Receipt]] = {}
    evidence: dict[str, list[Evidence]] = {}

    def note(e: Any, what: str, by: str, text: str) -> None:
        evidence.setdefault(e.step_id, []).append(
            Evidence(seq=e.seq, attempt=getattr(e, "attempt", 0) or 0, what=what, by=by, text=text)
        )

    for e in events:
        if isinstance(e, ev.StepEffected):
            receipts.setdefault(e.step_id, []).append(Receipt(attempt=e.attempt, ok=e.ok, receipt=e.receipt, seq=e.seq))
        elif isinstance(e, ev.StepCarried):
            receipts.setdefault(e.step_id, []).append(
                Receipt(attempt=e.from_attempt, ok=True, receipt=e.receipt, seq=e.seq, carried_from=e.from_run)
            )
        elif isinstance(e, ev.StepUncertain):
            note(e, "uncertain", "", e.reason)
        elif isinstance(e, ev.StepReconciled):
            how = "automated inspection" if e.automated else "a person"
            note(e, f"reconciled {e.outcome}", f"{e.operator} ({how})", e.evidence)
        elif isinstance(e, ev.StepApproved):
            note(e, "approved", e.by, f"args digest {e.args_digest}" + (f"; {e.reason}" if e.reason else ""))
        elif isinstance(e, ev.StepDenied):
            note(e, "held" if e.decision == "require_approval" else "denied", e.by, e.reason)
        elif isinstance(e, ev.StepFailed):
            applied = {False: " (not applied)", None: "", True: ""}[e.applied]
            note(e, "failed" + applied, "", e.reason)
        elif isinstance(e, ev.StepExpired):
            note(e, "expired", "", f"{e.scope} deadline passed")
    return receipts, evidence


def _decided(step: StepState) -> str:
    parts = []
    if step.approved_by:
        parts.append(f"approved by {step.approved_by}")
    if step.outcome and step.operator:
        how = "automated inspection" if step.automated else "a person"
        parts.append(f"reconciled {step.outcome} by {step.operator} ({how}): {step.evidence or ''}")
    return "; ".join(parts)


_DETAIL_FIELDS = ("decision", "outcome", "operator", "evidence", "reason", "resend", "by", "pid")


def _row(e: Any, blocking: set[str]) -> TimelineRow:
    label = HELD if isinstance(e, ev.StepDenied) and e.decision == "require_approval" else ev.tag_of(e)
    fields = msgspec.structs.asdict(e)
    detail = {k: v for k, v in fields.items() if k in _DETAIL_FIELDS and v not in ("", None)}
    if label == HELD:
        detail.pop("decision", None)
    step_id = getattr(e, "step_id", "") or ""
    return TimelineRow(
        seq=e.seq,
        time=when(e.ts),
        label=label,
        step_id=step_id,
        attempt=str(getattr(e, "attempt", "") or ""),
        detail=" ".join(f"{k}={v}" for k, v in detail.items()),
        blocking=step_id in blocking and isinstance(e, ev.StepUncertain | ev.StepDenied),
    )


class RequestPage(msgspec.Struct, frozen=True, kw_only=True):
    request: RequestView
    attempts: list[AttemptView]
    history: list[HistoryRow]


def requests(store: FleetStore, *, state: str = "") -> list[RequestView]:
    """The fleet store's requests, newest first, in ``state`` (all when empty)."""
    found = store.requests([state] if state else None)
    return sorted(found, key=lambda r: -r.request_id)


def request_page(store: FleetStore, request_id: int) -> RequestPage:
    view = store.request(request_id)  # an unknown id raises the store's own error
    return RequestPage(request=view, attempts=store.attempts(request_id), history=store.history(request_id))
