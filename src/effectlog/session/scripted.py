"""An offline model that follows a script: for examples, tests and the README.

The reply is chosen by how many assistant turns the request already holds, never by
a counter in this process, so a resumed run in a new process gets the reply its
position calls for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from effectlog.errors import BadInput
from effectlog.session.gateway import ToolboxGateway
from effectlog.session.tools import Toolbox


class ToolCallReply(msgspec.Struct, frozen=True):
    name: str
    args: dict[str, Any]


Reply = str | ToolCallReply | Sequence[ToolCallReply]


def say(text: str) -> str:
    """A final answer."""
    return text


def call(name: str, args: Mapping[str, Any] | None = None, /, **kwargs: Any) -> ToolCallReply:
    """A request for one tool call (pass a list of them for parallel calls)."""
    return ToolCallReply(name, {**(args or {}), **kwargs})


def _message(reply: Reply, turn: int) -> dict[str, Any]:
    if isinstance(reply, str):
        return {"role": "assistant", "content": reply}
    calls = [reply] if isinstance(reply, ToolCallReply) else list(reply)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.args, sort_keys=True)},
            }
            for i, c in enumerate(calls)
        ],
    }


class ScriptedModel(ToolboxGateway):
    """A gateway whose model answers from ``script``; ``calls`` counts the completions it served.

    ``on_call(body, idempotency_key)`` sees each completion before it is answered.
    """

    def __init__(
        self,
        script: Sequence[Reply],
        *,
        tools: Toolbox | None = None,
        model: str = "scripted",
        on_call: Callable[[Mapping[str, Any], str], None] | None = None,
    ) -> None:
        super().__init__(model=model, tools=tools)
        self.script = list(script)
        self.calls = 0
        self.keys: list[str] = []
        self.on_call = on_call

    async def complete(self, body: Mapping[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        turn = sum(1 for m in body.get("messages", []) if isinstance(m, Mapping) and m.get("role") == "assistant")
        if turn >= len(self.script):
            raise BadInput(f"the script has {len(self.script)} replies; turn {turn} asked for another")
        self.calls += 1
        self.keys.append(idempotency_key)
        if self.on_call is not None:
            self.on_call(body, idempotency_key)
        message = _message(self.script[turn], turn)
        finish = "tool_calls" if "tool_calls" in message else "stop"
        return {
            "id": f"scripted-{turn}",
            "object": "chat.completion",
            "model": str(body.get("model", self.model)),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
