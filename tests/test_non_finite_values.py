"""NaN and the infinities have no canonical JSON form: the encoder writes each as ``null``, so a digest or a
record over a value holding one is the digest or record of another value (``None``). Three earlier fixes
refused them one entry point at a time (durable args, tool results, a session model's tool calls); these
tests prove the mechanism: canonical JSON itself refuses them, so every digest (plan digests, argument
digests, idempotency keys' bodies) and every entry point built on it names the value instead of
conflating it with ``None``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from effectlog.canonical import canonical_json, digest
from effectlog.errors import BadInput, PlanError
from effectlog.plan import AdapterDecl, Plan, RetryPolicy, StepDecl, check_plan

NON_FINITE = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("value", NON_FINITE)
def test_canonical_json_refuses_a_non_finite_float_and_names_where(value: float) -> None:
    """``{"a": [1, x]}`` with x non-finite: BadInput naming ``a[1]``, not the bytes of ``{"a": [1, null]}``."""
    with pytest.raises(BadInput, match=r"args\.a\[1\]: .* not a finite number"):
        canonical_json({"a": [1, value]}, "args")
    with pytest.raises(BadInput, match="not a finite number"):
        digest({"a": [1, value]})


def test_nulls_and_finite_floats_still_encode_as_before() -> None:
    """The refusal looks only at values whose encoding holds ``null``; real nulls and floats are unchanged."""
    encoded = (canonical_json({"b": [1.5, None], "a": None}), canonical_json(0.1))
    assert (b'{"a":null,"b":[1.5,null]}', b"0.1") == encoded


def plan(args: dict[str, object], retry: RetryPolicy | None = None) -> Plan:
    return Plan(
        run_id="r",
        adapters={"n": AdapterDecl(type="noop", idempotent=True)},
        steps=(StepDecl(id="s", adapter="n", args=args, retry=retry),),
    )


@pytest.mark.parametrize("value", NON_FINITE)
def test_a_plan_whose_args_hold_a_non_finite_float_is_refused_not_given_the_digest_of_none(value: float) -> None:
    """Before: ``plan({"x": nan}).digest == plan({"x": None}).digest``, so a run started with one resumed
    with the other as the same plan, under the same idempotency key bodies."""
    with pytest.raises(PlanError, match=r"steps\[0\]\.args\.x: .* not a finite number"):
        check_plan(plan({"x": value}))
    with pytest.raises(BadInput, match="not a finite number"):
        _ = plan({"x": value}).digest


@pytest.mark.parametrize("field", ["backoff_base_s", "backoff_cap_s"])
def test_a_retry_backoff_of_nan_is_refused(field: str) -> None:
    """``backoff_base_s=nan`` passed both range checks (every comparison with NaN is false)."""
    with pytest.raises(PlanError, match=rf"steps\[0\]\.retry: .*{field}"):
        check_plan(plan({}, RetryPolicy(**{field: math.nan})))


def test_a_runtime_run_of_a_plan_with_nan_args_writes_nothing(tmp_path: Path) -> None:
    """The library entry point: ``Runtime.run`` refuses the plan before the journal gets a byte."""
    from effectlog.runtime import Runtime

    with Runtime(tmp_path / "j.db") as rt, pytest.raises(BadInput, match="not a finite number"):
        rt.run(plan({"x": math.nan}))
    with Runtime(tmp_path / "j.db") as rt:
        assert 0 == rt.journal.head("r")[0]


def test_a_pydantic_ai_models_tool_call_with_nan_args_is_told_back_and_no_tool_runs(tmp_path: Path) -> None:
    """pydantic-ai parses a model's tool-call arguments allowing ``NaN``; the tool ran with it while the
    journal digested the args as ``null``. Proves: the model is told the value is not a finite number (a
    retry prompt), the tool never runs with it, the model's next call runs once, and a second pass over
    the finished run replays the same conversation without calling anything."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.integrations.pydantic_ai import DurableAgent

    paid: list[float | None] = []
    told: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < 2:
            args = '{"amount": NaN}' if turn == 0 else '{"amount": 5}'
            return ModelResponse(parts=[ToolCallPart("pay", args, tool_call_id=f"p{turn}")])
        told.extend(
            str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, RetryPromptPart | ToolReturnPart)
        )
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def pay(amount: float | None) -> str:
        paid.append(amount)
        return f"paid {amount}"

    durable = DurableAgent(agent, journal=tmp_path / "runs.db")
    outputs = [durable.run_sync("pay", run_id="r").output, durable.run_sync("pay", run_id="r").output]
    assert (["done", "done"], [5]) == (outputs, paid)
    assert [True, "paid 5.0"] == ["amount: nan is not a finite number" in told[0], told[1]], told


def test_the_msgpack_precheck_sends_every_non_finite_float_to_the_walk_and_lets_lookalikes_pass() -> None:
    """Values with a ``null`` are pre-checked in msgpack (a float with an all-ones exponent) before the
    walk: every NaN/inf, at any place, still reaches the walk and is refused; a look-alike (a str holding
    those bytes' characters, a huge int) is encoded as before."""
    for value in (math.nan, -math.inf, [None, {"k": (1, math.inf)}], {"deep": [[[[-math.nan]]]], "n": None}):
        with pytest.raises(BadInput, match="not a finite number"):
            canonical_json(value)
    lookalikes = {"s": "\u00cb\u007f\u00f0", "i": 2**64 - 1, "f": -1e308, "n": None}
    assert b'{"f":-1e308,"i":18446744073709551615,"n":null,"s":"\xc3\x8b\x7f\xc3\xb0"}' == canonical_json(lookalikes)


def test_a_durable_call_with_args_nested_past_what_json_can_encode_is_bad_input(tmp_path: Path) -> None:
    """Args nested 3,000 lists deep: the encoder gives up with RecursionError, which reached the caller of a
    durable tool as a bare RecursionError. Proves: BadInput naming the args, and nothing is recorded."""
    from effectlog import durable

    calls: list[object] = []

    @durable.tool(idempotent=True)
    def store(value: object, idempotency_key: str = "") -> str:
        calls.append(value)
        return "ok"

    deep: list[object] = []
    cur = deep
    for _ in range(3000):
        nxt: list[object] = []
        cur.append(nxt)
        cur = nxt
    with durable.run("deep", journal=str(tmp_path / "j.db")):
        with pytest.raises(BadInput, match="nested too deep"):
            store(deep)
        assert "ok" == store([1])
    assert [[1]] == calls


def test_digest_is_the_sha256_of_canonical_json_and_refuses_what_it_refuses() -> None:
    """``digest`` encodes inline and falls back to ``canonical_json`` when the encoding holds a ``null`` or
    fails: the same hex digest for plain values and nulls, the same ``BadInput`` for a lone surrogate."""
    import hashlib

    for value in ({"b": [1, "x"], "a": 2}, {"a": None, "b": [0.5, None]}, "null", [True, {"k": "v"}]):
        assert hashlib.sha256(canonical_json(value)).hexdigest() == digest(value)
    with pytest.raises(BadInput, match="surrogate"):
        canonical_json({"a": "\ud800"}, "args")
    with pytest.raises(BadInput, match="surrogate"):
        digest({"a": "\ud800"}, "args")
