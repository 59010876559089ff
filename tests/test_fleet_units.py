"""The fleet's pure parts: the attempt spec and what the code derives from it, the scheduler, the recovery decision."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.diagrams import render
from effectlog.errors import IllegalTransition
from effectlog.fleet import attempts as am
from effectlog.fleet.model import Candidate, Offer
from effectlog.fleet.recovery import decide_expired
from effectlog.fleet.scheduler import schedule
from effectlog.machines import attempt_machine
from effectlog.spec import load

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000_000_000

# -- the attempt spec ----------------------------------------------------------------


def test_committed_attempt_diagram_equals_the_generated_one() -> None:
    """docs/diagrams/attempt.mmd is what specs/attempt.toml renders (`effectlog diagram attempt > ...`)."""
    committed = (ROOT / "docs" / "diagrams" / "attempt.mmd").read_text(encoding="utf-8")
    assert render("attempt", "mermaid") == committed


def test_the_attempt_spec_has_the_states_and_actors_the_design_requires() -> None:
    """Ten states, four actors, and every transition names one of them."""
    spec = load("attempt")
    assert {
        "queued", "leased", "preparing", "running", "waiting_decision",
        "succeeded", "failed", "cancelled", "lost", "needs_operator",
    } == set(spec.states)  # fmt: skip
    assert ("scheduler", "lease_owner", "recovery_service", "operator") == spec.actors
    assert set() == {t.trigger for t in spec.transitions if t.actor not in spec.actors}


def test_the_sets_the_fleet_uses_are_derived_from_the_spec() -> None:
    """Live (leased) states are those recovery may expire; operators act on needs_operator; queued is initial."""
    assert {"leased", "preparing", "running", "waiting_decision"} == am.LIVE
    assert {"needs_operator"} == am.AWAITING_OPERATOR
    assert "queued" == am.QUEUED
    assert {"succeeded", "failed", "cancelled", "lost"} == am.FINAL
    assert {"queued", "needs_operator", *am.LIVE} == am.OPEN


def test_recovery_and_operators_have_exactly_the_transitions_the_design_gives_them() -> None:
    """Recovery: expired live attempt -> lost | needs_operator. Operator: needs_operator -> lost (requeue) | failed."""
    by_actor: dict[str, set[tuple[str, str, str]]] = {}
    for t in load("attempt").transitions:
        for source in t.source:
            for dest in t.destinations().values():
                by_actor.setdefault(str(t.actor), set()).add((t.trigger, source, dest))
    assert {(t, s, d) for s in am.LIVE for t, d in (("lose", "lost"), ("expire", "needs_operator"))} == by_actor[
        "recovery_service"
    ]
    assert {
        ("requeue", "needs_operator", "lost"),
        ("give_up", "needs_operator", "failed"),
        ("withdraw", "queued", "cancelled"),
    } == by_actor["operator"]
    assert {("lease", "queued", "leased")} == by_actor["scheduler"]


@pytest.mark.parametrize("state", load("attempt").states)
@pytest.mark.parametrize("trigger", sorted(am.BY_TRIGGER))
def test_the_compiled_table_and_the_transitions_machine_agree(state: str, trigger: str) -> None:
    """For every (state, trigger): move() allows it exactly when the spec-built machine does, to the same state."""
    model = attempt_machine(state)
    actor = am.BY_TRIGGER[trigger].actor
    assert actor is not None
    try:
        machine_dest: str | None = model.fire(trigger)
    except IllegalTransition:
        machine_dest = None
    try:
        table_dest: str | None = am.move(state, trigger, actor)  # type: ignore[arg-type]
    except IllegalTransition:
        table_dest = None
    assert machine_dest == table_dest


def test_a_transition_by_the_wrong_actor_is_illegal() -> None:
    """The actor is part of legality: the scheduler cannot succeed an attempt, a runner cannot requeue."""
    with pytest.raises(IllegalTransition, match="lease_owner"):
        am.move("running", "succeed", "scheduler")
    with pytest.raises(IllegalTransition, match="operator"):
        am.move("needs_operator", "requeue", "lease_owner")


# -- the scheduler -------------------------------------------------------------------

CAPS = st.frozensets(st.sampled_from(["py", "gpu", "node", "net"]), max_size=4)
CANDIDATES = st.lists(st.tuples(st.integers(1, 10_000), CAPS), max_size=30, unique_by=lambda c: c[0]).map(
    lambda cs: [Candidate(request_id=i, requires=tuple(sorted(caps))) for i, caps in cs]
)


@given(CANDIDATES, CAPS, st.integers(0, 8))
def test_the_scheduler_picks_only_fitting_requests_within_free_capacity(
    candidates: list[Candidate], caps: frozenset[str], free: int
) -> None:
    """Every pick requires only capabilities the runner declares; never more picks than free slots."""
    offer = Offer(runner_id="r", capabilities=caps, free=free)
    picks = schedule(candidates, offer)
    by_id = {c.request_id: c for c in candidates}
    assert [] == [p for p in picks if not set(by_id[p].requires) <= caps]
    assert len(picks) <= free


@given(CANDIDATES, CAPS, st.integers(0, 8))
def test_the_scheduler_is_fifo_among_fitting_requests_and_fills_what_it_can(
    candidates: list[Candidate], caps: frozenset[str], free: int
) -> None:
    """Picks are the oldest fitting requests, in order: a prefix of the fitting ones, as long as capacity allows."""
    offer = Offer(runner_id="r", capabilities=caps, free=free)
    fitting = [c.request_id for c in candidates if set(c.requires) <= caps]
    assert fitting[:free] == schedule(candidates, offer)


def test_the_scheduler_matches_capabilities_not_names() -> None:
    """Two runners with different names but the same capabilities get the same picks."""
    queued = [Candidate(request_id=1, requires=("gpu",)), Candidate(request_id=2, requires=())]
    a = schedule(queued, Offer(runner_id="laptop", capabilities=frozenset({"gpu"}), free=2))
    b = schedule(queued, Offer(runner_id="ci-17", capabilities=frozenset({"gpu"}), free=2))
    assert [1, 2] == a == b
    assert [2] == schedule(queued, Offer(runner_id="cpu-only", capabilities=frozenset(), free=2))


# -- the recovery decision -------------------------------------------------------------


def _body(event: ev.Event) -> bytes:
    return ev.encode(event)


STARTED = ev.RunStarted(run_id="r", seq=1, ts=T0, plan={"run_id": "r", "steps": [{"id": "s"}]}, plan_digest="d")
RESUMED = ev.RunResumed(run_id="r", seq=2, ts=T0, pid=1)
REQUESTED = ev.StepRequested(
    run_id="r", seq=2, ts=T0, step_id="s", adapter="a", idempotency_key="k", args_digest="x", idempotent=True
)
RESENT = ev.StepResent(run_id="r", seq=3, ts=T0, step_id="s", resend=1)


@pytest.mark.parametrize(
    ("events", "verdict"),
    [
        ([], "lose"),
        ([STARTED], "lose"),
        ([RESUMED], "lose"),
        ([STARTED, REQUESTED], "expire"),
        ([RESENT], "expire"),
    ],
    ids=["nothing", "started-only", "resumed-only", "requested", "resent"],
)
def test_an_expired_lease_is_lost_only_when_no_step_was_requested(events: list[ev.Event], verdict: str) -> None:
    """The journal since the lease began decides: any step request (or re-send) means an operator decides."""
    assert verdict == decide_expired([_body(e) for e in events]).trigger


def test_the_recovery_verdict_names_its_evidence() -> None:
    """The audit record says which steps were requested and where."""
    verdict = decide_expired([_body(STARTED), _body(REQUESTED)])
    assert {"events": 2, "requested": ["s"], "last_requested_seq": 2} == verdict.detail


def test_the_fleet_doc_shows_the_generated_attempt_diagram() -> None:
    """docs/fleet.md embeds exactly what specs/attempt.toml renders, so the page cannot drift from the spec."""
    doc = (ROOT / "docs" / "fleet.md").read_text(encoding="utf-8")
    assert f"```mermaid\n{render('attempt', 'mermaid')}```" in doc
