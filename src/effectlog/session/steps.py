"""What a session step turned out to be: the records an agent loop yields, and the policy's input.

Each step record says whether it was ``replayed`` (read back from the journal, no call
made) or happened in this pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

Decision = Literal["allow", "deny", "require_approval"]
ToolStatus = Literal["ok", "denied", "failed", "reconciled"]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy decides on: one tool call of one run, before it runs."""

    run_id: str
    step_id: str
    tool: str
    args: dict[str, Any]
    idempotent: bool


Policy = Callable[[ToolCall], Decision]


def allow_all(call: ToolCall) -> Decision:
    """The default policy."""
    return "allow"


class Reconciled(msgspec.Struct, frozen=True, kw_only=True):
    """The result of a tool step whose uncertain effect an operator reconciled as applied.

    Its real answer was never recorded; this is the claim and its evidence instead.
    """

    outcome: str
    evidence: str
    operator: str
    automated: bool = False


class ModelStep(msgspec.Struct, frozen=True, kw_only=True, tag="model"):
    step_id: str
    model: str
    response: dict[str, Any]  # the provider's whole answer, as recorded
    replayed: bool = False

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message of the first choice."""
        choices = self.response.get("choices") or [{}]
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        return message if isinstance(message, dict) else {"role": "assistant", "content": None}


class ToolStep(msgspec.Struct, frozen=True, kw_only=True, tag="tool"):
    step_id: str
    tool: str
    args: dict[str, Any]
    status: ToolStatus
    result: Any = None
    decision: Decision | None = None  # set when a policy or a person held or denied the call
    reason: str = ""
    tool_call_hash: str = ""
    replayed: bool = False


class ApprovalStep(msgspec.Struct, frozen=True, kw_only=True, tag="approval"):
    """The run is suspended on disk until a person approves or denies this exact call."""

    run_id: str
    step_id: str
    tool: str
    args: dict[str, Any]
    tool_call_hash: str
    reason: str
    command: str  # the CLI line that approves it


class FinalStep(msgspec.Struct, frozen=True, kw_only=True, tag="final"):
    """The run is completed with ``result``. ``replayed``: it was already closed, nothing ran."""

    run_id: str
    result: Any = None
    replayed: bool = False


AgentStep = ModelStep | ToolStep | ApprovalStep | FinalStep
