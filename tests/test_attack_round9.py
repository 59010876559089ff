"""Round-9 attacks: the run's life cycle (recover, fork, retry, repin, lineage) and the libraries users call
directly (``effectlog.durable``, sessions, the framework integrations, effect stores), with cases nobody had
tried. Each test is one suspicion, a failing reproduction first where it found a defect, kept as a
regression test where it found none. Real SQLite files, real processes (``python -m effectlog``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from effectlog import durable
from effectlog.errors import BadInput
from effectlog.session import SqliteCheckpointer, ToolInfo


class ToolsOnly:
    """A session gateway of idempotent tools and no model (subclasses give ``call_tool``)."""

    model = ""

    def tool(self, name: str) -> ToolInfo:
        return ToolInfo(name=name, idempotent=True)

    def tools(self) -> list[ToolInfo]:
        return []

    async def complete(self, body: Any, *, idempotency_key: str) -> dict[str, Any]:
        raise AssertionError("no model calls")


# -- 1. a durable tool called from inside another durable tool's body, past the overlap check -------


def test_an_async_tool_run_inside_a_sync_tools_body_is_refused_not_a_step_a_resume_skips(tmp_path: Path) -> None:
    """A sync durable tool whose body drives an async durable tool with ``asyncio.run`` (a sync wrapper
    around an async client) slipped past the overlap check (the inner call ran in a new task of a new
    loop, so it queued for its turn instead of being refused): it became its own step, after the outer
    one. On resume the outer step is recorded and does not run, so its inner call is not made, and the
    block's next direct call of the same tool with the same args took the inner call's step and its
    recorded result: a charge the program makes was never sent. Proves: the nested call is refused
    (BadInput, "call another"), nothing of it is sent or recorded, and a block that makes the direct
    call sends it."""
    sent: list[int] = []

    @durable.tool(idempotent=True)
    async def charge(cents: int) -> str:
        sent.append(cents)
        return f"charged {cents}"

    @durable.tool(idempotent=True)
    def checkout() -> str:
        return asyncio.run(charge(5))

    journal = tmp_path / "j.db"
    with pytest.raises(BadInput, match="call another"), durable.run("r", journal=journal):
        checkout()
    with durable.run("r2", journal=journal):
        assert "charged 5" == asyncio.run(charge(5))
    with SqliteCheckpointer(journal) as store:
        tools = [(s.step_id, s.adapter, s.state) for s in store.load("r").steps]
    assert ([5], [("step-0", "checkout", "requested")]) == (sent, tools)


def test_an_async_tool_gathering_durable_tools_in_its_body_is_refused_not_a_deadlock(tmp_path: Path) -> None:
    """An async durable tool whose body awaits ``asyncio.gather`` of other durable tools: the gathered
    calls run in new tasks, so they queued for the run's turn, which the outer call holds until they
    finish: the run hung for ever (here cut by ``wait_for``). Proves: the inner calls are refused
    (BadInput, "call another") at once and none of them is sent."""
    sent: list[int] = []

    @durable.tool(idempotent=True)
    async def charge(cents: int) -> int:
        sent.append(cents)
        return cents

    @durable.tool(idempotent=True)
    async def basket() -> list[int]:
        return list(await asyncio.gather(charge(1), charge(2)))

    async def block() -> None:
        async with durable.run("r", journal=tmp_path / "j.db"):
            await asyncio.wait_for(basket(), 10)

    with pytest.raises(BadInput, match="call another"):
        asyncio.run(block())
    assert [] == sent


# -- 2. a generator function declared as a durable tool ------------------------------------------


def _gen(sent: list[int]) -> Any:
    def ship(n: int) -> Any:
        sent.append(n)
        yield n

    return ship


def _agen(sent: list[int]) -> Any:
    async def ship(n: int) -> Any:
        sent.append(n)
        yield n

    return ship


@pytest.mark.parametrize("make", [_gen, _agen], ids=["generator", "async-generator"])
def test_a_generator_function_is_refused_as_a_durable_tool_when_declared(tmp_path: Path, make: Any) -> None:
    """A generator (or async generator) function decorated as a durable tool: calling it runs none of its
    body, it returns a generator, which no journal can hold. A non-idempotent one then stopped the run as
    uncertain and asked a person to reconcile an effect that never happened (an idempotent one failed on
    every pass, its intent left). Proves: the declaration is refused (BadInput naming the tool), before
    any run or journal exists."""
    sent: list[int] = []
    with pytest.raises(BadInput, match=r"'ship'.*generator"):
        durable.tool(idempotent=False)(make(sent))
    assert ([], False) == (sent, (tmp_path / "j.db").exists())


# -- 3. a session resumed with another toolbox: a tool now declared not idempotent ----------------


def test_a_tool_redeclared_not_idempotent_is_not_sent_again_on_resume(tmp_path: Path) -> None:
    """Pass 1 declares ``pay`` idempotent; its call sends and then raises (a lost reply), so the intent
    stays for the next pass to send again with the same key. The code is then changed: ``pay`` is
    declared ``idempotent=False`` (its owners learned the API ignores keys). The resume decided from the
    journal's recorded flag alone and sent the call again, against the declaration now in force: a
    second charge. Proves: the resume takes the stricter of the two declarations: the step stops as
    uncertain (``UncertainEffect``, the run stopped), and ``pay`` was sent once."""
    from effectlog.errors import UncertainEffect

    sent: list[int] = []

    def declare(idempotent: bool) -> Any:
        @durable.tool(idempotent=idempotent, name="pay")
        def pay(cents: int) -> str:
            sent.append(cents)
            if len(sent) == 1:
                raise ConnectionError("reply lost")
            return "paid"

        return pay

    journal = tmp_path / "j.db"
    pay = declare(True)
    with pytest.raises(ConnectionError), durable.run("r", journal=journal):
        pay(5)
    pay = declare(False)
    with pytest.raises(UncertainEffect), durable.run("r", journal=journal):
        pay(5)
    with SqliteCheckpointer(journal) as store:
        run = store.load("r").run
    assert ([5], "stopped", "uncertain") == (sent, run.state, run.step("step-0").state)  # type: ignore[union-attr]


# -- 4. a callable object declared as a durable tool ----------------------------------------------


class _Client:
    """A client object called like a function (a configured API client): ``durable.tool(name=...)(client)``."""

    def __init__(self, sent: list[int]) -> None:
        self.sent = sent

    def __call__(self, cents: int) -> str:
        self.sent.append(cents)
        return f"paid {cents}"


class _AsyncClient(_Client):
    async def __call__(self, cents: int) -> str:  # type: ignore[override]
        self.sent.append(cents)
        return f"paid {cents}"


@pytest.mark.parametrize("kind", [_Client, _AsyncClient], ids=["sync", "async"])
def test_a_callable_object_is_a_durable_tool_called_once_and_replayed(tmp_path: Path, kind: type[_Client]) -> None:
    """An object with ``__call__`` (no ``__qualname__`` of its own) declared as a durable tool: the
    one-function-per-name check read ``fn.__qualname__`` and raised AttributeError at the first call (a
    traceback from effectlog), and an ``async def __call__`` was taken for a sync function, so its call
    returned an unawaited coroutine, which stopped the run as uncertain with nothing sent. Proves: the
    call runs once and returns its value (awaited when ``__call__`` is async), and a second pass of the
    completed run answers from the journal without calling it."""
    sent: list[int] = []
    pay = durable.tool(idempotent=False, name="pay")(kind(sent))

    async def block() -> list[str]:
        async with durable.run("r", journal=tmp_path / "j.db"):
            value = pay(5)
            return [await value if asyncio.iscoroutine(value) else value]

    assert (["paid 5"], ["paid 5"], [5]) == (asyncio.run(block()), asyncio.run(block()), sent)


def test_a_callable_object_called_outside_a_run_is_not_in_run() -> None:
    """The outside-a-block error named ``fn.__name__``, which a callable object lacks: AttributeError
    instead of ``NotInRun``. Proves: ``NotInRun`` naming the tool, nothing called."""
    from effectlog.errors import NotInRun

    sent: list[int] = []
    pay = durable.tool(idempotent=False, name="pay")(_Client(sent))
    with pytest.raises(NotInRun, match="'pay'"):
        pay(5)
    assert [] == sent


# -- 5. a key given to a step after a code change ---------------------------------------------------


def test_a_step_given_a_key_after_a_code_change_is_not_run_again_under_it(tmp_path: Path) -> None:
    """Pass 1 (old code) calls ``lookup`` then ``charge``, both unkeyed (``step-0``, ``step-1``), and
    stops before finishing. The code is changed to give ``charge`` a step key. Pass 2 replays ``step-0``,
    then asks for the keyed step, which the journal does not hold, so it ran: the charge was sent a
    second time under a new id, and only ``finish`` noticed (``ReplayDivergence``: ``step-1`` never
    reached), after the effect. Proves: a pass does not run a new step while a step recorded earlier is
    still unreached (``ReplayDivergence`` naming it, before anything is written), so the charge was sent
    once; the old code resumes and completes the run."""
    from effectlog.errors import ReplayDivergence
    from effectlog.session import Session, ToolInfo

    sent: list[str] = []

    class Tools:
        model = ""

        def tool(self, name: str) -> ToolInfo:
            return ToolInfo(name=name, idempotent=name == "lookup")

        def tools(self) -> list[ToolInfo]:
            return []

        async def complete(self, body: Any, *, idempotency_key: str) -> dict[str, Any]:
            raise AssertionError("no model calls")

        async def call_tool(self, name: str, args: Any, *, idempotency_key: str) -> Any:
            sent.append(name)
            return name

    async def drive(store: SqliteCheckpointer, charge_key: str | None, *, finish: bool) -> None:
        session = Session("r", Tools(), store)
        try:
            await session.tool("lookup", {"who": "bob"})
            await session.tool("charge", {"cents": 5}, key=charge_key)
            if finish:
                session.finish("done")
        finally:
            session.release()

    with SqliteCheckpointer(tmp_path / "j.db") as store:
        asyncio.run(drive(store, None, finish=False))
        with pytest.raises(ReplayDivergence, match="step-1"):
            asyncio.run(drive(store, "charge-bob", finish=True))
        asyncio.run(drive(store, None, finish=True))
        state = store.load("r").run
    assert (["lookup", "charge"], "completed", ["step-0", "step-1"]) == (
        sent,
        state.state,
        [s.step_id for s in state.ordered_steps()],
    )


# -- 6. two blocks of one run id in one process (found nothing: regression tests) --------------------


def test_a_durable_block_of_a_run_id_nested_in_another_of_the_same_id_is_refused(tmp_path: Path) -> None:
    """``with durable.run("r")`` inside ``with durable.run("r")`` (a helper that opens its own block):
    the inner block replays what it finds recorded (``pay(1)``, not sent again), a different call at a
    recorded position is ``ReplayDivergence``, and its first write (completing the run at its end) is
    refused (``RunOwned``: the outer block's first call claimed the run). Proves: each call sent once,
    the run completed by the outer block with its two steps (found nothing)."""
    from effectlog.errors import ReplayDivergence, RunOwned

    sent: list[int] = []

    @durable.tool(idempotent=False)
    def pay(cents: int) -> int:
        sent.append(cents)
        return cents

    journal = tmp_path / "j.db"
    with durable.run("r", journal=journal) as outer:
        pay(1)
        with pytest.raises(ReplayDivergence), durable.run("r", journal=journal):
            pay(2)
        with pytest.raises(RunOwned), durable.run("r", journal=journal):
            assert 1 == pay(1)
        pay(3)
        outer.finish("ok")
    with SqliteCheckpointer(journal) as store:
        state = store.load("r").run
    assert ([1, 3], "completed", 2) == (sent, state.state, len(state.steps))


# -- 7. tool call ids from a model: duplicates and characters that matter (found nothing) ------------


def _pydantic_agent(parts: list[Any], sent: list[int]) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    def model(messages: list[Any], info: Any) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=parts)
        return ModelResponse(parts=[TextPart("done")])

    agent: Any = Agent(FunctionModel(model), output_type=str)

    @agent.tool_plain
    def charge(i: int) -> str:
        sent.append(i)
        return f"charged {i}"

    return agent


ODD_IDS = ["a\x00b", "x/../y", "u\u0308-\u00e9", "z" * 100_000, "step-3", "-", " ", "1-2", "model-0"]


def test_pydantic_tool_call_ids_with_odd_characters_are_each_one_step_run_once(tmp_path: Path) -> None:
    """A response whose tool call ids hold a NUL, slashes and dots, combining characters, 100,000
    characters, a positional-looking ``step-3``, ``-``, a space, ``1-2`` (which next to the turn number
    could read as another turn) and ``model-0`` (a model step's id): each call is its own step
    ``tool-1-<id>``, run once, and a second pass of the completed run calls nothing (found nothing)."""
    from pydantic_ai.messages import ToolCallPart

    from effectlog.integrations.pydantic_ai import DurableAgent

    sent: list[int] = []
    parts = [ToolCallPart("charge", {"i": i}, tool_call_id=c) for i, c in enumerate(ODD_IDS)]
    durable_agent = DurableAgent(_pydantic_agent(parts, sent), journal=tmp_path / "j.db")
    outputs = [durable_agent.run_sync("pay", run_id="r").output for _ in range(2)]
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        ids = [s.step_id for s in store.load("r").steps]
    expected_ids = ["model-0", *[f"tool-1-{c}" for c in ODD_IDS], "model-1"]
    assert (["done", "done"], list(range(len(ODD_IDS))), expected_ids) == (outputs, sent, ids)


def test_pydantic_a_tool_call_id_twice_in_one_response_sends_neither(tmp_path: Path) -> None:
    """A model answering two calls under one ``tool_call_id`` (``charge(5)`` and ``charge(7)``): two calls
    and one step id would make one effect for two calls, or the second call's result the first's.
    pydantic-ai refuses the response itself (``UnexpectedModelBehavior``) on every pass. Proves: neither
    call is sent, on the first pass or a resume (found nothing)."""
    from pydantic_ai.exceptions import UnexpectedModelBehavior
    from pydantic_ai.messages import ToolCallPart

    from effectlog.integrations.pydantic_ai import DurableAgent

    sent: list[int] = []
    parts = [ToolCallPart("charge", {"i": 5}, tool_call_id="x"), ToolCallPart("charge", {"i": 7}, tool_call_id="x")]
    durable_agent = DurableAgent(_pydantic_agent(parts, sent), journal=tmp_path / "j.db")
    for _ in range(2):
        with pytest.raises(UnexpectedModelBehavior, match="unique"):
            durable_agent.run_sync("pay", run_id="r")
    assert [] == sent


def test_openai_agents_one_call_id_twice_in_one_response(tmp_path: Path) -> None:
    """The OpenAI Agents SDK with a response that repeats a call id: with other arguments the SDK refuses
    the response (``ModelBehaviorError``), nothing sent; with the same call twice it runs it as one
    invocation, and the journal has one step for it, sent once and replayed by a second pass (found
    nothing: one effect for what the SDK itself treats as one call)."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from agents.exceptions import ModelBehaviorError
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)

    class OneId(ProviderStandIn):
        def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
            out = super()._generate(body)
            for call in out["choices"][0]["message"].get("tool_calls") or []:
                call["id"] = "same"
            return out

    def outcome(calls: list[Any], journal: Path) -> tuple[list[Any], list[int]]:
        sent: list[int] = []

        @function_tool
        def charge(amount: int) -> str:
            """Charge."""
            sent.append(amount)
            return f"charged {amount}"

        provider = OneId([calls, "done"]).start()
        try:
            client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
            model = OpenAIChatCompletionsModel(model="m", openai_client=client)
            agent = Agent(name="b", instructions="x", model=model, tools=[charge])
            runner = DurableRunner(journal=journal)
            outputs: list[Any] = []
            for _ in range(2):
                try:
                    outputs.append(runner.run_sync(agent, "go", run_id="R").final_output)
                except ModelBehaviorError:
                    outputs.append("refused")
            return outputs, sent
        finally:
            provider.stop()

    other = outcome([("charge", {"amount": 5}), ("charge", {"amount": 7})], tmp_path / "a.db")
    same = outcome([("charge", {"amount": 5}), ("charge", {"amount": 5})], tmp_path / "b.db")
    assert ((["refused", "refused"], []), (["done", "done"], [5])) == (other, same)


def test_pydantic_a_run_killed_mid_tool_and_resumed_with_the_tool_renamed_sends_nothing(tmp_path: Path) -> None:
    """A real child SIGKILLed inside ``charge`` right after its effect (the step ``requested``, no result),
    then the code renames the tool to ``bill``. The recorded response asks for ``charge``, which the new
    agent does not have: pydantic-ai would tell the model, and a model answering with ``bill`` would
    make the charge again under a new step, past the one whose outcome is unknown. Proves: the resume
    stops at the first model step (``IdempotencyConflict``: the tool list is part of the request body,
    so the recorded request is not this pass's), and nothing is sent: neither model nor tool (found
    nothing)."""
    import os
    import subprocess
    import sys

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from effectlog.errors import IdempotencyConflict
    from effectlog.integrations.pydantic_ai import DurableAgent

    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    journal, calls = tmp_path / "j.db", tmp_path / "calls.txt"
    child = [sys.executable, str(tests / "pydantic_ai_child.py"), str(journal), "r", str(calls), "charge"]
    died = subprocess.run([*child, "die-in-tool"], env=env, capture_output=True, text=True, timeout=120)
    asked: list[int] = []
    sent: list[int] = []

    def model(messages: list[Any], info: Any) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        asked.append(turn)
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("bill", {"to": "bob", "amount": 5}, tool_call_id="call-2")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Any = Agent(FunctionModel(model), output_type=str)

    @agent.tool_plain
    def bill(to: str, amount: int) -> str:
        """Charge a customer (renamed)."""
        sent.append(amount)
        return "billed"

    with pytest.raises(IdempotencyConflict, match="model-0"):
        DurableAgent(agent, journal=journal).run_sync("charge bob 5", run_id="r")
    effects = [line for line in calls.read_text().splitlines() if line.startswith("effect")]
    assert (-9, 1, [], []) == (died.returncode, len(effects), asked, sent)


# -- 8. finish() racing a tool step (found nothing) ----------------------------------------------------


def test_finish_while_an_async_tool_is_in_flight_or_queued_leaves_no_effect_unaccounted(tmp_path: Path) -> None:
    """``run.finish()`` called while one async durable call is in flight (its intent recorded) is
    ``RunUnfinished`` (completing would leave its effect unaccounted for); called while a call is only
    scheduled (no intent yet), it completes the run and the call, when its task runs, is ``RunClosed``
    and sends nothing. Proves: one call sent, the run completed with one confirmed step (found
    nothing)."""
    from effectlog.errors import RunClosed, RunUnfinished

    sent: list[int] = []

    @durable.tool(idempotent=False)
    async def pay(cents: int) -> int:
        sent.append(cents)
        await asyncio.sleep(0.05)
        return cents

    async def block() -> tuple[str, str]:
        async with durable.run("r", journal=tmp_path / "j.db") as run:
            flying = asyncio.ensure_future(pay(1))
            await asyncio.sleep(0.01)
            with pytest.raises(RunUnfinished):
                run.finish("early")
            await flying
            queued = asyncio.ensure_future(pay(2))
            run.finish("done")
            with pytest.raises(RunClosed):
                await queued
            return run.result, run.session.state.state

    assert (("done", "completed"), [1]) == (asyncio.run(block()), sent)


# -- 9. idempotency keys of two steps of different runs ------------------------------------------------


def test_two_session_steps_whose_ids_hold_a_nul_never_share_an_idempotency_key(tmp_path: Path) -> None:
    """A step's key is ``sha256(run_id NUL step_id NUL attempt)``. Session run ids and step ids are any
    text (a step id from a model's tool call id may hold a NUL, and so may an application's run id), so
    run ``r`` with step ``x\\0y`` and run ``r\\0x`` with step ``y`` gave one key: a tool that keeps keys
    (as the effect store does) answered the second run's call with the first run's receipt, and its
    effect never happened. A new run id holding a NUL is refused since (round 21: no command could name
    it), so the second run is made here as one recorded before that. Proves: the two steps get two keys
    and each call is made (two effects), and a key of ids without a NUL is the one the formula always gave
    (recorded keys stay valid)."""
    import hashlib

    from effectlog import events as ev
    from effectlog.adapters.protocol import idempotency_key
    from effectlog.session import Session

    ledger: dict[str, str] = {}

    class KeepsKeys(ToolsOnly):
        async def call_tool(self, name: str, args: Any, *, idempotency_key: str) -> Any:
            return ledger.setdefault(idempotency_key, f"paid {args['cents']}")

    async def pay(store: SqliteCheckpointer, run_id: str, key: str, cents: int) -> Any:
        session = Session(run_id, KeepsKeys(), store)
        try:
            return await session.tool("pay", {"cents": cents}, key=key)
        finally:
            session.release()

    # A new run id holding a NUL is refused since rounds 20/21 (the CLI could never name its run); one recorded
    # before opens as it is, so the second run is recorded the way an older version did.
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        first = asyncio.run(pay(store, "r", "x\x00y", 5))
        store.append([ev.RunStarted(run_id="r\x00x", seq=1, ts=1, kind="session")])  # recorded before round 21
        second = asyncio.run(pay(store, "r\x00x", "y", 7))
    old = "el1-" + hashlib.sha256(b"r\x00step-0\x001").hexdigest()[:40]
    assert ("paid 5", "paid 7", 2, old) == (first, second, len(ledger), idempotency_key("r", "step-0", 1))
    assert idempotency_key("r", "x\x00y", 1) != idempotency_key("r\x00x", "y", 1)


def test_two_threads_each_in_a_durable_block_of_one_run_id_never_both_send(tmp_path: Path) -> None:
    """Two threads of one process each open ``durable.run("t")`` on the same journal file (two workers
    picking the same job) and call a slow non-idempotent tool: the claim is per run, not per thread or
    connection, so the second block's first write is refused (``RunOwned``; or ``EventConflict`` if
    the first had finished by then: the run moved since the block read it). Proves: each call sent
    once, by one thread, and the other thread was refused (found nothing)."""
    import threading
    import time

    from effectlog.errors import EventConflict, RunOwned

    both_in = threading.Barrier(2)

    sent: list[tuple[str, int]] = []
    refused: list[str] = []

    @durable.tool(idempotent=False)
    def pay(cents: int) -> int:
        sent.append((threading.current_thread().name, cents))
        time.sleep(0.2)
        return cents

    def worker() -> None:
        try:
            with durable.run("t", journal=tmp_path / "j.db"):
                both_in.wait(10)
                pay(1)
                pay(2)
        except (RunOwned, EventConflict):
            refused.append(threading.current_thread().name)

    threads = [threading.Thread(target=worker, name=f"w{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    senders = {name for name, _ in sent}
    assert ([1, 2], 1, 1, set()) == ([c for _, c in sent], len(senders), len(refused), senders & set(refused))


# -- 10. fork and retry while the fork runs (found nothing) -------------------------------------------


def test_a_fork_of_a_retry_that_is_running_is_refused_and_a_second_retry_too(tmp_path: Path) -> None:
    """A failed run P (``ship`` failed: the carrier was down) is retried; while the retry P.retry1 is in
    its ``ship`` step (a real process, the run claimed), an operator forks P.retry1 (a fork of a fork
    while it runs: its remaining steps would run twice) and another retries P again. Proves: the fork
    is refused (exit 6, one line, the fork not created), the second retry is refused (exit 6: the first
    retry still holds P's retry turn; once it ends, exit 5 naming P.retry1), ``lineage`` shows P.retry1
    as P's fork meanwhile, and once released the retry completes: ``charged`` and ``shipped`` each once
    in the ledger (found nothing)."""
    import json
    import subprocess
    import sys
    import time

    from hardening_kit import cli_env, effectlog, one_line

    ship = (
        "test -f carrier-up || exit 1; touch started; "
        "while [ ! -f go ]; do sleep 0.05; done; echo shipped >> ledger.txt"
    )
    plan = {
        "run_id": "P",
        "adapters": {"sh": {"type": "shell", "version": "1", "idempotent": False}},
        "steps": [
            {"id": "charge", "adapter": "sh", "args": {"argv": ["sh", "-c", "echo charged >> ledger.txt"]}},
            {"id": "ship", "adapter": "sh", "args": {"argv": ["sh", "-c", ship]}},
        ],
    }
    (tmp_path / "p.json").write_text(json.dumps(plan))
    j = ("--journal", "j.db")
    assert 1 == effectlog("run", "p.json", *j, cwd=tmp_path).returncode
    (tmp_path / "carrier-up").touch()
    retry = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "retry", *j, "--run-id", "P", "--by", "ann", "--reason", "carrier up"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert retry.poll() is None, retry.communicate()
            assert time.monotonic() < deadline, "the retry's ship step did not start in 120 s"
            time.sleep(0.02)
        fork = effectlog(
            "fork", *j, "--run-id", "P.retry1", "--new-run-id", "Q", "--by", "bo", "--reason", "x", cwd=tmp_path
        )
        again = effectlog("retry", *j, "--run-id", "P", "--by", "cy", "--reason", "x", cwd=tmp_path)
        lineage = json.loads(effectlog("lineage", *j, "--run-id", "P", "--json", cwd=tmp_path).stdout)
        q = effectlog("status", *j, "--run-id", "Q", cwd=tmp_path)
    finally:
        (tmp_path / "go").touch()
        retry.communicate(timeout=120)
    after = effectlog("retry", *j, "--run-id", "P", "--by", "cy", "--reason", "x", cwd=tmp_path)
    assert (6, "P.retry1", 6, "retry", ["P.retry1"], True, 0, 5, "P.retry1") == (
        fork.returncode,
        "P.retry1" if "P.retry1" in one_line(fork.stderr) else fork.stderr,
        again.returncode,
        "retry" if "retry" in one_line(again.stderr) else again.stderr,
        [f["run_id"] for f in lineage["forks"]],
        q.returncode != 0,
        retry.returncode,
        after.returncode,
        "P.retry1" if "P.retry1" in one_line(after.stderr) else after.stderr,
    )
    assert ["charged", "shipped"] == (tmp_path / "ledger.txt").read_text().split()


def test_a_durable_sleep_inside_a_durable_tools_body_is_refused(tmp_path: Path) -> None:
    """``durable.sleep`` called from a durable tool's body became a step of its own after the tool's:
    a resume skips the recorded tool, and so its sleep, so the block's next call took the sleep's
    position and every later pass raised ``ReplayDivergence`` (the run could never complete with the
    code that made it). Proves: the sleep is refused (BadInput, "inside"), the tool's outcome is left
    for the next pass (idempotent: sent again), and a block that calls it then completes the run."""
    sent: list[int] = []

    @durable.tool(idempotent=True)
    def wait_then_pay(cents: int) -> int:
        if not sent:
            sent.append(0)
            durable.sleep(0.01)
        sent.append(cents)
        return cents

    journal = tmp_path / "j.db"
    with pytest.raises(BadInput, match="inside"), durable.run("s", journal=journal):
        wait_then_pay(5)
    with durable.run("s", journal=journal) as run:
        assert 5 == wait_then_pay(5)
    assert ([0, 5], True) == (sent, run.completed)


# -- 11. lineage of a run whose first event is damaged ------------------------------------------------


def test_lineage_of_a_run_whose_first_event_does_not_decode_is_one_line(tmp_path: Path) -> None:
    """``lineage`` reads a run's first event to name its parent without verifying the run; a first
    event whose body does not decode (a damaged file, a hand edit) came out as a msgspec traceback,
    exit 1. Proves: one line naming the run and seq 1, the integrity exit status (7), no traceback."""
    import json

    from effectlog.errors import ExitStatus
    from hardening_kit import GOOD_PLAN, effectlog, one_line

    assert 0 == effectlog("run", "--journal", "j.db", str(GOOD_PLAN), cwd=tmp_path).returncode
    run_id = json.loads(GOOD_PLAN.read_text())["run_id"]
    db = journal_tamper.connect(tmp_path / "j.db")
    db.execute("DROP TRIGGER events_append_only_update")
    db.execute("UPDATE ev SET body = ? WHERE run_id = ? AND seq = 1", (b"\x00damaged", run_id))
    db.commit()
    db.close()
    proc = effectlog("lineage", "--journal", "j.db", "--run-id", run_id, cwd=tmp_path)
    line = one_line(proc.stderr)
    assert (ExitStatus.INTEGRITY, True) == (proc.returncode, run_id in line and "seq 1" in line), line


# -- 12. an agent used as a tool (OpenAI Agents SDK) ---------------------------------------------------


def test_openai_agents_an_agent_as_tool_is_inside_its_tool_step_and_the_run_resumes(tmp_path: Path) -> None:
    """``inner.as_tool()`` runs the inner agent with the outer run's ``RunConfig``, so an inner agent
    naming its model by string got it from DurableRunner's provider: its model calls became steps of the
    outer run (``model-1``), made inside the outer tool step and numbered in the outer run's count. A
    resume skips the recorded tool step, and so the inner calls, so the outer's next model call took
    ``model-1``: ``ReplayDivergence`` on every pass after the outer's last call failed once (the run
    could never complete). Proves: the inner agent's calls are part of the tool step that makes them
    (not steps of their own), and after the provider failed the outer's last call, the next pass
    completes the run with steps model-0, tool-1-c1, model-1, the tool not run again."""
    import json

    from agents import Agent, OpenAIChatCompletionsModel, OpenAIProvider, RunConfig, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)

    class Two(ProviderStandIn):
        failed = False

        def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
            messages = body.get("messages", [])
            inner = any("INNER" in str(m.get("content")) for m in messages if m.get("role") == "system")
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            self.billed += 1
            message: dict[str, Any] = {"role": "assistant", "content": "inner says hi" if inner else "outer done"}
            if not inner and turn == 0:
                call = {"name": "ask_inner", "arguments": json.dumps({"input": "hi"})}
                calls = [{"id": "c1", "type": "function", "function": call}]
                message = {"role": "assistant", "content": None, "tool_calls": calls}
            elif not inner and not self.failed:
                self.failed = True
                raise RuntimeError("the provider is down for the outer agent's last call")
            return {
                "id": f"gen-{self.billed}",
                "object": "chat.completion",
                "model": body.get("model", ""),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

    provider = Two(["unused"]).start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="t", max_retries=0)
        inner = Agent(name="inner", instructions="INNER agent", model="stand-in")
        outer = Agent(
            name="outer",
            instructions="outer agent",
            model=OpenAIChatCompletionsModel(model="m", openai_client=client),
            tools=[inner.as_tool(tool_name="ask_inner", tool_description="ask the inner agent")],
        )
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=False))
        runner = DurableRunner(journal=tmp_path / "j.db", idempotent={"ask_inner"})
        with pytest.raises(Exception, match="Connection"):
            runner.run_sync(outer, "go", run_id="R", run_config=config)
        inner_calls = provider.billed - 2  # outer: model-0 and the failed last call
        output = runner.run_sync(outer, "go", run_id="R", run_config=config).final_output
        billed_after = provider.billed
    finally:
        provider.stop()
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        steps = [(s.step_id, s.state) for s in store.load("R").steps]
    expected = [("model-0", "confirmed"), ("tool-1-c1", "confirmed"), ("model-1", "confirmed")]
    assert ("outer done", expected, 1, 4) == (output, steps, inner_calls, billed_after)


# -- 13. a session step made from inside another step's call ------------------------------------------


def test_a_session_step_made_inside_a_tool_call_of_the_same_session_is_refused(tmp_path: Path) -> None:
    """The ``durable`` fix above, one layer down: a ``Session`` whose gateway's tool call makes another
    step of the same session (a tool that calls the session again: an agent loop inside a tool). The
    inner step was recorded after the outer's intent; a resume skips the recorded outer call and so the
    inner one, and the loop's next direct call of the same tool and args took the inner call's step and
    its result: an effect the program makes, never made. Proves: the inner step is refused (BadInput,
    "inside"), nothing of it sent or recorded (the outer step's intent stays, for the next pass)."""
    from effectlog.session import Session

    sent: list[str] = []

    class Nesting(ToolsOnly):
        session: Session

        async def call_tool(self, name: str, args: Any, *, idempotency_key: str) -> Any:
            if name == "checkout":
                return await self.session.tool("charge", {"cents": 5})
            sent.append(name)
            return "charged"

    async def drive(store: SqliteCheckpointer) -> None:
        gateway = Nesting()
        gateway.session = Session("r", gateway, store)
        try:
            await gateway.session.tool("checkout", {})
        finally:
            gateway.session.release()

    with SqliteCheckpointer(tmp_path / "j.db") as store:
        with pytest.raises(BadInput, match="inside"):
            asyncio.run(drive(store))
        steps = [(s.step_id, s.adapter, s.state) for s in store.load("r").steps]
    assert ([], [("step-0", "checkout", "requested")]) == (sent, steps)
