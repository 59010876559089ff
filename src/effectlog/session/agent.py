"""A minimal agent loop over a ``Session``: model, tools, repeat, until a final answer.

The conversation is never stored: each pass rebuilds it from the task and from the
recorded step results, in the same order, so a resumed run asks the model exactly
what the first pass asked (and a changed prompt is caught as ``IdempotencyConflict``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from effectlog.canonical import canonical_json
from effectlog.errors import BadInput, RunFailed
from effectlog.session.durable import Session
from effectlog.session.steps import AgentStep, FinalStep, Reconciled, ToolStep


def _tool_message(step: ToolStep) -> str:
    """What the model is told about a tool step; a function of the recorded outcome only."""
    if step.status == "ok":
        return step.result if isinstance(step.result, str) else canonical_json(step.result).decode()
    if step.status == "reconciled" and isinstance(step.result, Reconciled):
        return f"applied (reconciled by {step.result.operator}: {step.result.evidence})"
    if step.status == "denied":
        return f"denied: {step.reason}"
    return f"failed, not applied: {step.reason}"


def _arguments(raw: Any) -> dict[str, Any] | str:
    """A tool call's arguments, or what is wrong with them, to tell the model (never an error out of the
    loop: the model's answer is recorded, so every later pass would replay it and fail again)."""
    if isinstance(raw, Mapping):
        value: Any = dict(raw)
    else:
        try:
            value = json.loads(raw, parse_constant=_no_json) if isinstance(raw, str) and raw.strip() else {}
        except (ValueError, RecursionError):
            return "arguments are not a JSON object"
    if not isinstance(value, dict):
        return "arguments are not a JSON object"
    try:  # a "\ud800" escape gives a lone surrogate, which the journal cannot hold
        canonical_json(value, "arguments")
    except BadInput as exc:
        return exc.message
    return value


def _no_json(constant: str) -> Any:
    """``json.loads`` takes NaN and the infinities, which no JSON has: arguments holding them are the
    model's mistake to be told about, not a BadInput out of the loop on every pass of the run."""
    raise ValueError(f"{constant} is not JSON")


class Agent:
    """``async for step in Agent(...).run(task, session=Session(...))``.

    Yields ``ModelStep``, ``ToolStep``, ``ApprovalStep`` (then stops: the run is
    suspended on disk) and ``FinalStep``. A completed run yields its recorded
    ``FinalStep`` alone, without walking the history or calling anything, once its first
    model request (task, instructions, tools) is the one this agent would send.
    """

    def __init__(
        self,
        *,
        instructions: str = "",
        model: str | None = None,
        max_turns: int = 32,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.instructions = instructions
        self.model = model
        self.max_turns = max_turns
        self.params = dict(params or {})

    def _opening(self, task: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages.append({"role": "user", "content": task})
        return messages

    def _params(self, session: Session) -> dict[str, Any]:
        offered = [info.schema() for info in session.gateway.tools()]
        return {**self.params, **({"tools": offered} if offered else {})}

    async def run(self, task: str, *, session: Session) -> AsyncIterator[AgentStep]:
        if session.completed:
            # Same task, instructions and tools: the recorded answer. Others: IdempotencyConflict.
            session.check_first_request(self._opening(task), model=self.model, **self._params(session))
            yield FinalStep(run_id=session.run_id, result=session.result, replayed=True)
            return
        if session.closed:
            state = session.state
            raise RunFailed(
                f"the run is {state.state}: {state.reason}", run_id=session.run_id, step_id=state.blocked_step
            )
        messages = self._opening(task)
        params = self._params(session)
        for _ in range(self.max_turns):
            model_step = await session.model_step(messages, model=self.model, **params)
            yield model_step
            message = model_step.message
            calls = message.get("tool_calls") or []
            if not calls:
                result = session.finish(message.get("content"))
                yield FinalStep(run_id=session.run_id, result=result)
                return
            messages.append(message)
            for call in calls:
                function = call.get("function") or {}
                name, args = function.get("name"), _arguments(function.get("arguments"))
                known = {info.name for info in session.gateway.tools()}
                if name not in known or isinstance(args, str):
                    problem = f"unknown tool {name!r}" if name not in known else str(args)
                    messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": f"error: {problem}"})
                    continue
                tool_step = await session.tool_step(str(name), args)
                yield tool_step
                if tool_step.decision == "require_approval":
                    yield session.approval_for(tool_step)
                    return
                messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": _tool_message(tool_step)})
        reason = f"no final answer after {self.max_turns} model turns"
        session.fail(reason)
        raise RunFailed(reason, run_id=session.run_id)
