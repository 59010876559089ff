"""The runtime through its Python API: pinning, approvals, closed runs, retries, timeouts,
policy, reconciliation and many concurrent runs.

Custom adapters are plain classes registered with ``Runtime(adapters={type: factory})``;
they count their calls so a test can say exactly how often the tool was invoked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog import events as ev
from effectlog.adapters import ControlEffects, EffectStore, Receipt, Request, idempotency_key
from effectlog.canonical import digest
from effectlog.errors import (
    ExitStatus,
    IllegalTransition,
    NotApplied,
    NotReconcilable,
    PlanMismatch,
    UnknownStep,
)
from effectlog.fold import RunState
from effectlog.plan import Plan, load_plan, parse_plan
from effectlog.recorder import record_now
from effectlog.runtime import PolicyRequest, Runtime, SimulatedCrash

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# -- helpers -------------------------------------------------------------------------


def make_plan(
    run_id: str,
    *,
    adapter_type: str = "custom",
    idempotent: bool = False,
    version: str = "1",
    steps: list[dict[str, Any]] | None = None,
) -> Plan:
    raw = {
        "run_id": run_id,
        "adapters": {"tool": {"type": adapter_type, "version": version, "idempotent": idempotent}},
        "steps": steps if steps is not None else [{"id": "s1", "adapter": "tool", "args": {"n": 1}}],
    }
    return parse_plan(msgspec.json.encode(raw))


class Counting:
    """A tool that records every request and answers with ``behaviour(call_number, request)``."""

    def __init__(self, behaviour: Callable[[int, Request], Any] | None = None) -> None:
        self.requests: list[Request] = []
        self.behaviour = behaviour or (lambda n, request: Receipt(data={"call": n}))

    def invoke(self, request: Request) -> Any:
        self.requests.append(request)
        return self.behaviour(len(self.requests), request)

    def factory(self, decl: Any, context: Any) -> Counting:
        return self


def raising(exc: BaseException) -> Callable[[int, Request], Any]:
    def behaviour(n: int, request: Request) -> Any:
        raise exc

    return behaviour


class Sleeps:
    """An injected ``sleep`` that records the backoff delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


class Clock:
    """An injected clock (nanoseconds) that a test moves by hand."""

    def __init__(self, now: int = 1_700_000_000 * 10**9) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def journal_files(journal: Path) -> dict[str, bytes | None]:
    """The bytes of the journal file and its write-ahead log (None when absent)."""
    out: dict[str, bytes | None] = {}
    for suffix in ("", "-wal"):
        path = Path(f"{journal}{suffix}")
        out[suffix or "db"] = path.read_bytes() if path.exists() else None
    return out


def tags(rt: Runtime, run_id: str) -> list[str]:
    return [ev.tag_of(ev.decode(r.body)) for r in rt.journal.read(run_id)]


def events_of(rt: Runtime, run_id: str) -> list[ev.Event]:
    return [ev.decode(r.body) for r in rt.journal.read(run_id)]


def effects_of(effects: Path, run_id: str) -> int:
    store = EffectStore(effects)
    try:
        return store.count(run_id=run_id)
    finally:
        store.close()


def head(rt: Runtime, run_id: str) -> tuple[int, bytes]:
    state = rt.load(run_id)
    return state.seq, state.head


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    return tmp_path / "effects.db"


# -- pinning: plan and adapter identity ----------------------------------------------------


def _changed_args(run_id: str) -> tuple[Plan, dict[str, Any]]:
    steps = [{"id": "s1", "adapter": "tool", "args": {"n": 2}}]
    return make_plan(run_id, adapter_type="effects.idempotent", idempotent=True, steps=steps), {}


MISMATCHES: dict[str, Callable[[str], tuple[Plan, dict[str, Any]]]] = {
    "different-args": _changed_args,
    "different-adapter-version": lambda run_id: (
        make_plan(run_id, adapter_type="effects.idempotent", idempotent=True, version="2"),
        {},
    ),
    "different-declared-contract": lambda run_id: (
        make_plan(run_id, adapter_type="effects.idempotent", idempotent=False),
        {},
    ),
    "different-implementation-same-type": lambda run_id: (
        make_plan(run_id, adapter_type="effects.idempotent", idempotent=True),
        {"effects.idempotent": lambda decl, ctx: ControlEffects(ctx.effect_store())},
    ),
}


@pytest.mark.parametrize("change", MISMATCHES.values(), ids=MISMATCHES.keys())
@pytest.mark.parametrize("first_outcome", ["completed", "stopped"])
def test_reusing_a_run_id_with_another_plan_or_adapter_is_rejected_and_writes_nothing(
    journal: Path, effects: Path, change: Callable[[str], tuple[Plan, dict[str, Any]]], first_outcome: str
) -> None:
    """Same run id, different plan or adapter identity (args, version, declared contract, or
    another implementation registered for the same type): PlanMismatch with exit 5, no tool
    call, and the journal's .db and -wal files are byte-identical before and after."""
    run_id = "pinned-1"
    original = make_plan(run_id, adapter_type="effects.idempotent", idempotent=True)
    with Runtime(journal, effects=effects) as rt:
        if first_outcome == "stopped":  # a run left open: resuming it is what gets refused
            rt.crash_hook = lambda point, sid: _crash(point == "after_request")
            with pytest.raises(SimulatedCrash):
                rt.run(original)
        else:
            assert "completed" == rt.run(original).state
    effects_before = effects_of(effects, run_id)
    closed_before = journal_files(journal)
    other, factories = change(run_id)

    rt = Runtime(journal, effects=effects, adapters=factories)
    try:
        open_before = journal_files(journal)
        with pytest.raises(PlanMismatch) as caught:
            rt.run(other)
        open_after = journal_files(journal)
    finally:
        rt.close()

    assert int(ExitStatus.CONFLICT) == caught.value.exit_status
    assert run_id == caught.value.run_id
    assert open_before == open_after
    assert closed_before == journal_files(journal)
    assert effects_before == effects_of(effects, run_id)


def _crash(now: bool) -> None:
    if now:
        raise SimulatedCrash("test")


def test_an_implementation_swap_names_the_adapter_and_the_fingerprint(journal: Path, effects: Path) -> None:
    """The adapter-identity refusal says which adapter differs and in what (its fingerprint)."""
    plan = make_plan("swap-1", adapter_type="effects.idempotent", idempotent=True)
    with Runtime(journal, effects=effects) as rt:
        rt.run(plan)
    swapped = {"effects.idempotent": lambda decl, ctx: ControlEffects(ctx.effect_store())}

    with Runtime(journal, effects=effects, adapters=swapped) as rt, pytest.raises(PlanMismatch) as caught:
        rt.run(plan)

    assert "adapter 'tool' differs" in caught.value.message
    assert "fingerprint" in caught.value.message


def test_the_same_plan_and_adapters_resume_without_a_mismatch(journal: Path, effects: Path) -> None:
    """The control for the mismatch tests: an identical plan and registry is accepted."""
    plan = make_plan("same-1", adapter_type="effects.idempotent", idempotent=True)
    with Runtime(journal, effects=effects) as rt:
        first = rt.run(plan)
    with Runtime(journal, effects=effects) as rt:
        again = rt.run(plan)

    assert ("completed", "completed") == (first.state, again.state)


# -- approval and denial ---------------------------------------------------------------------


def test_approval_suspends_then_approve_and_resume_apply_the_effect_exactly_once(journal: Path, effects: Path) -> None:
    """A step with approval "required" is held (suspended, exit 4, no effect); after approve,
    resume applies it exactly once; a further resume calls nothing."""
    plan = load_plan(EXAMPLES / "approval.json")
    with Runtime(journal, effects=effects) as rt:
        held = rt.run(plan)
        assert ("suspended", int(ExitStatus.SUSPENDED), "refund") == (held.state, held.exit_status, held.step_id)
        assert 0 == held.adapter_calls
        assert 0 == effects_of(effects, plan.run_id)
        assert "effectlog approve|deny" in held.message

        rt.approve(plan.run_id, "refund", by="alice", reason="customer called")
        done = rt.run(plan)
        again = rt.run(plan)

    assert ("completed", int(ExitStatus.DONE), 1) == (done.state, done.exit_status, done.adapter_calls)
    assert (0, 0) == (again.adapter_calls, again.events_written)
    assert 1 == effects_of(effects, plan.run_id)


@pytest.mark.parametrize("approve_first", [False, True], ids=["held", "approved-then-denied"])
def test_deny_fails_the_run_with_no_effect_and_is_never_uncertain(
    journal: Path, effects: Path, approve_first: bool
) -> None:
    """A person's deny (of a held step, or of one approved but not yet run) is final: the run
    fails (exit 1), no effect is applied, re-runs call nothing, and the step reads "denied",
    never "uncertain" (the run is not "stopped", exit is not 3, it cannot be reconciled)."""
    plan = load_plan(EXAMPLES / "approval.json")
    with Runtime(journal, effects=effects) as rt:
        rt.run(plan)
        if approve_first:
            rt.approve(plan.run_id, "refund", by="alice")
        state = rt.deny(plan.run_id, "refund", by="bob", reason="fraud")
        rerun = rt.run(plan)
        with pytest.raises(NotReconcilable):
            rt.reconcile(plan.run_id, "refund", outcome="applied", evidence="x", operator="y")

    assert "failed" == state.state
    assert ("failed", int(ExitStatus.RUN_FAILED), 0) == (rerun.state, rerun.exit_status, rerun.adapter_calls)
    assert [("refund", "denied", 1)] == [(s.id, s.state, s.attempt) for s in rerun.steps]
    assert "uncertain" not in rerun.message
    assert 0 == effects_of(effects, plan.run_id)


def test_an_approval_for_other_args_is_refused_by_the_fold(journal: Path, effects: Path) -> None:
    """An approval is bound to the digest of the exact args: one recorded for another digest
    cannot authorise the request (IllegalTransition from the fold); the tool is never called."""
    plan = load_plan(EXAMPLES / "approval.json")
    with Runtime(journal, effects=effects) as rt:
        rt.run(plan)
        state = rt.load(plan.run_id)
        record_now(
            rt.journal,
            state,
            [
                (
                    ev.StepApproved,
                    {"step_id": "refund", "attempt": 1, "by": "mallory", "args_digest": digest({"amount_cents": 1})},
                )
            ],
            rt.clock,
        )
        with pytest.raises(IllegalTransition) as caught:
            rt.run(plan)
        recorded = tags(rt, plan.run_id)

    assert "different arguments" in caught.value.message
    assert "refund" == caught.value.step_id
    assert "step.requested" not in recorded
    assert 0 == effects_of(effects, plan.run_id)


def test_the_real_approval_records_the_digest_of_the_held_args(journal: Path, effects: Path) -> None:
    """The approval written by ``approve`` carries the digest of exactly the args that were held."""
    plan = load_plan(EXAMPLES / "approval.json")
    with Runtime(journal, effects=effects) as rt:
        rt.run(plan)
        state = rt.approve(plan.run_id, "refund", by="alice")

    step = state.step("refund")
    assert step is not None
    assert digest(plan.step("refund").args) == step.approved_digest


def test_an_expired_approval_holds_the_step_again(journal: Path, effects: Path) -> None:
    """An approval used after it expired is not used: the step is held again (suspended, exit 4,
    no effect); a fresh approval then runs it once."""
    plan = load_plan(EXAMPLES / "approval.json")
    clock = Clock()
    with Runtime(journal, effects=effects, clock=clock) as rt:
        rt.run(plan)
        rt.approve(plan.run_id, "refund", by="alice", expires_at=clock.now + 10**9)
        clock.now += 60 * 10**9
        held = rt.run(plan)
        step = rt.load(plan.run_id).step("refund")
        assert step is not None
        assert ("suspended", int(ExitStatus.SUSPENDED), 0) == (held.state, held.exit_status, held.adapter_calls)
        assert ("awaiting_approval", "the approval expired before use") == (step.state, step.reason)
        assert 0 == effects_of(effects, plan.run_id)

        rt.approve(plan.run_id, "refund", by="alice")
        done = rt.run(plan)

    assert ("completed", 1) == (done.state, done.adapter_calls)
    assert 1 == effects_of(effects, plan.run_id)


# -- closed runs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected_state", "expected_exit"),
    [(None, "completed", ExitStatus.DONE), ("deny", "failed", ExitStatus.RUN_FAILED)],
    ids=["completed", "failed"],
)
def test_a_closed_run_rerun_calls_nothing_and_writes_nothing(
    journal: Path, policy: str | None, expected_state: str, expected_exit: int
) -> None:
    """Running a closed run again: zero adapter calls, zero new events, the chain head unchanged,
    and the recorded outcome (with its exit status) is returned."""
    tool = Counting()
    plan = make_plan("closed-1", steps=[{"id": "a", "adapter": "tool"}, {"id": "b", "adapter": "tool"}])
    decide = (lambda request: policy) if policy else None
    with Runtime(journal, adapters={"custom": tool.factory}, policy=decide) as rt:  # type: ignore[arg-type]
        first = rt.run(plan)
        calls, before = len(tool.requests), head(rt, plan.run_id)

    with Runtime(journal, adapters={"custom": tool.factory}) as rt:
        again = rt.run(plan)
        after = head(rt, plan.run_id)

    assert (expected_state, int(expected_exit)) == (first.state, first.exit_status)
    assert (expected_state, int(expected_exit)) == (again.state, again.exit_status)
    assert (0, 0) == (again.adapter_calls, again.events_written)
    assert calls == len(tool.requests)
    assert before == after


# -- retries, definite failures, uncertain outcomes ----------------------------------------------


def test_an_idempotent_tool_that_raises_is_resent_with_the_same_key_per_the_retry_policy(journal: Path) -> None:
    """A generic exception from an idempotent tool means "outcome unknown": the SAME key is sent
    again after exponential backoff (no jitter here: 0.1 then 0.2 s) until it answers."""

    def flaky(n: int, request: Request) -> Receipt:
        if n < 3:
            raise ConnectionError("reset by peer")
        return Receipt(data={"ok": n})

    tool = Counting(flaky)
    retry = {"attempts": 3, "backoff_base_s": 0.1, "backoff_cap_s": 1.0, "jitter": 0}
    plan = make_plan("retry-1", idempotent=True, steps=[{"id": "s1", "adapter": "tool", "retry": retry}])
    sleeps = Sleeps()
    with Runtime(journal, adapters={"custom": tool.factory}, sleep=sleeps) as rt:
        outcome = rt.run(plan)
        recorded = tags(rt, plan.run_id)

    assert ("completed", 3) == (outcome.state, outcome.adapter_calls)
    assert [idempotency_key("retry-1", "s1", 1)] * 3 == [r.idempotency_key for r in tool.requests]
    assert [1, 1, 1] == [r.attempt for r in tool.requests]
    assert [0.1, 0.2] == sleeps.delays
    assert 2 == recorded.count("step.resent")


def test_retries_are_capped_and_jittered_then_the_step_fails_as_unknown(journal: Path) -> None:
    """When every send fails, the delays grow to the cap with jitter applied (within
    [(1 - jitter) * d, d]), exactly ``attempts`` sends are made with one key, and the run fails."""
    tool = Counting(raising(ConnectionError("down")))
    retry = {"attempts": 4, "backoff_base_s": 0.5, "backoff_cap_s": 0.6, "jitter": 0.5}
    plan = make_plan("retry-2", idempotent=True, steps=[{"id": "s1", "adapter": "tool", "retry": retry}])
    sleeps = Sleeps()
    with Runtime(journal, adapters={"custom": tool.factory}, sleep=sleeps) as rt:
        outcome = rt.run(plan)

    assert ("failed", int(ExitStatus.RUN_FAILED), 4) == (outcome.state, outcome.exit_status, outcome.adapter_calls)
    assert {idempotency_key("retry-2", "s1", 1)} == {r.idempotency_key for r in tool.requests}
    nominal = [0.5, 0.6, 0.6]
    assert [True, True, True] == [n * 0.5 <= d <= n for n, d in zip(nominal, sleeps.delays, strict=True)]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_not_applied_is_a_definite_failure(journal: Path, idempotent: bool) -> None:
    """``NotApplied`` means the effect definitely did not happen: the step fails (applied=False)
    and the run fails with exit 1, for either contract; it is never an uncertain outcome."""
    tool = Counting(raising(NotApplied("card declined")))
    plan = make_plan("notapplied-1", idempotent=idempotent)
    with Runtime(journal, adapters={"custom": tool.factory}) as rt:
        outcome = rt.run(plan)
        failed = [e for e in events_of(rt, plan.run_id) if isinstance(e, ev.StepFailed)]

    assert ("failed", int(ExitStatus.RUN_FAILED), 1) == (outcome.state, outcome.exit_status, outcome.adapter_calls)
    assert [(False, "not applied: card declined")] == [(e.applied, e.reason) for e in failed]


def test_a_non_idempotent_tool_that_raises_stops_the_run_and_is_never_retried(journal: Path) -> None:
    """A non-idempotent tool that raises leaves the outcome unknown: step uncertain, run stopped
    (exit 3), one call only, and resuming does not call it again."""
    tool = Counting(raising(ConnectionError("reset after send")))
    plan = make_plan("nonidem-1")
    with Runtime(journal, adapters={"custom": tool.factory}) as rt:
        outcome = rt.run(plan)
        again = rt.run(plan)

    assert ("stopped", int(ExitStatus.STOPPED_UNCERTAIN)) == (outcome.state, outcome.exit_status)
    assert [("s1", "uncertain", 1)] == [(s.id, s.state, s.attempt) for s in outcome.steps]
    assert ("stopped", 0) == (again.state, again.adapter_calls)
    assert 1 == len(tool.requests)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()  # let the hung tool's thread finish


@pytest.mark.parametrize(
    ("idempotent", "expected"),
    [
        (False, ("stopped", ExitStatus.STOPPED_UNCERTAIN, "uncertain")),
        (True, ("failed", ExitStatus.RUN_FAILED, "failed")),
    ],
    ids=["not-idempotent", "idempotent"],
)
def test_a_hung_tool_times_out_as_outcome_unknown(
    journal: Path, release: threading.Event, idempotent: bool, expected: tuple[str, int, str]
) -> None:
    """``timeout_s`` ends a call that never answers as "outcome unknown": a non-idempotent step
    becomes uncertain and the run stops; an idempotent one without retries fails as unknown."""
    tool = Counting(lambda n, request: release.wait())
    plan = make_plan("hung-1", idempotent=idempotent, steps=[{"id": "s1", "adapter": "tool", "timeout_s": 0.2}])
    with Runtime(journal, adapters={"custom": tool.factory}) as rt:
        outcome = rt.run(plan)
        step = rt.load(plan.run_id).step("s1")

    assert step is not None
    assert expected == (outcome.state, outcome.exit_status, step.state)
    assert step.reason.startswith("outcome unknown: TimeoutError")


# -- policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        ("allow", ("completed", ExitStatus.DONE, "confirmed", 1)),
        ("deny", ("failed", ExitStatus.RUN_FAILED, "denied", 0)),
        ("require_approval", ("suspended", ExitStatus.SUSPENDED, "awaiting_approval", 0)),
    ],
)
def test_the_policy_hook_allows_denies_or_holds_a_step(
    journal: Path, effects: Path, verdict: str, expected: tuple[str, int, str, int]
) -> None:
    """The policy callable sees the step (run, step, adapter, args, contract) and its verdict
    decides: allow runs it, deny fails the run before execution, require_approval suspends."""
    seen: list[PolicyRequest] = []

    def policy(request: PolicyRequest) -> Any:
        seen.append(request)
        return verdict

    plan = make_plan("policy-1", adapter_type="effects.control")
    with Runtime(journal, effects=effects, policy=policy) as rt:
        outcome = rt.run(plan)

    (step,) = outcome.steps
    assert expected == (outcome.state, outcome.exit_status, step.state, effects_of(effects, plan.run_id))
    assert [PolicyRequest(run_id="policy-1", step_id="s1", adapter="tool", args={"n": 1}, idempotent=False)] == seen


def test_a_policy_allow_cannot_lift_an_approval_the_plan_requires(journal: Path, effects: Path) -> None:
    """A plan's ``approval: "required"`` holds even when the policy says allow."""
    plan = load_plan(EXAMPLES / "approval.json")
    with Runtime(journal, effects=effects, policy=lambda request: "allow") as rt:
        outcome = rt.run(plan)

    assert ("suspended", 0) == (outcome.state, effects_of(effects, plan.run_id))


# -- reconciliation ---------------------------------------------------------------------------


def _stopped_after_request(journal: Path, effects: Path, run_id: str) -> Plan:
    plan = make_plan(run_id, adapter_type="effects.control")
    hook = lambda point, sid: _crash(point == "after_request")  # noqa: E731
    with Runtime(journal, effects=effects, crash_hook=hook) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(journal, effects=effects) as rt:
        assert "stopped" == rt.run(plan).state
    return plan


def test_reconciled_not_applied_runs_attempt_two_with_a_new_key(journal: Path, effects: Path) -> None:
    """After ``not_applied`` (evidence from a person), resume runs the step as attempt 2 with a
    new idempotency key; the store ends with one effect, recorded for attempt 2."""
    plan = _stopped_after_request(journal, effects, "reconcile-1")
    with Runtime(journal, effects=effects) as rt:
        state = rt.reconcile(
            plan.run_id, "s1", outcome="not_applied", evidence="no charge in the PSP dashboard", operator="carol"
        )
        step = state.step("s1")
        assert step is not None
        assert ("pending", 2, "carol", False) == (step.state, step.attempt, step.operator, step.automated)
        outcome = rt.run(plan)

    store = EffectStore(effects)
    try:
        rows = store.rows(run_id=plan.run_id)
    finally:
        store.close()
    assert ("completed", 1) == (outcome.state, outcome.adapter_calls)
    assert [(2, idempotency_key(plan.run_id, "s1", 2))] == [(r.attempt, r.idempotency_key) for r in rows]
    assert idempotency_key(plan.run_id, "s1", 1) != rows[0].idempotency_key


def _completed(rt: Runtime, journal: Path, effects: Path) -> tuple[str, str]:
    plan = make_plan("wrong-1", adapter_type="effects.control")
    rt.run(plan)
    return plan.run_id, "s1"


def _held(rt: Runtime, journal: Path, effects: Path) -> tuple[str, str]:
    plan = load_plan(EXAMPLES / "approval.json")
    rt.run(plan)
    return plan.run_id, "refund"


def _not_started(rt: Runtime, journal: Path, effects: Path) -> tuple[str, str]:
    plan = make_plan(
        "wrong-2",
        adapter_type="effects.control",
        steps=[{"id": "s1", "adapter": "tool", "approval": "required"}, {"id": "s2", "adapter": "tool"}],
    )
    rt.run(plan)
    return plan.run_id, "s2"


WRONG_STATES = {"confirmed": _completed, "awaiting-approval": _held, "not-started": _not_started}
RECONCILERS: dict[str, Callable[[Runtime, str, str], RunState]] = {
    "by-hand": lambda rt, run_id, sid: rt.reconcile(run_id, sid, outcome="applied", evidence="looked", operator="dave"),
    "from-ledger": lambda rt, run_id, sid: rt.reconcile_from_ledger(run_id, sid),
}


@pytest.mark.parametrize("reconciler", RECONCILERS.values(), ids=RECONCILERS.keys())
@pytest.mark.parametrize("setup", WRONG_STATES.values(), ids=WRONG_STATES.keys())
def test_reconciling_a_step_that_is_not_uncertain_is_an_error_and_writes_nothing(
    journal: Path,
    effects: Path,
    setup: Callable[[Runtime, Path, Path], tuple[str, str]],
    reconciler: Callable[[Runtime, str, str], RunState],
) -> None:
    """Reconcile (by hand or from the ledger) of a confirmed, held or never-started step raises
    NotReconcilable (exit 2) and the journal's head is unchanged."""
    with Runtime(journal, effects=effects) as rt:
        run_id, sid = setup(rt, journal, effects)
        before = head(rt, run_id)
        with pytest.raises(NotReconcilable) as caught:
            reconciler(rt, run_id, sid)
        after = head(rt, run_id)

    assert int(ExitStatus.BAD_INPUT) == caught.value.exit_status
    assert (run_id, sid) == (caught.value.run_id, caught.value.step_id)
    assert before == after


def test_reconciling_a_step_not_in_the_plan_is_an_unknown_step(journal: Path, effects: Path) -> None:
    """A step id the run's plan does not have is named as unknown, and nothing is written."""
    with Runtime(journal, effects=effects) as rt:
        run_id, _ = _completed(rt, journal, effects)
        before = head(rt, run_id)
        with pytest.raises(UnknownStep):
            rt.reconcile(run_id, "nope", outcome="applied", evidence="x", operator="y")
        after = head(rt, run_id)

    assert before == after


# -- many runs in one runtime -----------------------------------------------------------------


def test_many_concurrent_runs_complete_and_share_grouped_commits(journal: Path, effects: Path) -> None:
    """``arun_many`` drives many run actors in one process: all complete, each with its own
    effects, and the shared journal writer commits fewer transactions than it received batches."""
    plans = [
        make_plan(
            f"many-{i}",
            adapter_type="effects.idempotent",
            idempotent=True,
            steps=[{"id": f"s{j}", "adapter": "tool", "args": {"i": i, "j": j}} for j in range(3)],
        )
        for i in range(12)
    ]
    with Runtime(journal, effects=effects) as rt:
        batches = 0
        # A batch reaches the writer as a lone run's inline commit (append_alone) or joins a group
        # (enqueue: the future its run awaits); each counted where it was taken.
        alone, enqueue = rt.writer.append_alone, rt.writer.enqueue

        def counting_alone(events: Any, seal: Any = None, checkpoint: Any = None) -> Any:
            nonlocal batches
            done = alone(events, seal, checkpoint)
            batches += done is not None
            return done

        def counting_enqueue(events: Any, seal: Any = None, checkpoint: Any = None) -> Any:
            nonlocal batches
            queued = enqueue(events, seal, checkpoint)
            batches += queued is not None
            return queued

        rt.writer.append_alone = counting_alone  # type: ignore[method-assign]
        rt.writer.enqueue = counting_enqueue  # type: ignore[method-assign]
        outcomes = asyncio.run(rt.arun_many(plans))
        commits = rt.writer.commits
        states = [rt.load(p.run_id).state for p in plans]

    assert ["completed"] * 12 == [o.state for o in outcomes]
    assert ["completed"] * 12 == states
    assert [3] * 12 == [effects_of(effects, p.run_id) for p in plans]
    assert 12 * (1 + 2 * 3 + 1) == batches
    assert commits < batches
