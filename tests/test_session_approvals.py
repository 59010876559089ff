"""Approval and denial in sessions: held calls suspend the run on disk, approvals are bound and used once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import ApprovalRequired, NotReconcilable, ReplayDivergence, RunFailed, ToolDenied
from effectlog.session import (
    Agent,
    ApprovalStep,
    FinalStep,
    ModelStep,
    Session,
    SqliteCheckpointer,
    ToolCall,
    ToolStep,
    call,
    say,
    tool_call_hash,
)
from session_kit import SCRIPT, TASK, count, drive, scripted

RUN = "run-1"
T0 = 1_700_000_000_000_000_000


def hold_transfers(c: ToolCall) -> Any:
    return "require_approval" if c.tool == "transfer" else "allow"


def agent_pass(tmp_path: Path, *, script: Any = SCRIPT, policy: Any = hold_transfers, clock: Any = None) -> list[Any]:
    gateway = scripted(tmp_path / "calls.log", script=script)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, gateway, store, policy=policy, clock=clock)
        return asyncio.run(drive(session))


def store(tmp_path: Path) -> SqliteCheckpointer:
    return SqliteCheckpointer(tmp_path / "runs.db")


def kinds(steps: list[Any]) -> list[str]:
    return [type(s).__name__ for s in steps]


def test_require_approval_yields_a_denied_tool_step_and_suspends_the_run_on_disk(tmp_path: Path) -> None:
    """Pass one: ModelStep, ToolStep(denied, decision=require_approval), ApprovalStep; the tool never ran."""
    steps = agent_pass(tmp_path)
    assert ["ModelStep", "ToolStep", "ApprovalStep"] == kinds(steps)
    held: ToolStep = steps[1]
    assert ("denied", "require_approval") == (held.status, held.decision)
    approval: ApprovalStep = steps[2]
    assert tool_call_hash("step-1", "transfer", {"to": "bob", "amount": 5}) == approval.tool_call_hash
    assert approval.command.startswith(
        f"effectlog approve --journal {tmp_path / 'runs.db'} --run-id run-1 --step step-1"
    )
    with store(tmp_path) as s:
        timeline = s.load(RUN)
    assert ("suspended", "step-1") == (timeline.state, timeline.run.blocked_step)
    assert "awaiting_approval" == timeline.run.steps["step-1"].state
    assert 0 == count(tmp_path / "calls.log", "transfer")


def test_resuming_before_anyone_decides_writes_nothing_and_calls_nothing(tmp_path: Path) -> None:
    """A held run stays held: the pass replays to the held step, yields the approval again, and stops."""
    agent_pass(tmp_path)
    with store(tmp_path) as s:
        before = s.state(RUN).seq
    steps = agent_pass(tmp_path)
    assert ["ModelStep", "ToolStep", "ApprovalStep"] == kinds(steps)
    assert [True, True] == [steps[0].replayed, steps[1].replayed]
    with store(tmp_path) as s:
        assert before == s.state(RUN).seq
    assert (1, 0) == (count(tmp_path / "calls.log", "model"), count(tmp_path / "calls.log", "transfer"))


def test_approval_with_the_cli_then_resume_runs_the_effect_exactly_once(tmp_path: Path) -> None:
    """`effectlog approve` on a session run, then a resume: the transfer happens once, the run completes."""
    agent_pass(tmp_path)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "effectlog",
            "approve",
            "--journal",
            str(tmp_path / "runs.db"),
            "--run-id",
            RUN,
            "--step",
            "step-1",
            "--by",
            "alice",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == cli.returncode, cli.stderr
    steps = agent_pass(tmp_path)
    assert ["ModelStep", "ToolStep", "ModelStep", "FinalStep"] == kinds(steps)
    assert ("ok", False) == (steps[1].status, steps[1].replayed)
    assert 1 == count(tmp_path / "calls.log", "transfer")
    again = agent_pass(tmp_path)
    assert [FinalStep(run_id=RUN, result="sent 5 to bob", replayed=True)] == again
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_low_level_tool_raises_approval_required_with_the_approve_command(tmp_path: Path) -> None:
    """Without the Agent, a held call is ApprovalRequired, carrying the tool call hash and the CLI line."""

    async def body(s: Session) -> None:
        await s.tool("transfer", {"to": "bob", "amount": 5})

    gateway = scripted(tmp_path / "calls.log")
    with store(tmp_path) as st, pytest.raises(ApprovalRequired) as raised:
        asyncio.run(body(Session(RUN, gateway, st, policy=hold_transfers)))
    assert "step-0" == raised.value.step_id
    assert tool_call_hash("step-0", "transfer", {"to": "bob", "amount": 5}) == raised.value.fields["tool_call_hash"]
    assert "effectlog approve" in raised.value.fields["command"]


def test_an_approval_is_bound_to_the_exact_call(tmp_path: Path) -> None:
    """Approved for amount 5 at step-0; a pass that asks amount 50 there is a divergence, and nothing is sent."""

    def pay(amount: int) -> Any:
        async def body(s: Session) -> Any:
            return await s.tool("transfer", {"to": "bob", "amount": amount})

        with store(tmp_path) as st:
            return asyncio.run(body(Session(RUN, scripted(tmp_path / "calls.log"), st, policy=hold_transfers)))

    with pytest.raises(ApprovalRequired):
        pay(5)
    with store(tmp_path) as s:
        approved = s.approve(RUN, "step-0", by="alice")
    assert tool_call_hash("step-0", "transfer", {"to": "bob", "amount": 5}) == approved.steps["step-0"].approved_digest
    with pytest.raises(ReplayDivergence):
        pay(50)
    assert 0 == count(tmp_path / "calls.log", "transfer")
    assert {"sent": 5, "to": "bob"} == pay(5)
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_an_approval_is_used_once(tmp_path: Path) -> None:
    """The same call asked again at a later step needs a new approval: the first one was consumed."""
    script = [call("transfer", to="bob", amount=5), call("transfer", to="bob", amount=5), say("sent twice")]
    agent_pass(tmp_path, script=script)
    with store(tmp_path) as s:
        s.approve(RUN, "step-1", by="alice")
    steps = agent_pass(tmp_path, script=script)
    assert ["ModelStep", "ToolStep", "ModelStep", "ToolStep", "ApprovalStep"] == kinds(steps)
    assert ("ok", "denied") == (steps[1].status, steps[3].status)
    assert "step-3" == steps[4].step_id
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_a_human_no_is_final(tmp_path: Path) -> None:
    """A person's deny fails the run: the resume raises RunFailed, nothing runs, and it cannot be approved later."""
    agent_pass(tmp_path)
    with store(tmp_path) as s:
        s.deny(RUN, "step-1", by="bob", reason="not today")
    with pytest.raises(RunFailed):
        agent_pass(tmp_path)
    with store(tmp_path) as s, pytest.raises(NotReconcilable):
        s.approve(RUN, "step-1", by="alice")
    with store(tmp_path) as s:
        assert ("failed", "denied") == (s.state(RUN).state, s.state(RUN).steps["step-1"].state)
    assert 0 == count(tmp_path / "calls.log", "transfer")


def test_an_expired_approval_is_asked_again(tmp_path: Path) -> None:
    """An approval that lapsed before use holds the call again; a fresh approval then runs it once."""
    agent_pass(tmp_path, clock=lambda: T0)
    with store(tmp_path) as s:
        s.approve(RUN, "step-1", by="alice", expires_at=T0 + 10, clock=lambda: T0 + 1)
    steps = agent_pass(tmp_path, clock=lambda: T0 + 11)
    assert ["ModelStep", "ToolStep", "ApprovalStep"] == kinds(steps)
    assert ("denied", "require_approval", False) == (steps[1].status, steps[1].decision, steps[1].replayed)
    assert "the approval expired before use" == steps[1].reason
    with store(tmp_path) as s:
        s.approve(RUN, "step-1", by="alice", clock=lambda: T0 + 12)
    steps = agent_pass(tmp_path, clock=lambda: T0 + 13)
    assert isinstance(steps[-1], FinalStep)
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_a_policy_denial_is_a_known_outcome_and_can_be_asked_again(tmp_path: Path) -> None:
    """Denied by policy: the model is told, the run goes on, and a later ask is decided again (never uncertain)."""
    script = [call("transfer", to="bob", amount=5), call("transfer", to="bob", amount=5), say("sent on retry")]

    def deny_first(c: ToolCall) -> Any:
        return "deny" if c.step_id == "step-1" else "allow"

    steps = agent_pass(tmp_path, script=script, policy=deny_first)
    assert ["ModelStep", "ToolStep", "ModelStep", "ToolStep", "ModelStep", "FinalStep"] == kinds(steps)
    assert [("denied", "deny"), ("ok", None)] == [(steps[i].status, steps[i].decision) for i in (1, 3)]
    told = steps[2]
    assert isinstance(told, ModelStep)
    with store(tmp_path) as s:
        timeline = s.load(RUN)
    assert ("completed", "denied") == (timeline.state, timeline.run.steps["step-1"].state)
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_low_level_policy_denial_raises_tool_denied(tmp_path: Path) -> None:
    """Without the Agent, a policy's deny is ToolDenied; replaying the pass gives the same outcome, no call."""

    async def body(s: Session) -> None:
        await s.tool("transfer", {"to": "bob", "amount": 5})

    for _ in range(2):
        with store(tmp_path) as st, pytest.raises(ToolDenied):
            asyncio.run(body(Session(RUN, scripted(tmp_path / "calls.log"), st, policy=lambda c: "deny")))
    assert 0 == count(tmp_path / "calls.log", "transfer")


def test_agent_instructions_reach_the_model(tmp_path: Path) -> None:
    """The opening messages are the instructions then the task: the context a resume derives again."""
    seen: list[Any] = []
    gateway = scripted(tmp_path / "calls.log", script=[say("done")])
    gateway.on_call = lambda body, key: seen.append(body["messages"])
    with store(tmp_path) as st:
        asyncio.run(drive(Session(RUN, gateway, st), agent=Agent(instructions="be brief")))
    assert [[{"role": "system", "content": "be brief"}, {"role": "user", "content": TASK}]] == seen
