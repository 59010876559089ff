"""The gateway: what decides (model calls) and what executes (tool calls), behind one Protocol.

A session never talks to a provider or a tool except through its gateway, and only
after the step's intent is where recovery needs it. ``ToolboxGateway`` gives any
model client the tool half from a ``Toolbox``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from effectlog.session.tools import Toolbox, ToolInfo


@runtime_checkable
class Gateway(Protocol):
    """Model calls and tool calls. Both receive the step's idempotency key."""

    model: str  # the model name used when a call does not name one

    def tool(self, name: str) -> ToolInfo:
        """The tool's declaration; raises ``AdapterNotFound`` for an unknown tool."""
        ...

    def tools(self) -> Sequence[ToolInfo]:
        """Every tool a model may be offered."""
        ...

    async def complete(self, body: Mapping[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        """One chat completion for ``body`` (OpenAI shape); send the key to providers that take one."""
        ...

    async def call_tool(self, name: str, args: Mapping[str, Any], *, idempotency_key: str) -> Any:
        """Run one tool call. Raise ``effectlog.errors.NotApplied`` for "definitely not applied"."""
        ...


class ToolboxGateway:
    """The tool half of a gateway, from a ``Toolbox``; subclasses supply ``complete``."""

    model: str

    def __init__(self, *, model: str, tools: Toolbox | None = None) -> None:
        self.model = model
        self.toolbox = tools if tools is not None else Toolbox()

    def tool(self, name: str) -> ToolInfo:
        return self.toolbox.info(name)

    def tools(self) -> Sequence[ToolInfo]:
        return self.toolbox.infos()

    async def call_tool(self, name: str, args: Mapping[str, Any], *, idempotency_key: str) -> Any:
        return await self.toolbox.call(name, args, idempotency_key=idempotency_key)
