"""Step identity on resume: deterministic ids, and ReplayDivergence instead of silently running another step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import BadInput, IdempotencyConflict, ReplayDivergence
from effectlog.session import ScriptedModel, Session, SqliteCheckpointer, say
from session_kit import count, scripted

RUN = "run-1"
ASK = [{"role": "user", "content": "pay bob"}]

Pass = Callable[[Session], Awaitable[Any]]


def run_pass(tmp_path: Path, body: Pass, *, script: list[Any] | None = None) -> Any:
    """One pass in this process, with a fresh gateway and store, as a new process would have."""
    gateway = scripted(tmp_path / "calls.log", script=script or [say("ok")] * 8)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        return asyncio.run(body(Session(RUN, gateway, store)))


def seq(tmp_path: Path) -> int:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        return store.state(RUN).seq


async def model_then_transfer(s: Session) -> None:
    await s.model(ASK)
    await s.tool("transfer", {"to": "bob", "amount": 5})


async def model_then_lookup(s: Session) -> None:
    await s.model(ASK)
    await s.tool("lookup", {"name": "bob"})


async def model_then_model(s: Session) -> None:
    await s.model(ASK)
    await s.model(ASK)


async def model_then_transfer_6(s: Session) -> None:
    await s.model(ASK)
    await s.tool("transfer", {"to": "bob", "amount": 6})


def test_positional_ids_count_model_and_tool_steps_together(tmp_path: Path) -> None:
    """Unkeyed steps are step-0, step-1, ... in call order, whatever their kind."""

    async def body(s: Session) -> list[str]:
        await s.model(ASK)
        await s.tool("lookup", {"name": "bob"})
        await s.model([*ASK, {"role": "assistant", "content": "x"}])
        return [st.step_id for st in s.state.ordered_steps()]

    assert ["step-0", "step-1", "step-2"] == run_pass(tmp_path, body)


@pytest.mark.parametrize(
    ("second", "asked"),
    [
        (model_then_lookup, "tool 'lookup'"),
        (model_then_model, "model 'scripted'"),
        (model_then_transfer_6, "tool 'transfer'"),
    ],
    ids=["other-tool", "other-kind", "other-args"],
)
def test_a_different_step_at_a_recorded_position_is_a_divergence(tmp_path: Path, second: Pass, asked: str) -> None:
    """A newer loop that puts another step where the journal has the payment gets ReplayDivergence naming both."""
    run_pass(tmp_path, model_then_transfer)
    before = seq(tmp_path)
    with pytest.raises(ReplayDivergence) as raised:
        run_pass(tmp_path, second)
    assert "step-1" == raised.value.step_id
    assert raised.value.fields["recorded"].startswith("tool 'transfer'")
    assert raised.value.fields["requested"].startswith(asked)
    assert 1 == count(tmp_path / "calls.log", "transfer")
    assert 0 == count(tmp_path / "calls.log", "lookup")
    assert before == seq(tmp_path)  # nothing was written


def test_a_changed_model_request_at_a_recorded_step_is_an_idempotency_conflict(tmp_path: Path) -> None:
    """Same run id, changed instructions: the recorded answer belongs to another request, so it is refused."""
    run_pass(tmp_path, model_then_transfer)

    async def changed(s: Session) -> None:
        await s.model([{"role": "system", "content": "be brief"}, *ASK])

    with pytest.raises(IdempotencyConflict) as raised:
        run_pass(tmp_path, changed)
    assert "step-0" == raised.value.step_id
    assert 1 == count(tmp_path / "calls.log", "model")


def test_a_keyed_step_does_not_depend_on_position(tmp_path: Path) -> None:
    """A step with an explicit key is found by its key even when a newer loop inserts steps before it."""

    async def first(s: Session) -> Any:
        return await s.tool("transfer", {"to": "bob", "amount": 5}, key="pay-42")

    async def newer(s: Session) -> Any:
        await s.tool("lookup", {"name": "bob"})
        return await s.tool("transfer", {"to": "bob", "amount": 5}, key="pay-42")

    recorded = run_pass(tmp_path, first)
    assert recorded == run_pass(tmp_path, newer)
    assert 1 == count(tmp_path / "calls.log", "transfer")
    assert 1 == count(tmp_path / "calls.log", "lookup")


def test_finishing_before_reaching_recorded_steps_is_a_divergence(tmp_path: Path) -> None:
    """A pass that would complete the run without visiting a recorded step (an effect that happened) is refused."""
    run_pass(tmp_path, model_then_transfer)

    async def shorter(s: Session) -> None:
        await s.model(ASK)
        s.finish("done")

    with pytest.raises(ReplayDivergence) as raised:
        run_pass(tmp_path, shorter)
    assert "step-1" == raised.value.step_id


def test_a_step_key_used_twice_in_one_pass_is_refused(tmp_path: Path) -> None:
    """Two steps cannot share an id: the second is refused before anything runs."""

    async def twice(s: Session) -> None:
        await s.tool("lookup", {"name": "a"}, key="k")
        await s.tool("lookup", {"name": "b"}, key="k")

    with pytest.raises(BadInput):
        run_pass(tmp_path, twice)
    assert 1 == count(tmp_path / "calls.log", "lookup")


def test_a_key_that_looks_positional_is_refused(tmp_path: Path) -> None:
    """An explicit key may not take the form of a positional id, or the two could collide."""

    async def body(s: Session) -> None:
        await s.tool("lookup", {"name": "a"}, key="step-3")

    with pytest.raises(BadInput):
        run_pass(tmp_path, body)


def test_scripted_model_answers_by_position_not_by_process(tmp_path: Path) -> None:
    """The offline model picks its reply from the request's assistant turns, so a resumed pass gets the right one."""
    model = ScriptedModel([say("first"), say("second")])
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "first"}]}
    answer = asyncio.run(model.complete(body, idempotency_key="k"))
    assert "second" == answer["choices"][0]["message"]["content"]


def test_a_held_step_names_what_was_recorded_when_a_pass_diverges(tmp_path: Path) -> None:
    """A step held for approval records its tool and fingerprint too, so a divergence there names both sides."""

    async def held(s: Session) -> None:
        s.policy = lambda c: "require_approval"
        await s.tool_step("transfer", {"to": "bob", "amount": 5})

    async def other(s: Session) -> None:
        await s.tool("lookup", {"name": "bob"})

    run_pass(tmp_path, held)
    with pytest.raises(ReplayDivergence) as raised:
        run_pass(tmp_path, other)
    assert raised.value.fields["recorded"].startswith("tool 'transfer'")
    assert 0 == count(tmp_path / "calls.log", "lookup")
