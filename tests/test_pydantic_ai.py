"""DurableAgent in one process: parallel tool calls, streaming, and errors that reach the caller unwrapped.

A real pydantic-ai ``Agent`` with ``FunctionModel`` (no network) over a real SQLite journal.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from effectlog.errors import (
    ApprovalRequired,
    BadInput,
    IdempotencyConflict,
    ReplayDivergence,
    RunFailed,
    UncertainEffect,
)
from effectlog.integrations.pydantic_ai import DurableAgent, idempotency_key
from effectlog.session import SqliteCheckpointer


class Tally:
    def __init__(self) -> None:
        self.model = 0
        self.tools: list[str] = []


def parallel_agent(tally: Tally, *, fail: bool = False, deferrable: bool = False) -> Agent[None, Any]:
    """One response asks for three tool calls at once, the next one answers."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tally.model += 1
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("lookup", {"who": "ann"}, tool_call_id="a"),
                    ToolCallPart("charge", {"who": "bob"}, tool_call_id="b"),
                    ToolCallPart("lookup", {"who": "cy"}, tool_call_id="c"),
                ]
            )
        return ModelResponse(parts=[TextPart("all done")])

    agent: Agent[None, Any] = Agent(
        FunctionModel(model), output_type=[str, DeferredToolRequests] if deferrable else str
    )

    @agent.tool_plain
    async def lookup(who: str) -> str:
        await asyncio.sleep(0.01 if who == "ann" else 0)  # a slower first call must not reorder the journal
        tally.tools.append(f"lookup {who}")
        return f"found {who}"

    @agent.tool_plain
    def charge(who: str) -> str:
        tally.tools.append(f"charge {who}")
        if fail:
            raise ConnectionError("the bank hung up")
        return f"charged {who}"

    return agent


def test_parallel_tool_calls_run_in_response_order_once_and_replay_without_calls(tmp_path: Path) -> None:
    """Three tool calls in one response are journaled and run one after another, in the response's
    order; a second pass of the completed run returns the same output and calls nothing."""
    tally = Tally()
    durable = DurableAgent(parallel_agent(tally), journal=tmp_path / "runs.db", idempotent={"lookup"})
    first = durable.run_sync("go", run_id="r")
    again = durable.run_sync("go", run_id="r")
    assert ("all done", "all done") == (first.output, again.output)
    assert ["lookup ann", "charge bob", "lookup cy"] == tally.tools
    assert 2 == tally.model
    store = SqliteCheckpointer(tmp_path / "runs.db")
    timeline = store.load("r")
    store.close()
    assert ["model-0", "tool-1-a", "tool-1-b", "tool-1-c", "model-1"] == [s.step_id for s in timeline.steps]
    assert ("completed", "all done") == (timeline.state, timeline.result)


def test_an_unknown_outcome_of_a_non_idempotent_tool_raises_uncertain_effect_unwrapped(tmp_path: Path) -> None:
    """A tool declared not idempotent (the default) that raises: the caller gets UncertainEffect itself,
    with the reconcile command, and the run is stopped in the journal."""
    durable = DurableAgent(parallel_agent(Tally(), fail=True), journal=tmp_path / "runs.db", idempotent={"lookup"})
    with pytest.raises(UncertainEffect) as caught:
        durable.run_sync("go", run_id="r")
    assert "tool 'charge'" in str(caught.value)
    assert f"effectlog reconcile --journal {tmp_path / 'runs.db'} --run-id r --step tool-1-b" in str(caught.value)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    assert ("stopped", "tool-1-b") == (store.state("r").state, store.state("r").blocked_step)
    store.close()


def test_approval_without_room_for_deferred_requests_raises_approval_required(tmp_path: Path) -> None:
    """An agent whose output type cannot hold DeferredToolRequests: a held call raises effectlog's
    ApprovalRequired with the approve command, and nothing after it ran."""
    tally = Tally()
    durable = DurableAgent(
        parallel_agent(tally), journal=tmp_path / "runs.db", idempotent={"lookup"}, needs_approval={"charge"}
    )
    with pytest.raises(ApprovalRequired) as caught:
        durable.run_sync("go", run_id="r")
    approve = f"effectlog approve --journal {tmp_path / 'runs.db'} --run-id r --step tool-1-b --attempt 1 --by NAME"
    assert approve in str(caught.value)
    assert ["lookup ann"] == tally.tools  # the call before the held one ran; the one after waits


def test_pydantic_ais_own_requires_approval_holds_the_call_in_the_journal(tmp_path: Path) -> None:
    """A tool pydantic-ai marks requires_approval is held in the journal (not run, not uncertain); approved
    from the CLI, the next pass runs it once."""
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("wire", {"amount": 9}, tool_call_id="w")])
        return ModelResponse(parts=[TextPart("wired")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool(requires_approval=True)
    def wire(ctx: RunContext[None], amount: int) -> str:
        ran.append(f"wire {amount}")
        return "ok"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    with pytest.raises(ApprovalRequired):
        durable.run_sync("go", run_id="r")
    store = SqliteCheckpointer(tmp_path / "runs.db")
    step = store.state("r").step("tool-1-w")
    store.close()
    assert step is not None
    assert ("awaiting_approval", []) == (step.state, ran)
    approve = [sys.executable, "-m", "effectlog", "approve", "--journal", str(tmp_path / "runs.db")]
    approved = subprocess.run([*approve, "--run-id", "r", "--step", "tool-1-w", "--by", "ann"], check=False)
    assert 0 == approved.returncode
    assert "wired" == durable.run_sync("go", run_id="r").output
    assert ["wire 9"] == ran


def test_a_streamed_run_journals_the_whole_response_and_replays_it_as_events(tmp_path: Path) -> None:
    """With an event_stream_handler the model request is one journaled step; the handler still sees the
    text as part events, live and on a replay of the completed run (which calls no model)."""
    calls: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        return ModelResponse(parts=[TextPart("streamed answer")])

    agent: Agent[None, str] = Agent(FunctionModel(model))
    seen: list[str] = []

    async def handler(ctx: RunContext[None], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in stream:
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                seen.append(event.part.content)
            elif isinstance(event, PartDeltaEvent):
                seen.append(str(getattr(event.delta, "content_delta", "")))

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    kwargs: dict[str, Any] = {"event_stream_handler": handler}
    first = durable.run_sync("go", run_id="s", **kwargs)
    streamed_live = "".join(seen)
    seen.clear()
    again = durable.run_sync("go", run_id="s", **kwargs)
    assert ("streamed answer", "streamed answer") == (first.output, again.output)
    assert ("streamed answer", "streamed answer") == (streamed_live, "".join(seen))
    assert 1 == len(calls)


def held_run(tmp_path: Path, tally: Tally) -> DurableAgent[None, Any]:
    durable = DurableAgent(
        parallel_agent(tally, deferrable=True),
        journal=tmp_path / "runs.db",
        idempotent={"lookup"},
        needs_approval={"charge"},
    )
    held = durable.run_sync("go", run_id="r").output
    assert isinstance(held, DeferredToolRequests)
    assert (["b"], ["c"]) == ([c.tool_call_id for c in held.approvals], [c.tool_call_id for c in held.calls])
    return durable


def test_an_approval_given_through_deferred_tool_results_is_journaled_and_the_call_runs_once(tmp_path: Path) -> None:
    """pydantic-ai's own answer (DeferredToolResults.approvals) is written to the journal as an approval
    by ``answered_by``; the run resumes from its prompt, charges once, and runs the deferred lookup."""
    tally = Tally()
    durable = held_run(tmp_path, tally)
    assert ["lookup ann"] == tally.tools
    answers = DeferredToolResults(approvals={"b": True}, answered_by={"b": "ann"})
    assert "all done" == durable.run_sync("go", run_id="r", deferred_tool_results=answers).output
    assert "all done" == durable.run_sync("go", run_id="r", deferred_tool_results=answers).output
    assert ["lookup ann", "charge bob", "lookup cy"] == tally.tools
    store = SqliteCheckpointer(tmp_path / "runs.db")
    approvals = [e for e in store.load("r").events if type(e).__name__ == "StepApproved"]
    store.close()
    assert [("tool-1-b", "ann")] == [(e.step_id, e.by) for e in approvals]


@pytest.mark.parametrize("answer", [False, ToolDenied("not today")])
def test_a_denial_through_deferred_tool_results_is_final(tmp_path: Path, answer: bool | ToolDenied) -> None:
    """A "no" from the app is a person's no in the journal: the run fails, the call never runs."""
    tally = Tally()
    durable = held_run(tmp_path, tally)
    with pytest.raises(RunFailed):
        durable.run_sync("go", run_id="r", deferred_tool_results=DeferredToolResults(approvals={"b": answer}))
    assert ["lookup ann"] == tally.tools


@pytest.mark.parametrize(
    "answers",
    [
        DeferredToolResults(approvals={"b": ToolApproved(override_args={"who": "eve"})}),
        DeferredToolResults(approvals={"zz": True}),
    ],
)
def test_an_approval_of_other_args_or_of_no_held_call_is_refused(tmp_path: Path, answers: DeferredToolResults) -> None:
    """An approval is bound to the exact held args: other args, or an unknown call id, is BadInput;
    nothing is written and nothing runs."""
    tally = Tally()
    durable = held_run(tmp_path, tally)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    before = store.state("r").seq
    with pytest.raises(BadInput):
        durable.run_sync("go", run_id="r", deferred_tool_results=answers)
    assert before == store.state("r").seq
    store.close()
    assert ["lookup ann"] == tally.tools


def test_resuming_with_another_model_is_replay_divergence_and_nothing_runs(tmp_path: Path) -> None:
    """The journal recorded model-0 from one model; a pass whose agent uses another model is refused
    with ReplayDivergence naming the step, before any call, with nothing written."""
    tally = Tally()
    held_run(tmp_path, tally)

    def other(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tally.model += 1
        return ModelResponse(parts=[TextPart("something else")])

    store = SqliteCheckpointer(tmp_path / "runs.db")
    before = store.state("r").seq
    with pytest.raises(ReplayDivergence) as caught:
        DurableAgent(Agent(FunctionModel(other)), journal=store).run_sync("go", run_id="r")
    assert ("model-0", before, 1) == (caught.value.step_id, store.state("r").seq, tally.model)
    store.close()


def test_a_completed_run_asked_with_another_prompt_is_refused_not_replayed(tmp_path: Path) -> None:
    """A completed run answers only the request it recorded: another prompt is IdempotencyConflict on
    model-0, and nothing is called or written."""
    tally = Tally()
    durable = DurableAgent(parallel_agent(tally), journal=tmp_path / "runs.db", idempotent={"lookup"})
    durable.run_sync("go", run_id="r")
    store = SqliteCheckpointer(tmp_path / "runs.db")
    before = (store.state("r").seq, tally.model, len(tally.tools))
    with pytest.raises(IdempotencyConflict) as caught:
        durable.run_sync("go somewhere else", run_id="r")
    assert ("model-0", before) == (caught.value.step_id, (store.state("r").seq, tally.model, len(tally.tools)))
    store.close()


def test_toolsets_given_to_run_are_journaled_too(tmp_path: Path) -> None:
    """A toolset passed to run(toolsets=...) is wrapped like the agent's own: its call is a tool step."""
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("ping", {}, tool_call_id="p")])
        return ModelResponse(parts=[TextPart("pong")])

    def ping() -> str:
        ran.append("ping")
        return "pong"

    durable = DurableAgent(Agent(FunctionModel(model)), journal=tmp_path / "runs.db")
    extra = FunctionToolset([ping])
    assert "pong" == durable.run_sync("go", run_id="r", toolsets=[extra]).output
    assert "pong" == durable.run_sync("go", run_id="r", toolsets=[extra]).output
    store = SqliteCheckpointer(tmp_path / "runs.db")
    assert ["model-0", "tool-1-p", "model-1"] == [s.step_id for s in store.load("r").steps]
    store.close()
    assert ["ping"] == ran


def test_a_declared_tool_the_agent_does_not_have_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """needs_approval={"chrage"} (a typo) would leave "charge" unheld: BadInput names it, and no model
    request, tool call or journal write happens."""
    tally = Tally()
    durable = DurableAgent(parallel_agent(tally), journal=tmp_path / "runs.db", needs_approval={"chrage"})
    with pytest.raises(BadInput) as caught:
        durable.run_sync("go", run_id="r")
    assert "'chrage'" in str(caught.value)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    assert (0, 0, []) == (store.state("r").seq, tally.model, tally.tools)
    store.close()


def test_a_tool_asking_the_model_to_retry_is_a_failed_step_not_an_uncertain_one(tmp_path: Path) -> None:
    """ModelRetry from a non-idempotent tool means nothing was applied: the step is recorded failed, the
    model gets pydantic-ai's retry prompt and calls again; a replay gives the same conversation, no call."""
    attempts: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < 2:
            return ModelResponse(
                parts=[ToolCallPart("pay", {"amount": -5 if turn == 0 else 5}, tool_call_id=f"p{turn}")]
            )
        return ModelResponse(parts=[TextPart("paid")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def pay(amount: int) -> str:
        attempts.append(amount)
        if amount < 0:
            raise ModelRetry("the amount must be positive")
        return "ok"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    assert ("paid", "paid") == (durable.run_sync("pay", run_id="r").output, durable.run_sync("pay", run_id="r").output)
    assert [-5, 5] == attempts
    store = SqliteCheckpointer(tmp_path / "runs.db")
    steps = {s.step_id: s.state for s in store.load("r").steps}
    store.close()
    assert {"model-0": "confirmed", "tool-1-p0": "failed", "model-1": "confirmed", "tool-2-p1": "confirmed"} == {
        k: v for k, v in steps.items() if k != "model-2"
    }


def test_reconciled_not_applied_the_next_pass_runs_the_call_again_under_a_new_attempt(tmp_path: Path) -> None:
    """An uncertain call a person reconciles as not applied is run again by the next pass, once, with the
    key of attempt 2; the model sees only the real result."""
    keys: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("charge", {"who": "bob"}, tool_call_id="c")])
        return ModelResponse(parts=[TextPart("charged")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def charge(who: str) -> str:
        keys.append(idempotency_key())
        if len(keys) == 1:
            raise TimeoutError("the bank did not answer")
        return f"charged {who}"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    with pytest.raises(UncertainEffect):
        durable.run_sync("go", run_id="r")
    store = SqliteCheckpointer(tmp_path / "runs.db")
    store.reconcile("r", "tool-1-c", outcome="not_applied", evidence="no charge at the bank", operator="ann")
    store.close()
    assert "charged" == durable.run_sync("go", run_id="r").output
    assert "charged" == durable.run_sync("go", run_id="r").output
    assert 2 == len(keys)
    assert keys[0] != keys[1]  # a new attempt, a new key: the first was never applied


def test_continuing_with_this_runs_own_messages_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """pydantic-ai's continuation (message_history=result.all_messages()) would skip recorded steps: it is
    BadInput naming them, nothing written, nothing run; the same answer given as a resume completes."""
    tally = Tally()
    durable = DurableAgent(
        parallel_agent(tally, deferrable=True),
        journal=tmp_path / "runs.db",
        idempotent={"lookup"},
        needs_approval={"charge"},
    )
    held = durable.run_sync("go", run_id="r")
    approve = DeferredToolResults(approvals={"b": True})
    store = SqliteCheckpointer(tmp_path / "runs.db")
    before = store.state("r").seq
    with pytest.raises(BadInput) as caught:
        durable.run_sync(run_id="r", message_history=held.all_messages(), deferred_tool_results=approve)
    assert "model-0" in str(caught.value)
    assert (before, ["lookup ann"]) == (store.state("r").seq, tally.tools)
    store.close()
    assert "all done" == durable.run_sync("go", run_id="r", deferred_tool_results=approve).output


def test_a_run_started_from_an_earlier_conversation_numbers_its_steps_after_it(tmp_path: Path) -> None:
    """A history from elsewhere (an earlier chat) is part of every pass's request: the run's first model
    step is model-N after its N responses, and the run resumes and completes with that same history."""
    earlier = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hello ann")])))
    history = earlier.run_sync("hi").all_messages()
    tally = Tally()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tally.model += 1
        if sum(isinstance(m, ModelResponse) for m in messages) == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"who": "ann"}, tool_call_id="l")])
        return ModelResponse(parts=[TextPart("ann is known")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def lookup(who: str) -> str:
        tally.tools.append(who)
        return "known"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db", idempotent={"lookup"})
    first = durable.run_sync("who is ann?", run_id="r", message_history=history)
    again = durable.run_sync("who is ann?", run_id="r", message_history=history)
    assert ("ann is known", "ann is known", 2, ["ann"]) == (first.output, again.output, tally.model, tally.tools)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    assert ["model-1", "tool-2-l", "model-2"] == [s.step_id for s in store.load("r").steps]
    store.close()
