"""DurableRunner on the PostgreSQL journal: the same run held, approved through the SDK's RunState, completed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from effectlog.integrations.openai_agents import DurableRunner
from effectlog.journal import open_journal
from effectlog.session import JournalCheckpointer
from provider_standin import ProviderStandIn

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres


@pytest.fixture
def stand_in() -> Iterator[ProviderStandIn]:
    provider = ProviderStandIn([("charge", {"amount": 5}), "charged"]).start()
    yield provider
    provider.stop()


def test_a_held_call_is_approved_and_run_once_on_postgres(pg_url: str, stand_in: ProviderStandIn) -> None:
    """Each pass opens its own connection from the URL: held (the SDK's interruption), approved through
    ``RunState.approve``, charged once, replayed; the journal on PostgreSQL says completed."""
    set_tracing_disabled(True)
    charged: list[int] = []

    @function_tool
    def charge(amount: int) -> str:
        """Charge."""
        charged.append(amount)
        return "ok"

    client = AsyncOpenAI(base_url=stand_in.url, api_key="test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
    agent = Agent(name="billing", model=model, tools=[charge])
    runner = DurableRunner(journal=pg_url, needs_approval={"charge"})
    held = runner.run_sync(agent, "charge 5", run_id="pg-1")
    assert 1 == len(held.interruptions)
    state = held.to_state()
    state.approve(held.interruptions[0])
    assert "charged" == runner.run_sync(agent, state, run_id="pg-1").final_output
    assert "charged" == runner.run_sync(agent, "charge 5", run_id="pg-1").final_output
    assert ([5], 2) == (charged, stand_in.billed)
    with JournalCheckpointer(open_journal(pg_url, writer=False)) as store:
        timeline = store.load("pg-1")
    assert ("completed", "charged") == (timeline.state, timeline.result)
