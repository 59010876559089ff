"""Session tool steps (and so durable tools) whose result cannot be recorded (issue 13.2): the effect
may have happened and its answer is lost, so a non-idempotent step is uncertain (never a traceback from
the encoder with the step left requested), and an idempotent one keeps its intent for a re-send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from effectlog import durable
from effectlog.errors import UncertainEffect, UnusableResult
from effectlog.session import SqliteCheckpointer


class Node:
    pass


def cyclic() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


UNUSABLE = {
    "object": lambda: Node(),
    "set": lambda: {1, "a"},
    "tuple-keys": lambda: {(1, 2): "x"},
    "self-reference": cyclic,
    "lone-surrogate": lambda: "\ud800",
    "generator": lambda: (i for i in range(2)),
}


@pytest.mark.parametrize("kind", sorted(UNUSABLE))
def test_an_unrecordable_result_of_a_non_idempotent_tool_leaves_its_step_uncertain(tmp_path: Path, kind: str) -> None:
    """The call happened, its result cannot be kept: UncertainEffect naming the tool, the step recorded uncertain."""
    journal = tmp_path / "runs.db"

    @durable.tool(idempotent=False, name="send")
    def send() -> Any:
        return UNUSABLE[kind]()

    with pytest.raises(UncertainEffect) as info, durable.run("r1", journal=str(journal)):
        send()
    assert "send" in str(info.value)
    with SqliteCheckpointer(journal) as store:
        state = store.state("r1")
    step = state.ordered_steps()[0]
    assert ("stopped", "uncertain") == (state.state, step.state)
    assert "cannot be recorded" in step.reason


def test_an_unrecordable_result_of_an_idempotent_tool_keeps_the_intent_for_a_resend(tmp_path: Path) -> None:
    """Idempotent: the error names the type, the step stays requested, and the next pass re-sends the same key."""
    journal = tmp_path / "runs.db"
    keys: list[str] = []

    @durable.tool(idempotent=True, name="reserve")
    def reserve(idempotency_key: str) -> Any:
        keys.append(idempotency_key)
        return {"seats": {1, "a"}} if len(keys) == 1 else {"seats": [1]}

    with pytest.raises(UnusableResult) as info, durable.run("r2", journal=str(journal)):
        reserve()
    assert "set" in str(info.value)
    with durable.run("r2", journal=str(journal)):
        assert {"seats": [1]} == reserve()
    assert 2 == len(keys)
    assert keys[0] == keys[1]
