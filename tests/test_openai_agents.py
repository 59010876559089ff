"""The OpenAI Agents SDK integration in one process: what a DurableRunner pass journals and answers.

A real SDK ``Agent`` with ``OpenAIChatCompletionsModel`` (or a model named by string through
``RunConfig.model_provider``) against the local OpenAI-compatible stand-in, a real SQLite
journal. Crash cases with real SIGKILLs are in test_openai_agents_crash.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import ModelTracing
from openai import AsyncOpenAI

from effectlog.errors import BadInput, RunFailed, UncertainEffect
from effectlog.integrations.openai_agents import DurableModel, DurableRunner, idempotency_key
from effectlog.session import SqliteCheckpointer
from provider_standin import ProviderStandIn, Reply

set_tracing_disabled(True)
RUN = "order-7"


@pytest.fixture
def effects() -> list[tuple[str, str]]:
    return []


def make_agent(url: str, effects: list[tuple[str, str]], **charge_kwargs: Any) -> Agent[None]:
    @function_tool(**charge_kwargs)
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        effects.append(("charge", idempotency_key()))
        if to == "boom":
            raise ConnectionError("the bank hung up mid-request")
        return f"charged {amount} to {to}"

    @function_tool
    def lookup(to: str) -> str:
        """Look a customer up (idempotent)."""
        effects.append(("lookup", idempotency_key()))
        return f"found {to}"

    client = AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
    return Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge, lookup])


@pytest.fixture
def stand_in(request: pytest.FixtureRequest) -> Iterator[ProviderStandIn]:
    script: list[Reply] = getattr(request, "param", [("charge", {"to": "bob", "amount": 5}), "done"])
    provider = ProviderStandIn(script).start()
    yield provider
    provider.stop()


def steps(journal: Path) -> list[tuple[str, str]]:
    store = SqliteCheckpointer(journal)
    try:
        return [(s.step_id, s.state) for s in store.state(RUN).ordered_steps()]
    finally:
        store.close()


def test_a_run_journals_each_response_and_call_and_a_second_pass_replays_it(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """Each model response and tool call is a step; the provider gets the step's Idempotency-Key; a second
    pass of the completed run returns the same output with no request and no tool call."""
    runner = DurableRunner(journal=tmp_path / "runs.db")
    agent = make_agent(stand_in.url, effects)
    assert "done" == runner.run_sync(agent, "charge bob 5", run_id=RUN).final_output
    assert [("model-0", "confirmed"), ("tool-1-call_0", "confirmed"), ("model-1", "confirmed")] == steps(
        tmp_path / "runs.db"
    )
    assert [f"{RUN}/model-0/", f"{RUN}/model-1/"] == [str(k)[: len(RUN) + 9] for k in stand_in.keys_seen]
    assert "done" == runner.run_sync(agent, "charge bob 5", run_id=RUN).final_output
    assert (2, 1) == (stand_in.requests, len(effects))


@pytest.mark.parametrize(
    "stand_in", [[[("lookup", {"to": "bob"}), ("charge", {"to": "bob", "amount": 5})], "done"]], indirect=True
)
def test_parallel_tool_calls_of_one_response_are_each_a_step_run_once(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A response with two tool calls: each is its own step (keyed by its call id), run one after the other
    in the order of the response, each once; replaying the completed run runs neither again."""
    runner = DurableRunner(journal=tmp_path / "runs.db", idempotent={"lookup"})
    agent = make_agent(stand_in.url, effects)
    assert "done" == runner.run_sync(agent, "look up and charge bob", run_id=RUN).final_output
    assert [
        ("model-0", "confirmed"),
        ("tool-1-call_0_0", "confirmed"),
        ("tool-1-call_0_1", "confirmed"),
        ("model-1", "confirmed"),
    ] == steps(tmp_path / "runs.db")
    assert ["lookup", "charge"] == [name for name, _ in effects]
    assert "done" == runner.run_sync(agent, "look up and charge bob", run_id=RUN).final_output
    assert 2 == len(effects)


@pytest.mark.parametrize("stand_in", [[("charge", {"to": "boom", "amount": 5}), "done"]], indirect=True)
def test_an_unknown_outcome_surfaces_as_uncertain_effect_not_the_sdks_user_error(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A non-idempotent tool that raises (with the SDK's error-to-model conversion turned off) has an
    unknown outcome: the caller gets effectlog's UncertainEffect itself, with the reconcile command, and a
    second pass stops the same way without calling the tool."""
    runner = DurableRunner(journal=tmp_path / "runs.db")
    agent = make_agent(stand_in.url, effects, failure_error_function=None)
    for _ in range(2):
        with pytest.raises(UncertainEffect) as caught:
            runner.run_sync(agent, "charge boom 5", run_id=RUN)
        assert type(caught.value) is UncertainEffect
        assert "effectlog reconcile --journal" in str(caught.value)
    assert 1 == len(effects)


def test_an_approval_given_through_the_sdks_run_state_runs_the_call_once(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """The SDK's own flow: the held call is an interruption; ``state.approve(item)`` and passing the state
    back to ``run`` writes the approval to the journal and runs the call once."""
    runner = DurableRunner(journal=tmp_path / "runs.db", needs_approval={"charge"})
    agent = make_agent(stand_in.url, effects)
    held = runner.run_sync(agent, "charge bob 5", run_id=RUN)
    assert ["charge"] == [i.tool_name for i in held.interruptions]
    assert ["tool-1-call_0"] == [h.step_id for h in runner.last_held]
    assert [] == effects
    state = held.to_state()
    state.approve(held.interruptions[0])
    assert "done" == runner.run_sync(agent, state, run_id=RUN).final_output
    assert "done" == runner.run_sync(agent, "charge bob 5", run_id=RUN).final_output
    assert ["charge"] == [name for name, _ in effects]


def test_a_rejection_through_the_run_state_fails_the_run_and_charges_nothing(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """``state.reject(item)``: a person's final no, written to the journal as from the CLI: the run fails
    (RunFailed naming the step), the call never runs."""
    runner = DurableRunner(journal=tmp_path / "runs.db", needs_approval={"charge"})
    agent = make_agent(stand_in.url, effects)
    held = runner.run_sync(agent, "charge bob 5", run_id=RUN)
    state = held.to_state()
    state.reject(held.interruptions[0])
    with pytest.raises(RunFailed, match="step denied by application"):
        runner.run_sync(agent, state, run_id=RUN)
    assert [] == effects
    assert ("tool-1-call_0", "denied") == steps(tmp_path / "runs.db")[1]


def test_the_sdks_own_needs_approval_is_held_in_the_journal_too(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A tool declared ``function_tool(needs_approval=True)`` is held by effectlog as if declared here."""
    runner = DurableRunner(journal=tmp_path / "runs.db")
    agent = make_agent(stand_in.url, effects, needs_approval=True)
    held = runner.run_sync(agent, "charge bob 5", run_id=RUN)
    assert 1 == len(held.interruptions)
    assert ("tool-1-call_0", "awaiting_approval") == steps(tmp_path / "runs.db")[1]
    assert [] == effects


def test_a_model_named_by_string_goes_through_the_wrapped_provider(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """``Agent(model="name")`` resolved by ``RunConfig.model_provider``: journaled and keyed the same way."""
    agent = make_agent(stand_in.url, effects).clone(model="stand-in")
    provider = OpenAIProvider(base_url=stand_in.url, api_key="test", use_responses=False)
    runner = DurableRunner(journal=tmp_path / "runs.db")
    result = runner.run_sync(agent, "charge bob 5", run_id=RUN, run_config=RunConfig(model_provider=provider))
    assert "done" == result.final_output
    assert ["model-0", "tool-1-call_0", "model-1"] == [sid for sid, _ in steps(tmp_path / "runs.db")]
    assert all(str(k).startswith(f"{RUN}/model-") for k in stand_in.keys_seen)


def test_a_declared_tool_the_agent_does_not_have_is_refused_before_anything_runs(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A typo in needs_approval would leave the real tool unheld: BadInput naming it, no request made."""
    runner = DurableRunner(journal=tmp_path / "runs.db", needs_approval={"chrage"})
    with pytest.raises(BadInput, match="'chrage'"):
        runner.run_sync(make_agent(stand_in.url, effects), "charge bob 5", run_id=RUN)
    assert 0 == stand_in.requests


def test_a_denying_policy_tells_the_model_and_runs_nothing(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """effectlog's policy hook applies to SDK tools: a denied call is recorded and never runs."""
    runner = DurableRunner(journal=tmp_path / "runs.db", policy=lambda call: "deny")
    assert "done" == runner.run_sync(make_agent(stand_in.url, effects), "charge bob 5", run_id=RUN).final_output
    assert [] == effects
    assert ("tool-1-call_0", "denied") == steps(tmp_path / "runs.db")[1]


def test_streaming_is_refused_with_a_clear_error(tmp_path: Path, stand_in: ProviderStandIn) -> None:
    """A half-streamed response cannot be one recorded step: a DurableModel asked to stream says so."""
    runner = DurableRunner(journal=tmp_path / "runs.db")
    agent = make_agent(stand_in.url, [])
    seen: list[DurableModel] = []

    async def stream() -> None:
        from effectlog.integrations.framework_steps import PendingGateway
        from effectlog.integrations.openai_agents import _durable_agent, _Pass
        from effectlog.session import Session

        store = SqliteCheckpointer(tmp_path / "runs.db")
        durable = _Pass(Session(RUN, PendingGateway("m", frozenset()), store), needs_approval=frozenset())
        model = _durable_agent(agent, durable, {}).model
        assert isinstance(model, DurableModel)
        seen.append(model)
        events = model.stream_response(
            None, "hi", ModelSettings(), [], None, [], ModelTracing.DISABLED,
            previous_response_id=None, conversation_id=None, prompt=None,
        )  # fmt: skip
        with pytest.raises(BadInput, match="does not stream"):
            await anext(events)
        store.close()

    asyncio.run(stream())
    assert 1 == len(seen)
    assert 0 == stand_in.requests
    del runner


def test_a_conversation_kept_by_the_provider_is_refused(tmp_path: Path, stand_in: ProviderStandIn) -> None:
    """previous_response_id / conversation_id / the SDK's session keep history outside the journal."""
    runner = DurableRunner(journal=tmp_path / "runs.db")
    with pytest.raises(BadInput, match="previous_response_id"):
        runner.run_sync(make_agent(stand_in.url, []), "hi", run_id=RUN, previous_response_id="resp_1")
    assert 0 == stand_in.requests


@pytest.mark.parametrize(
    "stand_in", [[[("lookup", {"to": "bob"}), ("charge", {"to": "bob", "amount": 5})], "done"]], indirect=True
)
def test_a_held_call_beside_a_free_one_in_one_response_holds_only_itself(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """Parallel calls, one needing approval: the free one runs and is recorded, the held one is the SDK's
    interruption and waits in the journal; once approved, the next pass runs only the held one."""
    runner = DurableRunner(journal=tmp_path / "runs.db", idempotent={"lookup"}, needs_approval={"charge"})
    agent = make_agent(stand_in.url, effects)
    held = runner.run_sync(agent, "look up and charge bob", run_id=RUN)
    assert ["charge"] == [i.tool_name for i in held.interruptions]
    assert ["lookup"] == [name for name, _ in effects]
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        store.approve(RUN, "tool-1-call_0_1", by="ann", reason="ok")
    finally:
        store.close()
    assert "done" == runner.run_sync(agent, "look up and charge bob", run_id=RUN).final_output
    assert ["lookup", "charge"] == [name for name, _ in effects]


def test_runner_managed_model_retries_are_refused(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """``ModelSettings.retry`` would re-ask a failed request as the next step under another key: refused
    before any request is made."""
    from agents.retry import ModelRetrySettings

    agent = make_agent(stand_in.url, effects).clone(model_settings=ModelSettings(retry=ModelRetrySettings()))
    with pytest.raises(BadInput, match=r"ModelSettings\.retry"):
        DurableRunner(journal=tmp_path / "runs.db").run_sync(agent, "charge bob 5", run_id=RUN)
    assert 0 == stand_in.requests


@pytest.mark.parametrize(
    "stand_in", [[("transfer_to_billing", {}), ("charge", {"to": "bob", "amount": 5}), "done"]], indirect=True
)
def test_a_handoff_agents_tools_and_model_are_journaled_too(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A triage agent hands off to the billing agent (given as an Agent): the handoff's response, the
    billing agent's tool call and its answer are steps of the same run; a second pass calls nothing."""
    billing = make_agent(stand_in.url, effects)
    triage = Agent(name="triage", instructions="Route.", model=billing.model, handoffs=[billing])
    runner = DurableRunner(journal=tmp_path / "runs.db")
    assert "done" == runner.run_sync(triage, "charge bob 5", run_id=RUN).final_output
    assert ["model-0", "model-1", "tool-2-call_1", "model-2"] == [sid for sid, _ in steps(tmp_path / "runs.db")]
    assert "done" == runner.run_sync(triage, "charge bob 5", run_id=RUN).final_output
    assert (3, 1) == (stand_in.requests, len(effects))


@pytest.mark.parametrize(
    "stand_in", [[("transfer_to_billing", {}), ("charge", {"to": "bob", "amount": 5}), "done"]], indirect=True
)
def test_a_handoff_objects_target_agents_tools_and_model_are_journaled_too(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """The same handoff given as the SDK's ``handoff(billing)`` object (to set its description, an input
    filter or a callback) instead of the Agent. Before, only Agent handoffs were made durable: the target
    agent ran as given, its charge unjournaled, so a pass after a crash charged again. Proves: the billing
    agent's model answer and its tool call are steps of the run, and a second pass calls nothing."""
    from agents import handoff

    billing = make_agent(stand_in.url, effects)
    triage = Agent(name="triage", instructions="Route.", model=billing.model, handoffs=[handoff(billing)])
    runner = DurableRunner(journal=tmp_path / "runs.db")
    assert "done" == runner.run_sync(triage, "charge bob 5", run_id=RUN).final_output
    assert ["model-0", "model-1", "tool-2-call_1", "model-2"] == [sid for sid, _ in steps(tmp_path / "runs.db")]
    assert "done" == runner.run_sync(triage, "charge bob 5", run_id=RUN).final_output
    assert (3, 1) == (stand_in.requests, len(effects))


def test_a_held_run_resumed_before_any_decision_stays_held_and_charges_nothing(
    tmp_path: Path, stand_in: ProviderStandIn, effects: list[tuple[str, str]]
) -> None:
    """A pass of a run waiting for approval, with no decision yet: the same interruption, the same approve
    command, no model request after the recorded one, no charge."""
    runner = DurableRunner(journal=tmp_path / "runs.db", needs_approval={"charge"})
    agent = make_agent(stand_in.url, effects)
    first = runner.run_sync(agent, "charge bob 5", run_id=RUN)
    commands = [h.command for h in runner.last_held]
    again = runner.run_sync(agent, "charge bob 5", run_id=RUN)
    assert len(first.interruptions) == len(again.interruptions) == 1
    assert commands == [h.command for h in runner.last_held]
    assert (1, []) == (stand_in.requests, effects)


@pytest.mark.parametrize("arguments", ['{"ratio": NaN}', '{"ratio": -Infinity}', "[0.5]", '{"ratio": 0.5'])
def test_a_tool_call_whose_arguments_have_no_journal_form_is_told_back_and_nothing_runs(
    tmp_path: Path, arguments: str
) -> None:
    """A model's tool-call arguments that are no JSON object (a list, cut off) or hold NaN/Infinity (which
    ``json.loads`` takes and the journal would record as null). Before: NaN made the SDK hold the call for
    an approval the journal never heard of (our approval hook is a function, and the SDK fails closed on
    arguments it cannot parse), and a list or broken JSON raised out of the run after the model's answer
    was recorded, so every pass stopped the same way. Proves: the model is told, the tool never runs, the
    run finishes with the model's next answer, and a second pass replays it without a request."""
    measured: list[float] = []

    @function_tool
    def measure(ratio: float) -> str:
        """Record a ratio."""
        measured.append(ratio)
        return f"recorded {ratio}"

    provider = ProviderStandIn([("measure", arguments), "done"]).start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
        agent = Agent(name="m", instructions="Measure.", model=model, tools=[measure])
        runner = DurableRunner(journal=tmp_path / "runs.db")
        outputs = [runner.run_sync(agent, "go", run_id="m1").final_output for _ in range(2)]
        requests = provider.requests
    finally:
        provider.stop()
    assert (["done", "done"], [], 2) == (outputs, measured, requests)
