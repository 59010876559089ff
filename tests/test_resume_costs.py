"""What a resume or a re-run no longer does (issue 18): each test fails if the removed work comes back."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from effectlog import plan as plan_module
from effectlog.actor import RunActor
from effectlog.journal import load_run
from effectlog.outcome import RunOutcome
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash, outcome_of


def noop_plan(run_id: str, steps: int) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="noop", args={"i": i}, secret=("i",)) for i in range(steps)),
    )


def test_a_plan_is_digested_and_pinned_once_per_plan_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Plan.digest`` and ``Plan.pinned()`` derive from one ``to_builtins`` and one canonical digest of the
    whole plan, however often they are asked; the pinned form is what JSON gives back (lists)."""
    calls: list[int] = []
    real = plan_module.msgspec.to_builtins

    def counting(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, Plan):
            calls.append(1)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(plan_module.msgspec, "to_builtins", counting)
    plan = noop_plan("p", 3)
    digests = {plan.digest for _ in range(5)}
    pinned = plan.pinned()
    assert (1, 1) == (len(calls), len(digests))
    assert pinned is plan.pinned()
    assert type(pinned["steps"]) is list
    assert plan_module.msgspec.json.decode(plan_module.canonical_json(pinned)) == pinned
    assert frozenset({"s0", "s1", "s2"}) == plan.step_ids


def test_runtime_run_does_not_render_the_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Python's default SIGINT handler, ``asyncio.run`` used to ``repr`` its finished task (and so the
    whole outcome) twice while restoring the handler; ``Runtime.run`` keeps the outcome off the task."""
    rendered: list[int] = []
    monkeypatch.setattr(RunOutcome, "__repr__", lambda self: rendered.append(1) or "RunOutcome(...)")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Runtime(tmp_path / "j.db") as rt:
            outcome = rt.run(noop_plan("r", 2))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ("completed", []) == (outcome.state, rendered)


def test_rerunning_a_closed_run_builds_no_step_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed run's re-run reports its seal's rows: with building step states from a seal made to fail,
    it still returns exactly the outcome the full replay stands for."""
    plan = noop_plan("closed", 4)
    with Runtime(tmp_path / "j.db") as rt:
        rt.run(plan)
        expected = outcome_of(load_run(rt.journal, "closed"))

    def no_step_states(*args: object) -> None:
        raise AssertionError("step states were built from the seal")

    monkeypatch.setattr("effectlog.seal._seal_steps", no_step_states)
    with Runtime(tmp_path / "j.db") as rt:
        assert expected == rt.run(plan)


def test_a_resume_drives_only_the_steps_not_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished steps of a resumed run are skipped without a coroutine each: ``_drive_step`` runs only for
    the steps still to do (and the run completes with every step confirmed once)."""
    plan = noop_plan("half", 6)

    def stop(point: str, step_id: str) -> None:
        if point == "after_confirm" and step_id == "s3":
            raise SimulatedCrash(point)

    with Runtime(tmp_path / "j.db", crash_hook=stop) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    driven: list[str] = []
    real = RunActor._drive_step

    async def counting(self: RunActor, decl: StepDecl) -> Any:
        driven.append(decl.id)
        return await real(self, decl)

    monkeypatch.setattr(RunActor, "_drive_step", counting)
    with Runtime(tmp_path / "j.db") as rt:
        outcome = rt.run(plan)
    assert (["s4", "s5"], "completed") == (driven, outcome.state)
    assert [1] * 6 == [s.attempt for s in outcome.steps]


@pytest.mark.parametrize(
    "change",
    ["none", "step state", "step attempt", "step dropped", "steps swapped", "run reason", "run resumes"],
)
def test_verify_compares_a_seal_as_before_without_building_step_states(change: str) -> None:
    """``check_seal`` (what ``verify`` runs per closed run) accepts a seal exactly when its state equals the
    sealed view of the replay, as the old whole-state comparison did, field by field and step by step."""
    import immutables
    import msgspec

    from effectlog.chain import Chain
    from effectlog.errors import CorruptEvent
    from effectlog.fold import replay
    from effectlog.seal import check_seal, seal_row, sealed_view, state_from_seal
    from effectlog.testing import sample_run

    replayed = replay(sample_run("r", steps=3))
    steps = dict(replayed.steps)
    if change == "step state":
        steps["s1"] = msgspec.structs.replace(steps["s1"], state="failed")
    elif change == "step attempt":
        steps["s1"] = msgspec.structs.replace(steps["s1"], attempt=2)
    elif change == "step dropped":
        del steps["s2"]
    elif change == "steps swapped":
        steps["s0"], steps["s1"] = (
            msgspec.structs.replace(steps["s0"], index=1),
            msgspec.structs.replace(steps["s1"], index=0),
        )
    sealed = msgspec.structs.replace(replayed, steps=immutables.Map(steps))
    if change == "run reason":
        sealed = msgspec.structs.replace(sealed, reason="edited")
    elif change == "run resumes":
        sealed = msgspec.structs.replace(sealed, resumes=7)
    chain = Chain()
    run_id, seq, body = seal_row(sealed)
    stored = (run_id, seq, body, chain.link(replayed.head, body))
    old_verdict = state_from_seal(body, replayed.head) == sealed_view(replayed)
    try:
        check_seal(stored, replayed, chain)
        accepted = True
    except CorruptEvent:
        accepted = False
    assert (change == "none", old_verdict) == (accepted, accepted)
