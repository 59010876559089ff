"""Tool registration: idempotency is declared, never assumed; the step's key reaches the tool."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effectlog.errors import AdapterNotFound, BadInput
from effectlog.session import Toolbox


def test_idempotency_must_be_declared_as_a_bool() -> None:
    """Registering a tool without a clear True/False for idempotent is refused."""
    tools = Toolbox()
    with pytest.raises(BadInput):
        tools.register(lambda: None, idempotent="yes", name="x")  # type: ignore[arg-type]


def test_the_declaration_and_parameters_come_from_the_function() -> None:
    """Name, docstring and a JSON Schema of the keyword arguments are taken from the signature."""
    tools = Toolbox()

    @tools.tool(idempotent=False)
    def transfer(to: str, amount: int, memo: str = "", idempotency_key: str = "") -> None:
        """Send money."""

    info = tools.info("transfer")
    assert (False, "Send money.") == (info.idempotent, info.description)
    expected = {
        "type": "object",
        "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}, "memo": {"type": "string"}},
        "required": ["to", "amount"],
    }
    assert expected == info.parameters
    assert "transfer" == info.schema()["function"]["name"]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_tool_that_asks_for_the_key_receives_it(asynchronous: bool) -> None:
    """A parameter named idempotency_key gets the step's key; sync and async tools alike."""
    tools = Toolbox()
    seen: list[Any] = []

    def sync_tool(x: int, idempotency_key: str) -> int:
        seen.append(idempotency_key)
        return x + 1

    async def async_tool(x: int, idempotency_key: str) -> int:
        seen.append(idempotency_key)
        return x + 1

    tools.register(async_tool if asynchronous else sync_tool, idempotent=True, name="inc")
    assert 2 == asyncio.run(tools.call("inc", {"x": 1}, idempotency_key="k-1"))
    assert ["k-1"] == seen


def test_an_unknown_tool_is_named() -> None:
    """Asking for a tool nobody registered says which tools exist."""
    tools = Toolbox()
    tools.register(lambda: None, idempotent=True, name="known")
    with pytest.raises(AdapterNotFound, match="known"):
        tools.info("missing")


def test_a_tool_name_cannot_be_registered_twice() -> None:
    """Two tools with one name would make the journal ambiguous."""
    tools = Toolbox()
    tools.register(lambda: None, idempotent=True, name="t")
    with pytest.raises(BadInput):
        tools.register(lambda: None, idempotent=False, name="t")
