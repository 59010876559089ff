"""A closed run is never reopened, and the store gives back the timeline of what happened."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from effectlog.errors import IdempotencyConflict, PlanMismatch, RunClosed, UnknownRun
from effectlog.session import Agent, FinalStep, Session, SqliteCheckpointer
from effectlog.testing import sample_run
from session_kit import TASK, count, drive, lines, scripted

RUN = "run-1"


def complete_run(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        steps = asyncio.run(drive(Session(RUN, scripted(tmp_path / "calls.log"), store)))
    assert FinalStep(run_id=RUN, result="sent 5 to bob") == steps[-1]


def test_a_closed_run_returns_its_recorded_outcome_with_zero_calls(tmp_path: Path) -> None:
    """Resuming a completed run yields its FinalStep alone: no model call, no tool call, no event written."""
    complete_run(tmp_path)
    gateway = scripted(tmp_path / "calls-after.log")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        before = store.state(RUN).seq
        steps = asyncio.run(drive(Session(RUN, gateway, store)))
        after = store.state(RUN).seq
    assert [FinalStep(run_id=RUN, result="sent 5 to bob", replayed=True)] == steps
    assert (0, 0) == (gateway.calls, count(tmp_path / "calls-after.log", "transfer"))
    assert before == after


def test_low_level_calls_on_a_closed_run_are_refused(tmp_path: Path) -> None:
    """A completed run takes no new step; finishing again with the same result is a no-op, another is refused."""
    complete_run(tmp_path)

    async def body(s: Session) -> None:
        await s.model([{"role": "user", "content": "again"}])

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, scripted(tmp_path / "calls-after.log"), store)
        with pytest.raises(RunClosed):
            asyncio.run(body(session))
        assert "sent 5 to bob" == session.finish("sent 5 to bob")
        with pytest.raises(RunClosed):
            session.finish("something else")


def test_load_returns_the_timeline(tmp_path: Path) -> None:
    """store.load(run_id) is the recorded timeline: the steps that happened, not the conversation."""
    complete_run(tmp_path)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        timeline = store.load(RUN)
    expected = [
        "run.started",
        "step.requested", "step.effected", "step.confirmed",
        "step.requested", "step.effected", "step.confirmed",
        "step.requested", "step.effected", "step.confirmed",
        "run.completed",
    ]  # fmt: skip
    assert expected == [type(e).__struct_config__.tag for e in timeline.events]  # type: ignore[misc]
    assert [("step-0", "model"), ("step-1", "tool"), ("step-2", "model")] == [
        (s.step_id, s.kind) for s in timeline.steps
    ]
    assert ("completed", "sent 5 to bob", "session") == (timeline.state, timeline.result, timeline.run.kind)
    started: Any = timeline.events[0]
    assert started.plan is None


def test_load_of_an_unknown_run_says_so(tmp_path: Path) -> None:
    """No run, no timeline: UnknownRun rather than an empty answer."""
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(UnknownRun):
        store.load("nope")


def test_a_plan_run_id_cannot_be_used_as_a_session(tmp_path: Path) -> None:
    """One journal holds plans and sessions; a session refuses a run id that belongs to a plan."""
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        store.append(sample_run(RUN))
        with pytest.raises(PlanMismatch):
            Session(RUN, scripted(tmp_path / "calls.log"), store)


def _with_extra_tool(calls: Path) -> Any:
    gateway = scripted(calls)

    @gateway.toolbox.tool(idempotent=True)
    def refund(to: str) -> str:
        """Another tool: the model is offered a different tool set."""
        return to

    return gateway


CHANGED_INPUTS = {
    "task": lambda calls: (Agent(), "send 50000 to mallory", scripted(calls)),
    "instructions": lambda calls: (Agent(instructions="new"), TASK, scripted(calls)),
    "task and instructions": lambda calls: (Agent(instructions="new"), "something else", scripted(calls)),
    "tool set": lambda calls: (Agent(), TASK, _with_extra_tool(calls)),
    "model params": lambda calls: (Agent(params={"temperature": 0.5}), TASK, scripted(calls)),
}


@pytest.mark.parametrize("change", sorted(CHANGED_INPUTS))
def test_a_completed_session_given_another_task_raises_idempotency_conflict(tmp_path: Path, change: str) -> None:
    """Issue 12 item 6: a completed run asked again with another task, other instructions or
    another tool set used to return the old FinalStep (replayed=True). Like an open run, it
    now raises IdempotencyConflict naming the first model call; nothing is called or written."""
    complete_run(tmp_path)
    calls = tmp_path / "calls-after.log"
    agent, task, gateway = CHANGED_INPUTS[change](calls)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        before = store.state(RUN).seq
        with pytest.raises(IdempotencyConflict) as caught:
            asyncio.run(drive(Session(RUN, gateway, store), task=task, agent=agent))
        after = store.state(RUN).seq
    assert (RUN, "step-0") == (caught.value.run_id, caught.value.step_id)
    assert (before, 0, []) == (after, gateway.calls, lines(calls))


def test_a_completed_session_given_the_same_inputs_returns_the_recorded_answer(tmp_path: Path) -> None:
    """The other half: the same task, instructions and tools (a fresh agent and gateway
    object) return the recorded FinalStep, replayed, with no call."""
    complete_run(tmp_path)
    gateway = scripted(tmp_path / "calls-after.log")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        steps = asyncio.run(drive(Session(RUN, gateway, store), task=TASK, agent=Agent()))
    assert ([FinalStep(run_id=RUN, result="sent 5 to bob", replayed=True)], 0) == (steps, gateway.calls)


def test_a_session_closed_by_a_deny_and_cut_back_is_refused(tmp_path: Path) -> None:
    """A person's deny closes (and seals) a held session run. Cut back to before the deny, the
    run would look held again and a pass could ask for approval anew; the store raises
    Truncated instead and nothing runs."""

    from effectlog.errors import Truncated
    from effectlog.session import Decision, ToolCall

    def hold(c: ToolCall) -> Decision:
        return "require_approval"

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        asyncio.run(drive(Session(RUN, scripted(tmp_path / "calls.log"), store, policy=hold)))
        store.deny(RUN, "step-1", by="ann")
        last = store.state(RUN).seq
    db = journal_tamper.connect(tmp_path / "runs.db", isolation_level=None)
    db.execute("DROP TRIGGER events_append_only_delete")
    db.execute(f"DELETE FROM ev WHERE run_id = '{RUN}' AND seq >= {last - 1}")
    db.close()
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(Truncated):
        Session(RUN, scripted(tmp_path / "calls.log"), store)
    assert 0 == count(tmp_path / "calls.log", "transfer")
