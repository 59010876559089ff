"""Tools a session may call, each declaring whether repeating it is harmless.

``idempotent`` is required, never defaulted: whether a call may be repeated after a
crash is the one fact effectlog cannot guess, and guessing wrong repeats a payment.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import msgspec

from effectlog.errors import AdapterNotFound, BadInput

F = TypeVar("F", bound=Callable[..., Any])

KEY_PARAMETER = "idempotency_key"
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
}


class ToolInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a model is told about a tool, and what recovery needs to know about it."""

    name: str
    idempotent: bool
    description: str = ""
    parameters: dict[str, Any] = {}
    secret: tuple[str, ...] = ()  # arg names recorded only as digests (journal, status, timeline)

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function declaration offered to a model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class _Entry(msgspec.Struct, frozen=True):
    info: ToolInfo
    fn: Callable[..., Any]
    wants_key: bool


def _parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON Schema for ``fn``'s keyword arguments, from its signature (types where they are simple)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == KEY_PARAMETER or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        json_type = _JSON_TYPES.get(p.annotation)
        props[p.name] = {"type": json_type} if json_type else {}
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required}


class Toolbox:
    """A registry of tools: ``@toolbox.tool(idempotent=...)`` on a sync or async function.

    The function receives the call's arguments as keywords, plus ``idempotency_key`` if
    it has a parameter of that name (stable for the step's attempt, across crashes).
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @overload
    def tool(self, fn: F, /, *, idempotent: bool, name: str | None = None, secret: Sequence[str] = ()) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        idempotent: bool,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        secret: Sequence[str] = (),
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        idempotent: bool,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        secret: Sequence[str] = (),
    ) -> F | Callable[[F], F]:
        def register(f: F) -> F:
            self.register(
                f, idempotent=idempotent, name=name, description=description, parameters=parameters, secret=secret
            )
            return f

        return register(fn) if fn is not None else register

    def register(
        self,
        fn: Callable[..., Any],
        *,
        idempotent: bool,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        secret: Sequence[str] = (),
    ) -> None:
        """Register ``fn``; args named in ``secret`` are recorded only as digests."""
        if not isinstance(idempotent, bool):
            raise BadInput("a tool must declare idempotent=True or idempotent=False")
        if isinstance(secret, str) or not all(isinstance(s, str) for s in secret):
            raise BadInput("a tool's secret= is a list of argument names")
        tool_name = name or getattr(fn, "__name__", "")
        if not tool_name:
            raise BadInput("a tool needs a name")
        if tool_name in self._entries:
            raise BadInput(f"tool {tool_name!r} is registered twice")
        info = ToolInfo(
            name=tool_name,
            idempotent=idempotent,
            description=description if description is not None else inspect.getdoc(fn) or "",
            parameters=dict(parameters) if parameters is not None else _parameters(fn),
            secret=tuple(secret),
        )
        wants_key = KEY_PARAMETER in inspect.signature(fn).parameters
        self._entries[tool_name] = _Entry(info, fn, wants_key)

    def info(self, name: str) -> ToolInfo:
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise AdapterNotFound(f"no tool {name!r} is registered (known: {known})")
        return entry.info

    def infos(self) -> Sequence[ToolInfo]:
        return [e.info for e in self._entries.values()]

    async def call(self, name: str, args: Mapping[str, Any], *, idempotency_key: str) -> Any:
        """Run the tool. A sync function runs in a worker thread so it cannot stall the loop."""
        self.info(name)
        entry = self._entries[name]
        kwargs = dict(args)
        if entry.wants_key:
            kwargs[KEY_PARAMETER] = idempotency_key
        if inspect.iscoroutinefunction(entry.fn):
            return await entry.fn(**kwargs)
        result = await asyncio.to_thread(entry.fn, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result
