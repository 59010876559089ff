"""The pure fold: ``apply(state, event) -> state`` and ``replay(events) -> RunState``.

No I/O, no clock, no logging, no randomness. Legality comes from the specs (via
``effectlog.spec.compiled``); every violation raises a typed error naming run,
seq and step. Each event costs O(log n) in the number of steps (a persistent
map), so the live path can apply events one by one and never re-validates the
whole history.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Generator, Iterable, Iterator
from itertools import chain as chained
from typing import Any

import immutables
import msgspec

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.errors import ChainBroken, CorruptEvent, IllegalTransition, SequenceGap
from effectlog.spec import compiled

_STEP = compiled("step")
_RUN = compiled("run")
_replace = msgspec.structs.replace

DONE_STATES = frozenset({"confirmed", "reconciled"})
# The run machine's terminal states: ``RunState.closed`` without its frame, for a hot path that asks it.
CLOSED_STATES: frozenset[str] = _RUN.terminal


class StepState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the journal says about one step.

    ``gc=False``: a step state never refers back to a state, so it cannot be part of a
    cycle; keeping its many instances out of the cyclic GC makes long replays cheaper.
    """

    step_id: str
    index: int  # order of first appearance in the run
    state: str = _STEP.spec.initial
    attempt: int = 1
    adapter: str = ""
    kind: str = "tool"
    idempotency_key: str = ""
    idempotent: bool = False
    args_digest: str = ""
    fingerprint: str = ""
    args: dict[str, Any] | None = None  # sessions: the recorded (redacted) args; plans pin theirs in the plan
    resends: int = 0
    receipt: Any = None
    ok: bool | None = None
    decision: str | None = None
    approved_digest: str | None = None
    approved_by: str | None = None
    approval_expires_at: int | None = None
    outcome: str | None = None
    evidence: str | None = None
    operator: str | None = None
    automated: bool = False
    reason: str = ""
    applied: bool | None = None  # a failed step: False when the tool said "not applied", None when unknown
    rebuilt: bool = False
    wake_at: int | None = None  # a durable sleep's wake-up time (ns)
    expired: bool = False  # failed because a deadline passed before it began
    requested_seq: int = 0
    last_seq: int = 0

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES


class RunState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the journal says about one run (``gc=False`` for the same reason as ``StepState``)."""

    run_id: str
    seq: int = 0
    head: bytes = GENESIS
    state: str = _RUN.spec.initial
    kind: str = "plan"
    plan: dict[str, Any] | None = None
    plan_digest: str = ""
    adapters: dict[str, ev.AdapterIdentity] = {}
    effect_store: ev.EffectStoreIdentity | None = None  # pinned by run.started: where evidence may come from
    plan_steps: frozenset[str] = frozenset()
    steps: immutables.Map[str, StepState] = immutables.Map()
    result: Any = None
    reason: str = ""
    blocked_step: str | None = None  # the step a suspended/stopped/failed run waits on
    deadline: int | None = None  # pinned by run.started (ns): steps not begun by then fail
    resumes: int = 0
    traceparent: str = ""  # the span of the last process that started or resumed the run (issue 16)
    started_ts: int = 0
    updated_ts: int = 0

    @property
    def closed(self) -> bool:
        return self.state in _RUN.terminal

    def step(self, step_id: str) -> StepState | None:
        return self.steps.get(step_id)

    def ordered_steps(self) -> list[StepState]:
        return sorted(self.steps.values(), key=_index_of)  # (a C getter: no frame per step; seal and outcome ask)


# Fields a stored summary (a seal, a checkpoint segment) cannot hold: the plan comes from the
# run's own Plan, the head from the chain, the steps from the summary's own per-step records.
_NOT_SUMMARISED = frozenset({"head", "steps", "plan", "plan_steps"})


def identical(a: Any, b: Any) -> bool:
    """``a == b`` with every value in them of the same type too, and a float of the same sign: what the
    journal records apart (``1``, ``1.0`` and ``true``; ``0.0`` and ``-0.0``) though Python's ``==`` holds them
    equal. For the values a segment or a frontier holds beside the replay's (``verify``), decoded from JSON or
    msgpack: dicts (their keys' order aside), lists, str, int, float, bool, None."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return bool(a.keys() == b.keys()) and all(identical(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(map(identical, a, b))
    if type(a) is float:
        return bool(a.hex() == b.hex())
    return bool(a == b)


def same_step(a: StepState | None, b: StepState | None) -> bool:
    """``a == b``, and their arbitrary values (``args``, ``receipt``) ``identical``."""
    if a is None or b is None:
        return a is b
    return a == b and identical(a.args, b.args) and identical(a.receipt, b.receipt)


def state_from_summary(summary: Any, *, head: bytes, steps: immutables.Map[str, StepState]) -> RunState:
    """A ``RunState`` from a summary struct carrying its run-level fields under the same names
    (those it lacks keep their defaults): one place, so a new run-level field reaches every summary."""
    kept = {
        name: getattr(summary, name)
        for name in RunState.__struct_fields__
        if name not in _NOT_SUMMARISED and hasattr(summary, name)
    }
    return RunState(**kept, head=head, steps=steps)


_state_of = operator.attrgetter("state")
_index_of = operator.attrgetter("index")
_id_of = operator.itemgetter("id")


def all_done(steps: Any, ids: Iterable[str]) -> bool:
    """Whether every step of ``ids`` is in ``steps`` (a map with ``get``) and done. The lookups and the
    states are read by ``map`` in C, with no Python frame per step: ``run.completed`` and a checkpoint's
    frontier ask this of every step of a plan (at 33k steps, a tenth of a full replay's fold)."""
    try:
        return DONE_STATES.issuperset(map(_state_of, map(steps.get, ids)))
    except AttributeError:  # a step the map does not have (``None`` has no state)
        return False


def _plan_step_ids(steps: Any) -> frozenset[str]:
    """The ids of a pinned plan's steps (``run.started``'s ``plan["steps"]``): those of its entries that
    are dicts with an ``"id"``. Read by ``map`` in C when every entry has one (a plan as effectlog writes
    it); any other entry takes the per-entry filter, which gives the same set or raises the same error."""
    try:
        return frozenset(map(_id_of, steps))
    except (KeyError, TypeError):  # an entry without an id, or not a dict
        return frozenset(s["id"] for s in steps if isinstance(s, dict) and "id" in s)


def initial(run_id: str) -> RunState:
    return RunState(run_id=run_id)


def apply(state: RunState, event: ev.Event) -> RunState:
    """The state after ``event``; raises when the spec or the sequence forbids it."""
    if event.run_id != state.run_id or event.seq != state.seq + 1:
        sid = event.step_key or None  # errors name the step too, as the house style requires
        if event.run_id != state.run_id:
            raise CorruptEvent(
                f"event belongs to run {event.run_id!r}", run_id=state.run_id, seq=event.seq, step_id=sid
            )
        raise SequenceGap(
            f"expected seq {state.seq + 1}, found {event.seq}", run_id=state.run_id, seq=event.seq, step_id=sid
        )
    tag = _TAG_OF.get(type(event)) or ev.tag_of(event)
    if isinstance(event, ev.StepEvent):  # (no frame of its own: the live path applies every event here)
        steps, sid = state.steps, event.step_id
        new_step = _step_after(state, steps.get(sid), len(steps), event, tag)
        return _replace(state, seq=event.seq, updated_ts=event.ts, steps=steps.set(sid, new_step))
    return _apply_run(state, event, tag)


def apply_receipt(state: RunState, effected: ev.StepEffected, confirmed: ev.StepConfirmed) -> RunState:
    """``apply(apply(state, effected), confirmed)`` (the same checks, in the same order, and the same state)
    for the batch every step records on its happy path: the step goes through the step machine twice and
    the run state and its step map are rebuilt once. A step event changes no run-level field that
    ``_step_after`` reads, so both events are checked against ``state``'s."""
    sid = effected.step_id
    if (
        effected.run_id != state.run_id
        or confirmed.run_id != state.run_id
        or effected.seq != state.seq + 1
        or confirmed.seq != effected.seq + 1
        or confirmed.step_id != sid
    ):
        return apply(apply(state, effected), confirmed)  # its errors name what is wrong
    steps = state.steps
    step = steps.get(sid)
    count = len(steps)
    mid = _step_after(state, step, count, effected, "step.effected")
    last = _step_after(state, mid, count if step is not None else count + 1, confirmed, "step.confirmed")
    return _replace(state, seq=confirmed.seq, updated_ts=confirmed.ts, steps=steps.set(sid, last))


# Hot-path lookups (the fold runs once per event on every resume): a tag by type, and the
# run machine's admission answer per (run state, tag), both derived from the specs.
_TAG_OF: dict[type[ev.Event], str] = {cls: tag for tag, cls in ev.TAGS.items()}
_ADMITTED: dict[tuple[str, str], bool] = {}
# The step machine's transitions whose destination needs no field of the event: (state, tag) -> next
# state, straight from the spec's table (the others still go through ``next_state``).
_STEP_FIXED: dict[tuple[str, str], str] = {key: dests[None] for key, (by, dests) in _STEP.table.items() if by is None}


# A new step's state after its first ``step.requested`` (``None`` if the spec gives it no fixed destination).
_FIRST_REQUEST: str | None = _STEP_FIXED.get((_STEP.spec.initial, "step.requested"))


def _admitted(run_state: str, tag: str) -> bool:
    key = (run_state, tag)
    known = _ADMITTED.get(key)
    if known is None:
        known = _ADMITTED[key] = _RUN.admitted(run_state, tag)
    return known


def _illegal(state: RunState, event: ev.Event, message: str, step_id: str | None = None) -> IllegalTransition:
    return IllegalTransition(message, run_id=state.run_id, seq=event.seq, step_id=step_id)


def _apply_run(state: RunState, event: ev.Event, tag: str) -> RunState:
    nxt = _RUN.next_state(state.state, tag, event)
    if nxt is None:
        raise _illegal(state, event, f"{tag} is not allowed while the run is {state.state}")
    changes: dict[str, Any] = {"seq": event.seq, "state": nxt, "updated_ts": event.ts}
    if isinstance(event, ev.RunStarted):
        steps = (event.plan or {}).get("steps", []) if event.kind == "plan" else []
        changes.update(
            kind=event.kind,
            plan=event.plan,
            plan_digest=event.plan_digest,
            adapters=event.adapters,
            effect_store=event.effect_store,
            plan_steps=_plan_step_ids(steps),
            started_ts=event.ts,
            deadline=event.deadline,
            traceparent=event.traceparent,
        )
    elif isinstance(event, ev.RunResumed):
        changes.update(resumes=state.resumes + 1, blocked_step=None, reason="", traceparent=event.traceparent)
        if event.effect_store is not None:
            if state.effect_store is not None:
                raise _illegal(state, event, "run.resumed pins an effect store, but the run has one pinned already")
            changes.update(effect_store=event.effect_store)
    elif isinstance(event, ev.RunSuspended | ev.RunStopped | ev.RunFailed):
        changes.update(blocked_step=event.step_id, reason=event.reason)
    elif isinstance(event, ev.RunCancelled):
        changes.update(reason=event.reason)
    elif isinstance(event, ev.RunRepinned):
        changes.update(adapters={**state.adapters, **event.adapters})
    elif isinstance(event, ev.RunCompleted):
        if state.kind == "plan":
            steps = state.steps
            if not all_done(steps, state.plan_steps):  # (this asks every step of the plan: no frame per step)
                missing = [s for s in state.plan_steps if (step := steps.get(s)) is None or not step.done]
                raise _illegal(state, event, f"run.completed with unfinished steps: {sorted(missing)}")
        changes.update(result=event.result)
    return _replace(state, **changes)


def _step_after(state: RunState, step: StepState | None, count: int, event: ev.StepEvent, tag: str) -> StepState:
    """The step's state after ``event`` (``count``: how many steps the run has seen). Reads only the
    run-level fields of ``state``, so the replay-only fold (``replay_fast``) shares it unchanged."""
    sid = event.step_id
    if not (_ADMITTED.get((state.state, tag)) or _admitted(state.state, tag)):  # cached answer first
        raise _illegal(state, event, f"{tag} is not admitted while the run is {state.state}", sid)
    if state.kind == "plan" and sid not in state.plan_steps:
        raise _illegal(state, event, "step is not in the run's plan", sid)
    if step is None:
        if type(event) is ev.StepRequested and event.attempt == 1 and _FIRST_REQUEST is not None:
            # A new step's first request (every step's first event): the new step and the change below
            # as one struct (the attempt check passed: a new step's attempt is 1; it was never approved).
            return StepState(
                step_id=sid, index=count, state=_FIRST_REQUEST, last_seq=event.seq, adapter=event.adapter,
                kind=event.kind, idempotency_key=event.idempotency_key, idempotent=event.idempotent,
                args_digest=event.args_digest, fingerprint=event.fingerprint, args=event.args,
                requested_seq=event.seq,
            )  # fmt: skip
        step = StepState(step_id=sid, index=count)
    if event.attempt != step.attempt:
        raise _illegal(state, event, f"{tag} for attempt {event.attempt}, current attempt is {step.attempt}", sid)
    nxt = _STEP_FIXED.get((step.state, tag)) or _STEP.next_state(step.state, tag, event)
    if nxt is None:
        raise _illegal(state, event, f"{tag} is not allowed from step state {step.state}", sid)
    seq = event.seq
    # The two events every step records on the happy path skip the generic change table.
    if type(event) is ev.StepConfirmed:
        return _replace(step, state=nxt, last_seq=seq, rebuilt=event.rebuilt)
    if type(event) is ev.StepEffected:
        return _replace(step, state=nxt, last_seq=seq, receipt=event.receipt, ok=event.ok)
    changes: dict[str, Any] = {"state": nxt, "last_seq": seq}
    if isinstance(event, ev.StepRequested):
        if step.state == "approved":
            if event.args_digest != step.approved_digest:
                raise _illegal(state, event, "the approval was given for different arguments", sid)
            if step.approval_expires_at is not None and event.ts > step.approval_expires_at:
                raise _illegal(state, event, "the approval expired before the request", sid)
        changes.update(
            adapter=event.adapter,
            kind=event.kind,
            idempotency_key=event.idempotency_key,
            idempotent=event.idempotent,
            args_digest=event.args_digest,
            fingerprint=event.fingerprint,
            args=event.args,
            requested_seq=event.seq,
            resends=0,
        )
    elif isinstance(event, ev.StepResent):
        if event.resend != step.resends + 1:
            raise _illegal(state, event, f"resend {event.resend} follows resend {step.resends}", sid)
        if not step.idempotent:
            raise _illegal(state, event, "a tool without idempotency was re-sent", sid)
        changes.update(resends=event.resend)
    elif isinstance(event, ev.StepEffected):
        changes.update(receipt=event.receipt, ok=event.ok)
    elif isinstance(event, ev.StepConfirmed):
        changes.update(rebuilt=event.rebuilt)
    elif isinstance(event, ev.StepFailed):
        changes.update(reason=event.reason, applied=event.applied)
    elif isinstance(event, ev.StepUncertain):
        changes.update(reason=event.reason)
    elif isinstance(event, ev.StepCarried):
        changes.update(
            adapter=event.adapter,
            idempotency_key=event.idempotency_key,
            args_digest=event.args_digest,
            receipt=event.receipt,
            ok=True,
            outcome="applied" if event.from_state == "reconciled" else None,
            rebuilt=True,
        )
    elif isinstance(event, ev.StepSleeping):
        changes.update(kind="sleep", adapter="sleep", wake_at=event.wake_at, fingerprint=event.fingerprint)
    elif isinstance(event, ev.StepExpired):
        changes.update(expired=True, applied=False, reason=f"{event.scope} deadline passed before the step began")
        if event.adapter:
            changes.update(adapter=event.adapter, kind=event.kind, fingerprint=event.fingerprint)
    elif isinstance(event, ev.StepReconciled):
        changes.update(
            outcome=event.outcome, evidence=event.evidence, operator=event.operator, automated=event.automated
        )
        if event.outcome == "not_applied":  # a new attempt, with a new key, may run
            changes.update(attempt=step.attempt + 1, idempotency_key="", resends=0, receipt=None)
    elif isinstance(event, ev.StepDenied):
        changes.update(decision=event.decision, reason=event.reason, approved_digest=None)
        if event.args_digest:  # the args a person is asked to approve
            changes.update(args_digest=event.args_digest)
        if event.adapter:
            changes.update(adapter=event.adapter, fingerprint=event.fingerprint, args=event.args)
    elif isinstance(event, ev.StepApproved):
        changes.update(
            decision="approved",
            approved_digest=event.args_digest,
            approved_by=event.by,
            approval_expires_at=event.expires_at,
            reason=event.reason,
        )
    return _replace(step, **changes)


def replay(events: Iterable[ev.Event], state: RunState | None = None, *, run_id: str | None = None) -> RunState:
    """Fold ``events`` onto ``state`` (or onto nothing). Replay of a prefix then the rest equals replay of all."""
    it = iter(events)
    if state is None:
        first = next(it, None)
        if first is None:
            if run_id is None:
                raise ValueError("replay of no events needs a run_id")
            return initial(run_id)
        state = apply(initial(first.run_id), first)
    for event in it:
        state = apply(state, event)
    return state


class Record(msgspec.Struct, frozen=True):
    """One stored row: the encoded event and its chain hash.

    ``step_id``, ``phase`` and ``attempt`` are the row's index columns (they back the
    dedup constraint) as a journal's ``read`` found them; ``None`` where a record was not
    read back (``append`` returns what it wrote). The replay re-derives them from the
    body and compares, so no stored byte lies outside what the chain covers.
    """

    run_id: str
    seq: int
    body: bytes
    hash: bytes
    step_id: str | None = None
    phase: str | None = None
    attempt: int | None = None


def replay_records(records: Iterable[Record], chain: Chain, state: RunState | None = None, *, run_id: str) -> RunState:
    """Check the chain over stored bytes, decode, compare the row's columns with the body, and fold.

    Pure: hashing is computation.
    """
    state = state if state is not None else initial(run_id)
    head = state.head
    link = chain.link
    for rec in records:
        try:
            linked = link(head, rec.body)
        except TypeError:
            raise _not_bytes(run_id, rec.seq) from None
        if linked != rec.hash:
            _raise_if_moved(rec, run_id)
            raise ChainBroken("stored hash does not match the chain over the stored bytes", run_id=run_id, seq=rec.seq)
        try:
            event = ev.decode(rec.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptEvent(f"event does not decode: {exc}", run_id=run_id, seq=rec.seq) from None
        if rec.run_id != event.run_id or rec.seq != event.seq or (rec.step_id is not None and _moved(rec, event)):
            _check_columns(rec, event, run_id)  # the hot path only compares; this names the column
        state = apply(state, event)
        head = rec.hash
    return _replace(state, head=head)


# A stored row as a journal reads it back for a replay: seq, body, hash, step_id, phase, attempt (its run id
# is the one asked for; the index columns are ``None`` where a record was not read back).
Row = tuple[int, bytes, bytes, str | None, str | None, int | None]


def replay_records_fast(
    records: Iterable[Record], chain: Chain, state: RunState | None = None, *, run_id: str
) -> RunState:
    """``replay_records`` for a reader: the same checks, the same errors and the same state, cheaper
    (``replay_rows`` over the records' columns). A record of another run than ``run_id`` (no journal's
    ``read`` gives one) and all after it go through ``replay_records`` from the state before it."""
    it = iter(records)
    stray: list[Record] = []
    state = replay_rows(rows_of(it, run_id, stray), chain, state, run_id=run_id)
    return replay_records(chained(stray, it), chain, state, run_id=run_id) if stray else state


def rows_of(records: Iterator[Record], run_id: str, stray: list[Record]) -> Iterator[Row]:
    """The records' ``Row``s up to the first record of another run than ``run_id``, which ends them and
    is put in ``stray`` (the rest stay in ``records``): the caller replays it and the rest with
    ``replay_records`` from the state ``fold_rows`` reached, so its error is the reference's."""
    for rec in records:
        if rec.run_id != run_id:
            stray.append(rec)
            return
        yield rec.seq, rec.body, rec.hash, rec.step_id, rec.phase, rec.attempt


def replay_rows(rows: Iterable[Row], chain: Chain, state: RunState | None = None, *, run_id: str) -> RunState:
    """``fold_rows`` to the end: the state after every row."""
    folding = fold_rows(rows, chain, state, run_id=run_id)
    while True:
        try:
            next(folding)  # no stops: never yields
        except StopIteration as done:
            result: RunState = done.value
            return result


def fold_rows(
    rows: Iterable[Row],
    chain: Chain,
    state: RunState | None = None,
    *,
    run_id: str,
    stops: Iterable[int] = (),
) -> Generator[tuple[RunState, set[str]], None, RunState]:
    """``replay_records`` over stored rows of ``run_id`` (``Row``: a record's columns after its run id,
    which is ``run_id``): the same checks, the same errors and the same state, cheaper; the state
    after every row is the generator's return value. At each seq of ``stops`` (ascending) it yields
    the state there and the ids of the steps changed since the previous stop (what ``verify`` compares
    with a checkpoint segment; a stop it cannot reach is not yielded, one it has passed is yielded at
    once with the state's seq not the stop's).

    The pure fold builds a new run state and a new map path for every event; this loop keeps
    the run-level state apart, collects changed steps in a dict over the starting map, and builds
    the map once at each stop and at the end. The three events of a step's happy path (its first
    ``step.requested``, ``step.effected``, ``step.confirmed``) take a short path once every check
    ``_step_after`` makes of them has passed (run admission, plan membership, attempt, the spec's
    fixed destination) and make the same change: a new step is kept as its events (``pending``) and
    its one ``StepState`` built at its confirmation, or by ``_built`` when a stop, ``run.completed``,
    the end or another event of it comes first; every other event, and every refusal, goes through
    the pure fold's own ``_step_after`` and ``_apply_run``, and every row whose columns disagree with
    its body or whose link breaks through ``_check_columns``/``_raise_if_moved`` with the row as a
    ``Record``, so the errors are theirs. ``replay_records`` stays the reference: tests check both give
    identical states (and raise the same errors) over random legal histories, tampered rows, journals
    read back with their index columns, and the crash matrix's journals.
    """
    state = state if state is not None else initial(run_id)
    head, link = state.head, chain.link
    # Locals, and no Python frame per event for the decoder or an unkeyed link: this loop is the hot path.
    decode, sha256, keyed = ev._decoder.decode, hashlib.sha256, chain.key is not None
    step_tags, fixed, step_after = _STEP_TAGS, _STEP_FIXED, _step_after
    requested, effected, confirmed = ev.StepRequested, ev.StepEffected, ev.StepConfirmed
    replace = _replace
    first = fixed.get((_STEP.spec.initial, _TAG_OF[requested]))  # a new step's state after its first request
    # The states after its ``step.effected`` and then its ``step.confirmed`` (``None``: no short path).
    after_effect = fixed.get((first, _TAG_OF[effected])) if first is not None else None
    after_confirm = fixed.get((after_effect, _TAG_OF[confirmed])) if after_effect is not None else None
    run, seq, ts, rid = state, state.seq, state.updated_ts, state.run_id
    foreign = rid != run_id  # (a row's body names ``run_id`` once its columns passed: then it names ``rid`` or not)
    admits, members = _step_admission(run)
    base = state.steps
    changed: dict[str, StepState] = {}
    # A step on its happy path, not yet built: [index, its first step.requested, its step.effected or None].
    # Its ``StepState`` is built once, at its step.confirmed (or by ``built`` when anything else needs it),
    # instead of a new struct per event: the same fields from the same events (``_step_after``'s change).
    pending: dict[str, list[Any]] = {}
    flushed: set[str] = set()  # steps changed since the last stop but moved into ``base`` (run.completed)
    added = 0  # steps seen that are not in ``base``
    upcoming = iter(stops)
    stop = next(upcoming, -1)
    for row in rows:
        while seq >= stop >= 0:
            if pending:
                _build_pending(pending, changed, first, after_effect)
            base = base.update(changed) if changed else base
            yield replace(run, seq=seq, updated_ts=ts, steps=base, head=head), flushed | changed.keys()
            changed, flushed, added = {}, set(), 0
            stop = next(upcoming, -1)
        at_col, body, digest, sid_col, phase_col, attempt_col = row
        try:
            linked = link(head, body) if keyed else sha256(head + body).digest()
        except TypeError:
            raise _not_bytes(run_id, at_col) from None
        if linked != digest:
            _raise_if_moved(Record(run_id, *row), run_id)
            raise ChainBroken("stored hash does not match the chain over the stored bytes", run_id=run_id, seq=at_col)
        try:
            event: Any = decode(body)  # (Any: the step fields below are read once ``step_tags`` says it is one)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptEvent(f"event does not decode: {exc}", run_id=run_id, seq=at_col) from None
        typ = type(event)
        step_tag = step_tags.get(typ)
        if step_tag is not None:  # a step event
            sid, at, attempt = event.step_id, event.seq, event.attempt
            tag, phase = step_tag
            if (
                at_col != at
                or event.run_id != run_id
                or (
                    sid_col is not None  # ``_moved``, inline
                    and (sid_col != sid or attempt_col != attempt or phase_col != (phase or event.phase))
                )
            ):
                _check_columns(Record(run_id, *row), event, run_id)
            if at != seq + 1 or foreign:
                apply(_replace(run, seq=seq), event)  # raises exactly what the pure fold raises
            admitted = tag in admits and (members is None or sid in members)  # else ``_step_after`` refuses it
            step: StepState | None
            mid = pending.get(sid)
            if mid is not None:  # a step between its first request and its confirmation (attempt 1)
                if admitted and attempt == 1:
                    if typ is effected and mid[2] is None:
                        mid[2] = event
                        seq, ts, head = at, event.ts, digest
                        continue
                    if typ is confirmed and mid[2] is not None and after_confirm is not None:
                        index, req, eff = mid
                        del pending[sid]
                        changed[sid] = StepState(
                            step_id=sid, index=index, state=after_confirm, last_seq=at, adapter=req.adapter,
                            kind=req.kind, idempotency_key=req.idempotency_key, idempotent=req.idempotent,
                            args_digest=req.args_digest, fingerprint=req.fingerprint, args=req.args,
                            requested_seq=req.seq, receipt=eff.receipt, ok=eff.ok, rebuilt=event.rebuilt,
                        )  # fmt: skip
                        seq, ts, head = at, event.ts, digest
                        continue
                step = changed[sid] = _built(pending.pop(sid), first, after_effect)
            else:
                step = changed.get(sid) or base.get(sid)
                if admitted and step is None and typ is requested and attempt == 1 and after_effect is not None:
                    pending[sid] = [len(base) + added, event, None]  # ``_step_after``'s new step, built later
                    added += 1
                    seq, ts, head = at, event.ts, digest
                    continue
            if admitted and step is not None and attempt == step.attempt:
                nxt = fixed.get((step.state, tag))
                if nxt is not None:
                    if typ is confirmed:
                        changed[sid] = replace(step, state=nxt, last_seq=at, rebuilt=event.rebuilt)
                        seq, ts, head = at, event.ts, digest
                        continue
                    if typ is effected:
                        changed[sid] = replace(step, state=nxt, last_seq=at, receipt=event.receipt, ok=event.ok)
                        seq, ts, head = at, event.ts, digest
                        continue
            if step is None:
                changed[sid] = step_after(run, None, len(base) + added, event, tag)
                added += 1
            else:
                changed[sid] = step_after(run, step, 0, event, tag)
        else:
            if at_col != event.seq or event.run_id != run_id or (sid_col is not None and _moved_row(row, event)):
                _check_columns(Record(run_id, *row), event, run_id)
            if event.run_id != rid or event.seq != seq + 1:
                apply(_replace(run, seq=seq), event)  # raises exactly what the pure fold raises
            if typ is ev.RunCompleted:  # the only run transition that reads the steps
                if pending:
                    _build_pending(pending, changed, first, after_effect)
                if changed:
                    flushed |= changed.keys()
                    base, changed, added = base.update(changed), {}, 0
                run = _replace(run, steps=base)
            run = _apply_run(run, event, _TAG_OF.get(typ) or ev.tag_of(event))
            admits, members = _step_admission(run)
        seq, ts = event.seq, event.ts
        head = digest
    if pending:
        _build_pending(pending, changed, first, after_effect)
    if seq >= stop >= 0:
        base = base.update(changed) if changed else base
        yield replace(run, seq=seq, updated_ts=ts, steps=base, head=head), flushed | changed.keys()
        changed, flushed = {}, set()
    return _replace(run, seq=seq, updated_ts=ts, steps=base.update(changed) if changed else base, head=head)


def _built(mid: list[Any], first: str | None, after_effect: str | None) -> StepState:
    """A pending step of ``fold_rows`` as the pure fold has it: ``_step_after``'s new step after its first
    ``step.requested``, then its ``step.effected``'s change when it had one."""
    index, req, eff = mid
    step = StepState(
        step_id=req.step_id, index=index, state=first or "", last_seq=req.seq, adapter=req.adapter, kind=req.kind,
        idempotency_key=req.idempotency_key, idempotent=req.idempotent, args_digest=req.args_digest,
        fingerprint=req.fingerprint, args=req.args, requested_seq=req.seq,
    )  # fmt: skip
    if eff is None:
        return step
    return _replace(step, state=after_effect, last_seq=eff.seq, receipt=eff.receipt, ok=eff.ok)


def _build_pending(
    pending: dict[str, list[Any]], changed: dict[str, StepState], first: str | None, after_effect: str | None
) -> None:
    """Every pending step of ``fold_rows`` built into ``changed`` (at a stop, the end, or ``run.completed``)."""
    for sid, mid in pending.items():
        changed[sid] = _built(mid, first, after_effect)
    pending.clear()


# Step event types with their tag and their fixed phase (``None``: the event's ``phase`` says), and per
# run state the step tags the run machine admits there (from the specs, as ``_admitted``): what the
# replay-only fold's short path asks.
_STEP_TAG_OF: dict[type[ev.Event], str] = {cls: tag for cls, tag in _TAG_OF.items() if issubclass(cls, ev.StepEvent)}
_STEP_ADMITS: dict[str, frozenset[str]] = {}


def _step_admission(run: RunState) -> tuple[frozenset[str], frozenset[str] | None]:
    """The step tags admitted while the run is in its state, and the step ids it may have (``None``: any)."""
    admits = _STEP_ADMITS.get(run.state)
    if admits is None:
        admits = _STEP_ADMITS[run.state] = frozenset(t for t in _STEP_TAG_OF.values() if _admitted(run.state, t))
    return admits, run.plan_steps if run.kind == "plan" else None


# The phase of most event types is their tag: compared without the property's work.
_FIXED_PHASE: dict[type[ev.Event], str] = {
    cls: tag for tag, cls in ev.TAGS.items() if not cls.repeatable and cls.phase is ev.Event.phase
}
_STEP_TAGS: dict[type[ev.Event], tuple[str, str | None]] = {
    cls: (tag, _FIXED_PHASE.get(cls)) for cls, tag in _STEP_TAG_OF.items()
}


def _not_bytes(run_id: str, seq: int) -> CorruptEvent:
    """A body that is not bytes (SQLite keeps a TEXT or INTEGER in a BLOB column): no chain covers it."""
    return CorruptEvent("stored column body is not bytes (another SQLite type)", run_id=run_id, seq=seq, column="body")


def _moved_row(row: Row, event: ev.Event) -> bool:
    """``_moved`` of a ``Row`` (its run id is the one asked for, compared apart)."""
    return _moved(Record("", *row), event)


def _moved(rec: Record, event: ev.Event) -> bool:
    """Whether the row's index columns differ from what the body says (fast; see ``_check_columns``)."""
    if isinstance(event, ev.StepEvent):
        if rec.step_id != event.step_id or rec.attempt != event.attempt:
            return True
    elif rec.step_id != "" or rec.attempt != 0:
        return True
    phase = _FIXED_PHASE.get(type(event))
    return rec.phase != (phase if phase is not None else event.phase)


def _raise_if_moved(rec: Record, run_id: str) -> None:
    """A row whose link breaks because it was moved to another run or seq: name that column."""
    try:
        event = ev.decode(rec.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # bytes changed: the broken link says it
    _check_columns(rec, event, run_id, index=False)


def _check_columns(rec: Record, event: ev.Event, run_id: str, *, index: bool = True) -> None:
    """The row's columns must be what the (hashed) body says they are.

    ``run_id`` and ``seq`` always; ``step_id``, ``phase`` and ``attempt`` (the dedup
    constraint's columns) when the journal read them back.
    """
    checks: list[tuple[str, object, object]] = [("run_id", rec.run_id, event.run_id), ("seq", rec.seq, event.seq)]
    if index and rec.step_id is not None:
        checks += [
            ("step_id", rec.step_id, event.step_key),
            ("phase", rec.phase, event.phase),
            ("attempt", rec.attempt, event.attempt_no),
        ]
    for column, stored, derived in checks:
        if stored != derived:
            raise CorruptEvent(
                f"stored column {column} disagrees with the event body: the row says {stored!r}, the body {derived!r}",
                run_id=run_id,
                seq=rec.seq,
                step_id=event.step_key or None,
                column=column,
            )
