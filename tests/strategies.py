"""Hypothesis strategies: one per event type, and legal run histories walked from the specs.

``legal_walks()`` builds a history by a random walk over the compiled step and run
specs (``effectlog.spec.compiled``): from the current states it lists every event the
spec allows, keeps those that also pass the fold's own guards (run admission,
attempts, resend counters, approval digest binding, completion of the plan), picks
one and moves its own model with ``Compiled.next_state``. The model never asks the
fold, so a test can compare the fold's answer with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.canonical import digest
from effectlog.spec import Compiled, compiled

STEP = compiled("step")
RUN = compiled("run")

# The fold's notion of "done" (run.completed needs every plan step in one of these).
# Written out here, not imported, so the walk stays an independent oracle.
DONE = frozenset({"confirmed", "reconciled"})

_INT64 = 2**63 - 1
# Far enough ahead that no walk reaches it: walks never meet an expired approval.
_NEVER_EXPIRES = 2**62

Draw = Callable[[st.SearchStrategy[Any]], Any]

# -- field values -------------------------------------------------------------------

ids = st.text(min_size=1, max_size=12)
names = st.text(st.characters(categories=["L", "N"], include_characters="-_."), min_size=1, max_size=12)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
seqs = st.integers(1, 2**40)
timestamps = st.integers(0, 2**62)
reasons = st.text(max_size=20)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-_INT64 - 1, _INT64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


def plans(step_ids: st.SearchStrategy[list[str]] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """A plan document: steps with ids, a tool name and nested JSON args."""
    step_ids = step_ids if step_ids is not None else st.lists(ids, min_size=1, max_size=5, unique=True)

    @st.composite
    def build(draw: Draw) -> dict[str, Any]:
        steps = [{"id": sid, "tool": draw(names), "args": draw(json_objects)} for sid in draw(step_ids)]
        return {"steps": steps, **draw(st.dictionaries(st.sampled_from(["name", "note"]), json_values))}

    return build()


adapter_identities = st.builds(
    ev.AdapterIdentity, type=names, version=names, idempotent=st.booleans(), fingerprint=digests | st.just("")
)

# -- one strategy per event type ------------------------------------------------------

_common: dict[str, st.SearchStrategy[Any]] = {"run_id": ids, "seq": seqs, "ts": timestamps}
_step: dict[str, st.SearchStrategy[Any]] = {**_common, "step_id": ids, "attempt": st.integers(1, 1000)}

EVENT_STRATEGIES: dict[type[ev.Event], st.SearchStrategy[Any]] = {
    ev.RunStarted: st.builds(
        ev.RunStarted,
        **_common,
        kind=st.sampled_from(["plan", "session"]),
        plan=st.none() | plans(),
        plan_digest=digests,
        adapters=st.dictionaries(names, adapter_identities, max_size=3),
    ),
    ev.RunResumed: st.builds(ev.RunResumed, **_common, pid=st.integers(0, 2**22)),
    ev.RunSuspended: st.builds(ev.RunSuspended, **_common, step_id=ids, reason=reasons),
    ev.RunStopped: st.builds(ev.RunStopped, **_common, step_id=ids, reason=reasons),
    ev.RunCompleted: st.builds(ev.RunCompleted, **_common, result=json_values),
    ev.RunFailed: st.builds(ev.RunFailed, **_common, step_id=st.none() | ids, reason=reasons),
    ev.RunCancelled: st.builds(ev.RunCancelled, **_common, by=names, reason=reasons),
    ev.StepRequested: st.builds(
        ev.StepRequested,
        **_step,
        adapter=names,
        idempotency_key=digests,
        args_digest=digests,
        idempotent=st.booleans(),
        kind=st.sampled_from(["tool", "model"]),
        fingerprint=digests | st.just(""),
    ),
    ev.StepResent: st.builds(ev.StepResent, **_step, resend=st.integers(1, 100), reason=reasons),
    ev.StepEffected: st.builds(ev.StepEffected, **_step, receipt=json_values, ok=st.booleans()),
    ev.StepConfirmed: st.builds(ev.StepConfirmed, **_step, rebuilt=st.booleans()),
    ev.StepUncertain: st.builds(ev.StepUncertain, **_step, reason=reasons),
    ev.StepReconciled: st.builds(
        ev.StepReconciled,
        **_step,
        outcome=st.sampled_from(["applied", "not_applied"]),
        evidence=st.text(max_size=40),
        operator=names,
        automated=st.booleans(),
    ),
    ev.StepDenied: st.builds(
        ev.StepDenied,
        **_step,
        decision=st.sampled_from(["deny", "require_approval"]),
        by=names,
        reason=reasons,
        args_digest=digests | st.just(""),
    ),
    ev.StepApproved: st.builds(
        ev.StepApproved,
        **_step,
        by=names,
        args_digest=digests,
        reason=reasons,
        expires_at=st.none() | timestamps,
    ),
    ev.StepFailed: st.builds(ev.StepFailed, **_step, reason=reasons, applied=st.none() | st.booleans()),
    ev.RunRepinned: st.builds(
        ev.RunRepinned,
        **_common,
        adapters=st.dictionaries(names, adapter_identities, max_size=3),
        previous=st.dictionaries(names, adapter_identities, max_size=3),
        version=names,
        by=names,
        reason=reasons,
    ),
    ev.StepCarried: st.builds(
        ev.StepCarried,
        **_step,
        from_run=ids,
        from_seq=seqs,
        from_attempt=st.integers(1, 1000),
        from_state=st.sampled_from(["confirmed", "reconciled"]),
        adapter=names,
        idempotency_key=digests,
        args_digest=digests,
        receipt=json_values,
    ),
    ev.StepSleeping: st.builds(ev.StepSleeping, **_step, wake_at=st.integers(0, 2**62), fingerprint=digests),
    ev.StepWoke: st.builds(ev.StepWoke, **_step),
    ev.StepExpired: st.builds(
        ev.StepExpired,
        **_step,
        deadline=st.integers(0, 2**62),
        scope=st.sampled_from(["step", "run"]),
        adapter=names,
        kind=st.sampled_from(["tool", "model", "sleep"]),
        fingerprint=digests,
    ),
}

any_event: st.SearchStrategy[ev.Event] = st.one_of(*EVENT_STRATEGIES.values())

# -- legal histories ------------------------------------------------------------------

# A small pool, so approvals and requests often (not always) agree on the args digest.
_ARGS_DIGESTS = st.sampled_from([digest({"n": n}) for n in range(3)])


@dataclass(frozen=True)
class StepModel:
    """What the walk knows about one step, moved only by the spec."""

    state: str = STEP.spec.initial
    attempt: int = 1
    resends: int = 0
    idempotent: bool = False
    approved_digest: str | None = None


@dataclass(frozen=True)
class Walk:
    """A legal history and the states the spec says it ends in."""

    run_id: str
    plan_steps: tuple[str, ...]
    events: list[ev.Event] = field(default_factory=list)
    run_state: str = RUN.spec.initial
    steps: dict[str, StepModel] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        return len(self.events)

    @property
    def ts(self) -> int:
        return self.events[-1].ts if self.events else 0

    def step(self, step_id: str) -> StepModel:
        return self.steps.get(step_id, StepModel())


# A move: (event tag, step id or None for run events, value of the spec's `by` field or None).
Move = tuple[str, str | None, str | None]


def _options(compiled_spec: Compiled) -> list[tuple[str, str | None, str | None]]:
    """(event tag, `by` field, one of its values) for every event of a spec; field and value None without `by`."""
    out = []
    for t in sorted(compiled_spec.spec.transitions, key=lambda t: t.event):
        if t.internal:
            out.append((t.event, None, None))
            continue
        out += [(t.event, t.by, value) for value in sorted(t.destinations(), key=str)]
    return out


_RUN_OPTIONS = _options(RUN)
_STEP_OPTIONS = _options(STEP)


def _spec_moves(walk: Walk, *, legal: bool) -> list[Move]:
    """Every (tag, step, by-value) the specs allow (``legal``) or forbid from where the walk is."""
    out: list[Move] = [
        (tag, None, None) for tag, _, _ in _RUN_OPTIONS if (RUN.next_state(walk.run_state, tag) is not None) == legal
    ]
    for sid in walk.plan_steps:
        state = walk.step(sid).state
        for tag, by, value in _STEP_OPTIONS:
            fields = {} if by is None else {by: value}
            allowed = RUN.admitted(walk.run_state, tag) and STEP.next_state(state, tag, fields) is not None
            if allowed == legal:
                out.append((tag, sid, value))
    return out


def legal_moves(walk: Walk) -> list[Move]:
    """Moves the spec allows AND the fold's guards accept (resend needs idempotency, completion a done plan)."""
    out = []
    for tag, sid, value in _spec_moves(walk, legal=True):
        if tag == "step.resent" and sid is not None and not walk.step(sid).idempotent:
            continue
        if tag == "run.completed" and not all(walk.step(s).state in DONE for s in walk.plan_steps):
            continue
        out.append((tag, sid, value))
    return out


def spec_illegal_moves(walk: Walk) -> list[Move]:
    """Moves the specs forbid from where the walk is (by state or by run admission)."""
    return _spec_moves(walk, legal=False)


def build_event(draw: Draw, walk: Walk, move: Move, *, seq: int | None = None) -> ev.Event:
    """The event for ``move`` as the next one of ``walk`` (valid field values, current attempt)."""
    tag, sid, value = move
    common: dict[str, Any] = {
        "run_id": walk.run_id,
        "seq": walk.seq + 1 if seq is None else seq,
        "ts": walk.ts + draw(st.integers(0, 1000)),
    }
    cls = ev.TAGS[tag]
    if sid is None:
        return cls(**common, **_run_fields(draw, walk, tag))
    step = walk.step(sid)
    fields = _step_fields(draw, step, tag, value, common["ts"])
    return cls(**common, step_id=sid, attempt=step.attempt, **fields)


def _run_fields(draw: Draw, walk: Walk, tag: str) -> dict[str, Any]:
    some_step = st.sampled_from(walk.plan_steps)
    if tag == "run.resumed":
        return {"pid": draw(st.integers(1, 2**22))}
    if tag in ("run.suspended", "run.stopped"):
        return {"step_id": draw(some_step), "reason": draw(reasons)}
    if tag == "run.completed":
        return {"result": draw(json_values)}
    if tag == "run.failed":
        return {"step_id": draw(st.none() | some_step), "reason": draw(reasons)}
    if tag == "run.cancelled":
        return {"by": draw(names), "reason": draw(reasons)}
    if tag == "run.repinned":
        return {"adapters": draw(st.dictionaries(names, adapter_identities, max_size=2)), "by": "op", "reason": "up"}
    if tag == "run.started":
        plan = {"steps": [{"id": s} for s in walk.plan_steps]}
        return {"plan": plan, "plan_digest": digest(plan)}
    raise AssertionError(f"no field builder for {tag}")  # a new event type needs one here


def _step_fields(draw: Draw, step: StepModel, tag: str, value: str | None, ts: int) -> dict[str, Any]:
    if tag == "step.requested":
        bound = step.approved_digest if step.state == "approved" else None
        return {
            "adapter": draw(names),
            "idempotency_key": draw(digests),
            "args_digest": bound if bound is not None else draw(_ARGS_DIGESTS),
            "idempotent": draw(st.booleans()),
            "kind": draw(st.sampled_from(["tool", "model"])),
        }
    if tag == "step.resent":
        return {"resend": step.resends + 1, "reason": draw(reasons)}
    if tag == "step.effected":
        return {"receipt": draw(json_values), "ok": draw(st.booleans())}
    if tag == "step.confirmed":
        return {"rebuilt": draw(st.booleans())}
    if tag in ("step.uncertain", "step.failed"):
        return {"reason": draw(reasons)}
    if tag == "step.reconciled":
        return {
            "outcome": value,
            "evidence": draw(st.text(max_size=30)),
            "operator": draw(names),
            "automated": draw(st.booleans()),
        }
    if tag == "step.denied":
        return {"decision": value, "by": draw(st.sampled_from(["policy", "person"])), "reason": draw(reasons)}
    if tag == "step.carried":
        return {"from_run": "parent", "from_seq": draw(seqs), "from_state": value, "receipt": draw(json_values)}
    if tag == "step.sleeping":
        return {"wake_at": ts + draw(st.integers(0, 10**12))}
    if tag == "step.woke":
        return {}
    if tag == "step.expired":
        return {"deadline": ts, "scope": draw(st.sampled_from(["step", "run"]))}
    if tag == "step.approved":
        return {
            "by": draw(names),
            "args_digest": draw(_ARGS_DIGESTS),
            "expires_at": draw(st.sampled_from([None, ts + _NEVER_EXPIRES])),
        }
    raise AssertionError(f"no field builder for {tag}")  # a new event type needs one here


def advance(walk: Walk, event: ev.Event) -> Walk:
    """The walk after a legal ``event``, moved by the spec and the attempt/resend/approval rules."""
    tag = ev.tag_of(event)
    events = [*walk.events, event]
    if not isinstance(event, ev.StepEvent):
        nxt = RUN.next_state(walk.run_state, tag, event)
        assert nxt is not None, f"walk chose an illegal run event {tag} from {walk.run_state}"
        return replace(walk, events=events, run_state=nxt)
    step = walk.step(event.step_id)
    nxt = STEP.next_state(step.state, tag, event)
    assert nxt is not None, f"walk chose an illegal step event {tag} from {step.state}"
    step = replace(step, state=nxt)
    if isinstance(event, ev.StepRequested):
        step = replace(step, idempotent=event.idempotent, resends=0)
    elif isinstance(event, ev.StepResent):
        step = replace(step, resends=event.resend)
    elif isinstance(event, ev.StepReconciled) and event.outcome == "not_applied":
        step = replace(step, attempt=step.attempt + 1, resends=0)
    elif isinstance(event, ev.StepApproved):
        step = replace(step, approved_digest=event.args_digest)
    elif isinstance(event, ev.StepDenied):
        step = replace(step, approved_digest=None)
    return replace(walk, events=events, steps={**walk.steps, event.step_id: step})


@st.composite
def legal_walks(draw: Draw, run_id: str | None = None, max_events: int = 40) -> Walk:
    """run.started with a plan of 1..5 steps, then random legal events, ending anywhere."""
    run_id = draw(ids) if run_id is None else run_id
    plan = draw(plans())
    step_ids = tuple(s["id"] for s in plan["steps"])
    walk = Walk(run_id=run_id, plan_steps=step_ids)
    started = ev.RunStarted(
        run_id=run_id,
        seq=1,
        ts=draw(st.integers(0, 2**40)),
        plan=plan,
        plan_digest=digest(plan),
        adapters=draw(st.dictionaries(names, adapter_identities, max_size=2)),
    )
    walk = advance(walk, started)
    length = draw(st.integers(0, max_events))
    # Moves are picked by a seeded Random: hypothesis' own choices favour the first candidates
    # (closing the run), and the weights below would be lost. Failures still shrink by length.
    rnd = draw(st.randoms(use_true_random=True))
    while walk.seq <= length:
        moves = legal_moves(walk)
        if not moves:  # a closed run accepts nothing more
            break
        # Mostly move forward: a uniform pick closes most runs (fail, cancel) or denies most steps
        # within a few events, and the paths that matter (reconcile, approve, resend) go unvisited.
        forward = set(_forward(walk, moves))
        weights = [_WEIGHT.get(m[0], 8) if m in forward else 1 for m in moves]
        walk = advance(walk, build_event(draw, walk, rnd.choices(moves, weights)[0]))
    return walk


# Relative weight of each forward move; any other legal move (closing the run, resuming a
# running run, denying or failing a step) has weight 1.
_WEIGHT = {
    "step.requested": 12,
    "step.resent": 8,
    "step.effected": 12,
    "step.confirmed": 12,
    "step.uncertain": 8,
    "step.reconciled": 16,
    "step.approved": 16,
    "run.resumed": 16,
    "run.suspended": 8,
    "run.stopped": 16,
    "run.completed": 16,
}


def _forward(walk: Walk, moves: list[Move]) -> list[Move]:
    """Moves that take the run further: step moves that do not end the step short of done
    (denied, failed), and run moves that a step's state calls for."""
    states = {walk.step(s).state for s in walk.plan_steps}
    wanted = {
        "run.completed",
        *(["run.resumed"] if walk.run_state != "running" else []),
        *(["run.suspended"] if "awaiting_approval" in states else []),
        *(["run.stopped"] if "uncertain" in states else []),
    }
    out = []
    for tag, sid, value in moves:
        if sid is None:
            if tag in wanted:
                out.append((tag, sid, value))
            continue
        by = next(by for option_tag, by, _ in _STEP_OPTIONS if option_tag == tag)
        dest = STEP.next_state(walk.step(sid).state, tag, {} if by is None else {by: value})
        if dest not in STEP.terminal or dest in DONE:
            out.append((tag, sid, value))
    return out


def legal_histories(run_id: str | None = None, max_events: int = 40) -> st.SearchStrategy[list[ev.Event]]:
    """Just the events of ``legal_walks()``."""
    return legal_walks(run_id, max_events).map(lambda walk: walk.events)
