"""The per-step checks of a replay and of ``verify`` read by ``map`` in C (issue 18, item 4): whether
every step of a plan is done (``run.completed``, a checkpoint's frontier), a plan's step ids
(``run.started``, a checkpoint's frontier) and a seal's steps against the replay give the same answer
as the per-step Python they replace, over legal histories and over malformed plans and seals."""

from __future__ import annotations

from typing import Any

import immutables
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.fold import DONE_STATES, RunState, StepState, _plan_step_ids, all_done, replay
from effectlog.journal.checkpoint import _plan_ids
from effectlog.seal import _agrees, _decoded, _run_fields, _seal_steps, seal_row, sealed_view
from effectlog.testing import sample_run
from strategies import legal_histories


def done_by_hand(steps: immutables.Map[str, StepState], ids: list[str]) -> bool:
    """The reference: the per-step comprehension ``run.completed`` used before."""
    return not [s for s in ids if (step := steps.get(s)) is None or step.state not in DONE_STATES]


@given(legal_histories(), st.lists(st.sampled_from(["s0", "s1", "s2", "s3", "nope"]), max_size=6))
@settings(max_examples=150, deadline=None)
def test_all_done_equals_the_per_step_check(history: list[ev.Event], ids: list[str]) -> None:
    """Proves: ``all_done`` answers as the per-step comprehension for every state a legal history reaches,
    for its plan's steps and for any list of ids (absent ones included)."""
    state = replay(history)
    for asked in (list(state.plan_steps), ids, []):
        assert done_by_hand(state.steps, asked) == all_done(state.steps, asked)


def test_run_completed_with_an_unfinished_step_is_still_refused() -> None:
    """Proves: ``run.completed`` over a plan with a step that never ran raises ``IllegalTransition``
    naming that step (the C check says no, and the error still lists the missing ids)."""
    from effectlog.errors import IllegalTransition

    events = sample_run("r", steps=2)
    started = events[0]
    assert isinstance(started, ev.RunStarted)
    assert started.plan is not None
    plan = {**started.plan, "steps": [*started.plan["steps"], {"id": "never"}]}
    events[0] = msgspec.structs.replace(started, plan=plan)
    with pytest.raises(IllegalTransition, match=r"unfinished steps: \['never'\]"):
        replay(events)


MALFORMED: list[Any] = [
    [],
    [{"id": "a"}, {"id": "b"}],
    [{"id": "a"}, {"no": "id"}, {"id": "b"}],
    [{"id": "a"}, "b", ["id"], 3, None, {"id": "c"}],
    [{"id": 7}, {"id": "x"}],
    "abc",
    {"id": "a"},
]


def by_hand_ids(steps: Any) -> frozenset[str]:
    return frozenset(s["id"] for s in steps if isinstance(s, dict) and "id" in s)


@pytest.mark.parametrize("steps", MALFORMED)
def test_plan_step_ids_equal_the_per_entry_filter(steps: Any) -> None:
    """Proves: a plan's step ids read by ``map`` equal the per-entry filter's, malformed entries included."""
    assert by_hand_ids(steps) == _plan_step_ids(steps)


@pytest.mark.parametrize("steps", [5, [{"id": ["unhashable"]}]])
def test_plan_step_ids_raise_as_the_per_entry_filter(steps: Any) -> None:
    """Proves: a plan whose steps cannot be read raises the same error type as the per-entry filter."""
    with pytest.raises(TypeError):
        by_hand_ids(steps)
    with pytest.raises(TypeError):
        _plan_step_ids(steps)


@pytest.mark.parametrize("steps", [*MALFORMED, [{"id": "a"}, {"id": 7}]])
def test_checkpoint_plan_ids_equal_the_per_entry_filter(steps: Any) -> None:
    """Proves: the plan ids a frontier is checked against (in order) equal the per-entry filter's."""
    state = RunState(run_id="r", kind="plan", plan={"steps": steps})
    expected = [s["id"] for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)]
    assert expected == _plan_ids(state)


def closed_state(steps: int = 4) -> RunState:
    return replay(sample_run("r", steps=steps))


def mutations(state: RunState) -> list[Any]:
    """A seal's steps for ``state``, and ways to get them wrong."""
    seal = _decoded(seal_row(state)[2])
    good = list(seal.steps)
    swapped = [good[1], good[0], *good[2:]]
    return [
        good,
        good[:-1],
        [*good, msgspec.structs.replace(good[0], step_id="other")],
        swapped,
        [msgspec.structs.replace(good[0], state="requested"), *good[1:]],
        [*good[:-1], msgspec.structs.replace(good[-1], attempt=2)],
        [msgspec.structs.replace(good[0], step_id="other"), *good[1:]],
        [good[0], good[0], *good[2:]],
    ]


@pytest.mark.parametrize("case", range(8))
def test_seal_check_equals_the_reference(case: int) -> None:
    """Proves: the seal's steps compared in C (``seal._agrees``) agree with the reference,
    ``state_from_seal(seal) == sealed_view(replay)``, for a good seal and for a step dropped, added,
    moved, with another state or attempt, renamed or repeated."""
    state = closed_state()
    seal = _decoded(seal_row(state)[2])
    seal = msgspec.structs.replace(seal, steps=mutations(state)[case])
    reference = _run_fields(seal, state.head, _seal_steps(seal)) == sealed_view(state)
    assert (case == 0) == reference  # each mutation is one the reference refuses
    assert reference == _agrees(seal, state)
