"""A child process for the OpenAI Agents SDK crash tests: one pass of a DurableRunner run.

Usage: python tests/openai_agents_child.py JOURNAL RUN_ID CALLS_FILE PROVIDER_URL MODE [PROMPT]

The model is the SDK's ``OpenAIChatCompletionsModel`` talking HTTP to the OpenAI-compatible
stand-in at PROVIDER_URL (tests/provider_standin.py, run by the test). Tools: ``charge``
(declared not idempotent) and ``lookup`` (declared idempotent); which one is called is the
stand-in's script. MODE: ``live``; ``die-in-tool`` (SIGKILL inside the tool, right after its
effect); ``die-in-charge`` (the same, in ``charge`` only); ``approve`` (``charge`` needs
approval). The calls file gets one line per real tool effect (``effect KEY``). On success
the last line of stdout is JSON: ``{"output": ...}`` or, when held, ``{"held": [{"step_id",
"command"}], "interruptions": [call ids]}``; an effectlog error prints its message to stderr
and exits with its documented status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from effectlog.errors import EffectlogError
from effectlog.integrations.openai_agents import DurableRunner, idempotency_key
from session_kit import note

PROMPT = "charge bob 5"


def build(url: str, calls: Path, mode: str) -> Agent[None]:
    def effect(name: str, to: str, amount: int) -> str:
        note(calls, f"effect {idempotency_key()}")
        if mode == "die-in-tool" or (mode == "die-in-charge" and name == "charged"):
            os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its result was never recorded
        return f"{name} {amount} to {to}"

    @function_tool
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        return effect("charged", to, amount)

    @function_tool
    def lookup(to: str, amount: int) -> str:
        """Look a customer up (idempotent)."""
        return effect("looked up", to, amount)

    client = AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
    return Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge, lookup])


def main(argv: list[str]) -> int:
    journal, run_id, calls, url, mode = argv[:5]
    prompt = argv[5] if len(argv) > 5 else PROMPT
    set_tracing_disabled(True)
    agent = build(url, Path(calls), mode)
    runner = DurableRunner(
        journal=journal, idempotent={"lookup"}, needs_approval={"charge"} if mode == "approve" else ()
    )
    try:
        result = runner.run_sync(agent, prompt, run_id=run_id)
    except EffectlogError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    if result.interruptions:
        held = [{"step_id": h.step_id, "command": h.command} for h in runner.last_held]
        interrupted = [getattr(i.raw_item, "call_id", None) for i in result.interruptions]
        print(json.dumps({"held": held, "interruptions": interrupted}))
    else:
        print(json.dumps({"output": result.final_output}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
