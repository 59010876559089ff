"""DurableAgent on the PostgreSQL journal: the same run held, approved and completed through a URL."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from effectlog.integrations.pydantic_ai import DurableAgent
from effectlog.journal import open_journal
from effectlog.session import JournalCheckpointer

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres


def test_a_held_call_is_approved_and_run_once_on_postgres(pg_url: str) -> None:
    """Each pass opens its own connection from the URL: held, approved through DeferredToolResults,
    charged once, replayed; the journal on PostgreSQL says completed."""
    charged: list[int] = []
    requests: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(1)
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("charge", {"amount": 5}, tool_call_id="c")])
        return ModelResponse(parts=[TextPart("charged")])

    agent: Agent[None, Any] = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def charge(amount: int) -> str:
        charged.append(amount)
        return "ok"

    durable = DurableAgent(agent, journal=pg_url, needs_approval={"charge"})
    assert isinstance(durable.run_sync("charge 5", run_id="pg-1").output, DeferredToolRequests)
    approve = DeferredToolResults(approvals={"c": True}, answered_by={"c": "ann"})
    assert "charged" == durable.run_sync("charge 5", run_id="pg-1", deferred_tool_results=approve).output
    assert "charged" == durable.run_sync("charge 5", run_id="pg-1").output
    assert ([5], 2) == (charged, len(requests))
    with JournalCheckpointer(open_journal(pg_url, writer=False)) as store:
        timeline = store.load("pg-1")
    assert ("completed", "charged") == (timeline.state, timeline.result)
