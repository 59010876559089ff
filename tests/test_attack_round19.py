"""Round-19 attacks on the fixes of the last two hours: the openai-agents tool errors (a tool's exception
uncertain, the SDK's argument check "not applied" by where it was raised), the session's refusal of a
call repeated while its first is in flight, and journals made absolute at start. Each test is one
suspicion: a failing reproduction first where it found a defect, kept as a short regression test where
it found none but guards a plausible mistake. The real ``openai-agents`` package against the local
provider stand-in, real SQLite files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lock_watch import PAUSE_S, SIGN_S
from provider_standin import ProviderStandIn


def _completion(n: int, message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"gen-{n}",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {"name": name, "arguments": json.dumps(args)}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": call}]}


class _OuterAndInner(ProviderStandIn):
    """The outer agent asks its agent-as-tool once; the inner agent calls ``charge`` until it has called it
    twice (the second call is the model's retry after the SDK told it the first failed), then answers."""

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages", [])
        inner = any("INNER" in str(m.get("content")) for m in messages if m.get("role") == "system")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        self.billed += 1
        if inner and turn < 2:
            return _completion(self.billed, _call(f"i{turn}", "charge", {"to": "bob", "amount": 5}))
        if not inner and turn == 0:
            return _completion(self.billed, _call("c1", "ask_billing", {"input": "charge bob 5"}))
        return _completion(self.billed, {"role": "assistant", "content": "inner done" if inner else "outer done"})


def test_an_agent_as_tools_own_tool_whose_reply_is_lost_is_not_retried_by_the_inner_model(tmp_path: Path) -> None:
    """attack18 made a tool's exception reach effectlog instead of the SDK's "An error occurred while
    running the tool" message, which made the model retry a charge whose reply was lost. An agent used as a
    tool (``inner.as_tool(...)``) runs the inner agent, as given, inside the outer tool step: its own tools
    are not wrapped and keep the SDK's default failure function, so the inner model retried the charge
    inside the same outer step and the customer was charged twice (the outer run completed). Proves: such
    an inner tool is refused before anything runs (``BadInput`` naming it, nothing charged); built with
    ``failure_error_function=None`` its exception makes the outer step's outcome unknown: uncertain, one
    charge over two passes."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.errors import BadInput, UncertainEffect
    from effectlog.integrations.openai_agents import DurableRunner

    set_tracing_disabled(True)
    effects: list[str] = []

    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        effects.append(to)
        if len(effects) == 1:
            raise ConnectionError("reply lost")  # the charge went through; its reply did not
        return f"charged {amount} to {to}"

    provider = _OuterAndInner(["unused"]).start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)

        def desk(tool: Any) -> Agent[Any]:
            billing = Agent(name="billing", instructions="INNER billing agent", model=model, tools=[tool])
            ask = billing.as_tool(tool_name="ask_billing", tool_description="ask billing")
            return Agent(name="desk", instructions="outer desk agent", model=model, tools=[ask])

        runner = DurableRunner(journal=tmp_path / "runs.db")
        with pytest.raises(BadInput, match="'ask_billing' runs agent 'billing', whose tool 'charge'"):
            runner.run_sync(desk(function_tool(charge)), "charge bob 5", run_id="order-9")
        assert [] == effects
        raising = desk(function_tool(charge, failure_error_function=None))
        for _ in range(2):  # the first pass, then a resume
            with pytest.raises(UncertainEffect):
                runner.run_sync(raising, "charge bob 5", run_id="order-10")
    finally:
        provider.stop()
    assert ["bob"] == effects


def test_an_openai_agents_tool_cancelled_inside_its_call_does_not_tell_the_model_an_error_and_wedge_the_run(
    tmp_path: Path,
) -> None:
    """attack18 calls a tool through a copy without the SDK's failure function, but the tool the SDK
    holds (the durable wrapper) kept it, and the SDK's runner uses it for a ``CancelledError`` out of the
    invoker (a client whose pool was closed under it, a task group of the tool's): the model was told the
    SDK's "An error occurred" while the idempotent step's intent stayed for a re-send, that answer was
    recorded as ``model-1``, and the next pass, after re-sending the key and getting the real result, asked
    ``model-1`` with another body: ``IdempotencyConflict`` on every pass, a run that can never complete.
    Proves: after one cancelled call and a resume, the run completes with one re-send of the same key."""
    import asyncio

    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner, idempotency_key

    set_tracing_disabled(True)
    keys: list[str] = []

    @function_tool
    async def charge(to: str, amount: int) -> str:
        """Charge a customer (idempotent by key)."""
        keys.append(idempotency_key())
        if len(keys) == 1:
            raise asyncio.CancelledError("the client's connection pool was closed")
        return f"charged {amount} to {to}"

    provider = ProviderStandIn([("charge", {"to": "bob", "amount": 5}), "done"]).start()
    outcomes: list[str] = []
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge])
        runner = DurableRunner(journal=tmp_path / "runs.db", idempotent={"charge"})
        for _ in range(3):
            try:
                outcomes.append(str(runner.run_sync(agent, "charge bob 5", run_id="order-11").final_output))
                break
            except BaseException as exc:  # what each pass ends with is the point
                outcomes.append(type(exc).__name__)
    finally:
        provider.stop()
    assert "done" == outcomes[-1], outcomes
    assert [keys[0]] * len(keys) == keys  # every send under the first call's key


def test_a_retry_refused_while_the_first_call_is_in_doubt_takes_no_step_so_the_resume_lines_up(
    tmp_path: Path,
) -> None:
    """attack18 refuses a call repeated in the pass where its first call's outcome is unknown
    (``RunUnfinished``). An application retrying with a broad ``except Exception`` swallows that refusal
    too and goes on to its next call. The refused call had taken the next position (``step-1``), so the
    next call was recorded at ``step-2``; in the resume, whose re-send of the first key succeeds, no retry
    is made and the next call is ``step-1``: ``ReplayDivergence`` ("the call moved") on every pass, a run
    that can never complete. Proves: the refused call takes no step id, the resume completes the run, the
    charge is sent under one key and the notification once."""
    from effectlog import durable
    from effectlog.errors import RunUnfinished

    keys: list[str] = []
    sent: list[str] = []
    refused: list[str] = []

    @durable.tool(idempotent=True)
    def charge(amount: int, idempotency_key: str = "") -> dict[str, int]:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise ConnectionError("reply lost")  # the charge went through; its reply did not
        return {"charged": amount}

    @durable.tool(idempotent=False)
    def notify(text: str) -> str:
        sent.append(text)
        return "sent"

    def pay() -> Any:
        with durable.run("order-12", journal=tmp_path / "runs.db") as run:
            for _ in range(2):
                try:
                    charge(5)
                    break
                except Exception as exc:  # the application's own broad retry
                    if isinstance(exc, RunUnfinished):
                        refused.append(exc.step_id or "")
            notify("paid")
        return run.completed

    assert pay() is False  # the first pass: the charge in doubt, the run left open
    assert ["step-0"] == refused
    assert pay() is True  # the resume re-sends the first key and completes
    assert [keys[0], keys[0]] == keys
    assert ["paid"] == sent


def test_a_pydantic_ai_tool_that_times_out_after_its_effect_is_not_taken_as_not_applied(tmp_path: Path) -> None:
    """pydantic-ai's tool ``timeout=`` (per tool or per toolset) ends a call that takes longer with
    ``ModelRetry("Timed out after N seconds.")``, raised from inside the toolset's ``call_tool`` that
    ``DurableToolset`` wraps; effectlog records a ``ModelRetry`` as "not applied" (the tool refused its
    args). A timed-out call's effect may well be out: a sync function keeps running on its thread (the
    toolset abandons it), an async one was cancelled after its request left. Proves: the timed-out charge
    was recorded as not applied, the model asked again, and the customer was charged twice. (Expected once
    fixed: the timeout is an unknown outcome, uncertain for a tool not declared idempotent, one charge.)"""
    import threading

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.errors import UncertainEffect
    from effectlog.integrations.pydantic_ai import DurableAgent

    charged: list[str] = []
    landed = threading.Event()  # set once the first pass has ended: only then does the first charge answer
    answered: list[bool] = []  # whether the first charge answered because its pass had ended (not by a timeout)
    answer_sent = threading.Event()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(1 for m in messages if isinstance(m, ModelResponse))
        if asked < 2:  # the first call, then the model's retry after "Timed out"
            return ModelResponse(parts=[ToolCallPart("charge", {"to": "bob", "amount": 5}, tool_call_id=f"c{asked}")])
        return ModelResponse(parts=[TextPart("charged")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain(timeout=0.2)
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent): the provider is slow to answer the first time."""
        charged.append(to)  # the charge went through
        if len(charged) == 1:  # its answer comes after the pass ended: the toolset gave up on it before
            answered.append(landed.wait(PAUSE_S))
            answer_sent.set()
        return f"charged {amount} to {to}"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    outcomes: list[str] = []
    try:
        for _ in range(2):  # the first pass, then a resume
            try:
                outcomes.append(str(durable.run_sync("charge bob 5", run_id="order-13").output))
            except UncertainEffect:
                outcomes.append("uncertain")
            landed.set()  # the pass has ended without the first charge's answer
    finally:
        landed.set()
    assert answer_sent.wait(SIGN_S), "the first charge never answered"
    assert ([True], ["bob"], ["uncertain", "uncertain"]) == (answered, charged, outcomes)


def test_an_openai_agents_tool_timeout_leaves_the_step_to_the_resume_instead_of_wedging_the_run(
    tmp_path: Path,
) -> None:
    """The SDK's ``function_tool(timeout=...)`` cancels a call that takes longer and, by default
    (``timeout_behavior="error_as_result"``), tells the model "timed out" as the call's output. It cancels
    effectlog's wrapper from outside: the idempotent step's intent stays for a re-send with its key, but the
    model's next answer, given that message, was recorded as ``model-1``; the resume re-sent the key, got
    the real result, and asked ``model-1`` with another body: ``IdempotencyConflict`` on every pass, a run
    that can never complete. Proves: the timeout ends the call inside its step (an unknown outcome), the
    resume re-sends the same key and the run completes."""
    import asyncio

    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner, idempotency_key

    set_tracing_disabled(True)
    keys: list[str] = []

    @function_tool(timeout=0.3)
    async def charge(to: str, amount: int) -> str:
        """Charge a customer (idempotent by key): the provider is slow to answer the first time."""
        keys.append(idempotency_key())
        if len(keys) == 1:
            await asyncio.sleep(5)
        return f"charged {amount} to {to}"

    provider = ProviderStandIn([("charge", {"to": "bob", "amount": 5}), "done"]).start()
    outcomes: list[str] = []
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge])
        runner = DurableRunner(journal=tmp_path / "runs.db", idempotent={"charge"})
        for _ in range(3):
            try:
                outcomes.append(str(runner.run_sync(agent, "charge bob 5", run_id="order-14").final_output))
                break
            except Exception as exc:  # what each pass ends with is the point
                outcomes.append(type(exc).__name__)
    finally:
        provider.stop()
    assert "done" == outcomes[-1], outcomes
    assert [keys[0]] * len(keys) == keys


def test_a_pydantic_ai_tools_own_model_retry_after_its_own_timeout_is_still_not_applied(tmp_path: Path) -> None:
    """The fix above tells pydantic-ai's timeout from the tool's answer by where the ``ModelRetry`` was
    raised (in pydantic-ai, while it handled a ``TimeoutError``), not by the ``TimeoutError`` alone. A tool
    whose own code turns its own timeout (before any effect: the quote service did not answer) into a
    ``ModelRetry`` is saying "nothing applied, ask again", as documented. Proves: that call is a failed step,
    the model asks again, the second call runs, and the run completes with one charge."""
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.integrations.pydantic_ai import DurableAgent
    from effectlog.session import SqliteCheckpointer

    charged: list[str] = []
    quotes: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(1 for m in messages if isinstance(m, ModelResponse))
        if asked < 2:
            return ModelResponse(parts=[ToolCallPart("charge", {"to": "bob", "amount": 5}, tool_call_id=f"c{asked}")])
        return ModelResponse(parts=[TextPart("charged")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def charge(to: str, amount: int) -> str:
        """Charge a customer after getting a quote (not idempotent)."""
        quotes.append(amount)
        try:
            if len(quotes) == 1:
                raise TimeoutError("the quote service did not answer")
        except TimeoutError as exc:
            raise ModelRetry(f"no quote yet ({exc}); ask again") from None
        charged.append(to)
        return f"charged {amount} to {to}"

    result = DurableAgent(agent, journal=tmp_path / "runs.db").run_sync("charge bob 5", run_id="order-15")
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        first = store.state("order-15").step("tool-1-c0")
    finally:
        store.close()
    assert first is not None
    assert ("charged", ["bob"], "failed", False) == (result.output, charged, first.state, first.applied)


def test_two_equal_calls_gathered_after_the_first_is_in_doubt_are_both_made_once_each(tmp_path: Path) -> None:
    """The refusal's step id handed back (above) must not let two calls meant to be two share one id or
    lose one. ``asyncio.gather`` of two equal async durable calls (two charges the code means to make),
    the first's reply lost: the second is refused in that pass (it waits its turn, then finds the first in
    doubt). Proves: the resume sends the first's key again and the second under its own, the run completes,
    and the provider sees two keys, the first twice: two charges, none twice."""
    import asyncio

    from effectlog import durable
    from effectlog.errors import RunUnfinished

    keys: list[str] = []

    @durable.tool(idempotent=True)
    async def charge(amount: int, idempotency_key: str = "") -> dict[str, int]:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise ConnectionError("reply lost")
        return {"charged": amount}

    async def pay() -> bool:
        async with durable.run("order-16", journal=tmp_path / "runs.db") as run:
            results = await asyncio.gather(charge(5), charge(5), return_exceptions=True)
            if any(isinstance(r, BaseException) for r in results):
                assert [ConnectionError, RunUnfinished] == [type(r) for r in results]
        return run.completed

    assert asyncio.run(pay()) is False
    assert asyncio.run(pay()) is True
    assert 3 == len(keys)
    assert keys[0] == keys[1] != keys[2]


class _InnerChargesTwo(ProviderStandIn):
    """The outer agent asks its agent-as-tool once; the inner agent charges bob, then alice, then answers."""

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages", [])
        inner = any("INNER" in str(m.get("content")) for m in messages if m.get("role") == "system")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        self.billed += 1
        if inner and turn < 2:
            return _completion(self.billed, _call(f"i{turn}", "charge", {"to": ["bob", "alice"][turn], "amount": 5}))
        if not inner and turn == 0:
            return _completion(self.billed, _call("c1", "ask_billing", {"input": "charge bob and alice"}))
        return _completion(self.billed, {"role": "assistant", "content": "inner done" if inner else "outer done"})


def test_an_agent_as_tools_own_tools_do_not_share_the_outer_steps_idempotency_key(tmp_path: Path) -> None:
    """Inside an agent used as a tool, ``idempotency_key()`` answered the outer tool step's key to every
    tool of the inner agent: its charge of bob and its charge of alice went out under one key, and a
    provider deduplicating by key (as the key asks it to) answered alice's with bob's stored charge: alice
    never charged, the run completed, verify ok. Proves: an inner tool asking for a key gets none (its calls
    are not steps of their own); nothing goes out under a key that names another call."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.errors import EffectlogError
    from effectlog.integrations.openai_agents import DurableRunner, idempotency_key
    from effectlog.session import SqliteCheckpointer

    set_tracing_disabled(True)
    by_key: dict[str, list[str]] = {}

    @function_tool(failure_error_function=None)
    def charge(to: str, amount: int) -> str:
        """Charge a customer through a provider that deduplicates by key."""
        by_key.setdefault(idempotency_key(), []).append(to)
        return f"charged {amount} to {to}"

    provider = _InnerChargesTwo(["unused"]).start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        billing = Agent(name="billing", instructions="INNER billing agent", model=model, tools=[charge])
        ask = billing.as_tool(tool_name="ask_billing", tool_description="ask billing")
        desk = Agent(name="desk", instructions="outer desk agent", model=model, tools=[ask])
        with pytest.raises(EffectlogError) as caught:
            DurableRunner(journal=tmp_path / "runs.db").run_sync(desk, "charge bob and alice", run_id="order-17")
    finally:
        provider.stop()
    assert {} == by_key  # nothing went out under a key naming another call
    assert "tool-1-c1" == caught.value.step_id
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        step = store.state("order-17").step("tool-1-c1")
    finally:
        store.close()
    assert step is not None
    assert "uncertain" == step.state  # the outer step: its inner run ended, what it did before is unknown
    assert "inside an agent used as a tool" in (step.reason or "")
