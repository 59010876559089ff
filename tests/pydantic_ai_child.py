"""A child process for the pydantic-ai crash tests: one pass of a DurableAgent run.

Usage: python tests/pydantic_ai_child.py JOURNAL RUN_ID CALLS_FILE TOOL MODE [PROMPT]

TOOL is ``charge`` (declared not idempotent) or ``lookup`` (declared idempotent). MODE:
``live``; ``die-in-tool`` (SIGKILL inside the tool, right after its effect);
``die-in-model`` (SIGKILL inside the first model request, before it answers);
``approve`` (the tool needs approval); ``hold`` (the tool waits, after its effect, until
the file CALLS_FILE.go exists); ``die-after-model-call`` (SIGKILL once the provider answered
model-0, before the answer is recorded). With PROVIDER_URL in the environment, the model
is pydantic-ai's ``OpenAIChatModel`` talking HTTP to that OpenAI-compatible endpoint.
The calls file gets one line per real model request (``model KEY``, FunctionModel only)
and per real tool effect (``effect KEY``). On success the last line of stdout is the
output as JSON; an effectlog error prints its message to stderr and exits with its
documented status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from effectlog.errors import EffectlogError
from effectlog.integrations.pydantic_ai import DurableAgent, idempotency_key
from session_kit import kill_at, note

PROMPT = "charge bob 5"


def build(journal: str, calls: Path, tool: str, mode: str) -> DurableAgent[None, str | DeferredToolRequests]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        key = (info.model_settings or {}).get("extra_headers", {}).get("Idempotency-Key", "")
        note(calls, f"model {key}")
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if mode == "die-in-model" and turn == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # the request is in flight: no answer recorded
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart(tool, {"to": "bob", "amount": 5}, tool_call_id="call-1")])
        returned = [p.content for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(f"done: {json.dumps(returned, sort_keys=True)}")])

    url = os.environ.get("PROVIDER_URL")
    chosen: Model = FunctionModel(model)
    if url:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        chosen = OpenAIChatModel("stand-in", provider=OpenAIProvider(base_url=url, api_key="test"))
    agent: Agent[None, str | DeferredToolRequests] = Agent(chosen, output_type=[str, DeferredToolRequests])

    def effect(name: str, to: str, amount: int) -> str:
        note(calls, f"effect {idempotency_key()}")
        if mode == "die-in-tool":
            os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its result was never recorded
        go = calls.with_suffix(".go")
        deadline = time.monotonic() + 300  # the test's second pass (a pydantic_ai import) runs meanwhile
        while mode == "hold" and not go.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"{name} {amount} to {to}"

    @agent.tool_plain
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        return effect("charged", to, amount)

    @agent.tool_plain
    def lookup(to: str, amount: int) -> str:
        """Look a customer up (idempotent)."""
        return effect("looked up", to, amount)

    return DurableAgent(
        agent,
        journal=journal,
        idempotent={"lookup"},
        needs_approval={"charge"} if mode == "approve" else (),
        crash_hook=kill_at("after_call", "model-0") if mode == "die-after-model-call" else None,
    )


def main(argv: list[str]) -> int:
    journal, run_id, calls, tool, mode = argv[:5]
    prompt = argv[5] if len(argv) > 5 else PROMPT
    durable = build(journal, Path(calls), tool, mode)
    try:
        result = durable.run_sync(prompt, run_id=run_id)
    except EffectlogError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    output = result.output
    if isinstance(output, DeferredToolRequests):
        print(json.dumps({"deferred": output.metadata}))
    else:
        print(json.dumps({"output": output}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
