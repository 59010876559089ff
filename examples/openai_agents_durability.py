"""Durability of an OpenAI Agents SDK run: a resumed run pays no model request twice and repeats no effect.

Three passes over one run, each in its own process, each running the same SDK ``Agent``
through effectlog's ``DurableRunner`` (a drop-in for ``Runner.run``) with its own
connection to the journal. Pass one is killed with SIGKILL inside the tool, right after
its effect. The tool is idempotent (declared so), so pass two re-sends it with the same
idempotency key, which the (simulated) service uses to apply it once. Each pass tallies
the model requests it really made (with the ``Idempotency-Key`` header the model was
given) and the effects the service really applied. Runs offline (a scripted SDK
``Model``), in a temporary directory:

    python examples/openai_agents_durability.py

    pass 1: model ×1 · tool effects ×1   <- killed by SIGKILL right after the tool's effect
    pass 2: model ×1 · tool effects ×0   <- the tool re-sent under its key: the service had applied it
    pass 3: model ×0 · tool effects ×0   <- a completed run replays from the journal
    {"framework": "openai-agents", "passes": [...], "ok": true}

Needs the extra: ``pip install 'effectlog[openai-agents]'``.
"""  # noqa: RUF002 -- the multiplication sign is what the example prints

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, ModelSettings, Usage, function_tool, set_tracing_disabled
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from effectlog.integrations.openai_agents import IDEMPOTENCY_HEADER, DurableRunner, idempotency_key

RUN_ID = "welcome-42"
TIMES = "\u00d7"  # the multiplication sign, spelled so no reader mistakes it for an x


def tally(calls: Path, line: str) -> None:
    """One line per real call, made durable at once: the process may be killed right after."""
    with open(calls, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


class ScriptedModel(Model):
    """A stand-in for a provider: first a call of ``send_welcome``, then the final answer."""

    def __init__(self, calls: Path) -> None:
        self.calls = calls

    async def get_response(  # noqa: PLR0917 -- the SDK's Model signature
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        tally(self.calls, f"model {(model_settings.extra_headers or {}).get(IDEMPOTENCY_HEADER, '')}")
        answered = any(isinstance(item, dict) and item.get("type") == "function_call_output" for item in input)
        if not answered:
            call = ResponseFunctionToolCall(
                type="function_call", call_id="c1", name="send_welcome", arguments='{"to": "ann@example.com"}'
            )
            return ModelResponse(output=[call], usage=Usage(requests=1), response_id=None)
        text = ResponseOutputText(type="output_text", text="welcome mail sent to ann@example.com", annotations=[])
        message = ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the example does not stream")


def build(calls: Path, applied: Path, *, die_after_effect: bool) -> Agent[None]:
    @function_tool
    def send_welcome(to: str) -> str:
        """Send the welcome mail (the mail service deduplicates by idempotency key)."""
        key = idempotency_key()
        if key not in lines(applied):  # what a service honouring idempotency keys does
            tally(applied, key)
            tally(calls, f"tool {key}")
        if die_after_effect:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: the result is never recorded
        return f"sent to {to}"

    return Agent(
        name="onboarding", instructions="Onboard the new user.", model=ScriptedModel(calls), tools=[send_welcome]
    )


def one_pass(journal: Path, calls: Path, applied: Path, *, die: bool) -> None:
    set_tracing_disabled(True)
    runner = DurableRunner(journal=journal, idempotent={"send_welcome"})
    result = runner.run_sync(build(calls, applied, die_after_effect=die), "onboard ann", run_id=RUN_ID)
    print(result.final_output)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pass"]:  # a child: one pass
        journal, calls, applied, die = Path(argv[1]), Path(argv[2]), Path(argv[3]), argv[4] == "die"
        one_pass(journal, calls, applied, die=die)
        return 0
    notes = {
        1: "<- killed by SIGKILL right after the tool's effect",
        2: "<- the tool re-sent under its key: the service had applied it",
        3: "<- a completed run replays from the journal",
    }
    passes: list[dict[str, int]] = []
    model_keys: list[str] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="effectlog-openai-agents-") as tmp:
        journal, applied = Path(tmp) / "runs.db", Path(tmp) / "applied.log"
        for n in (1, 2, 3):
            calls = Path(tmp) / f"calls-{n}.log"
            mode = "die" if n == 1 else "live"
            child = subprocess.run(
                [sys.executable, __file__, "--pass", str(journal), str(calls), str(applied), mode],
                check=False,
                capture_output=True,
                text=True,
            )
            expected = -signal.SIGKILL if n == 1 else 0
            if child.returncode != expected:
                print(f"pass {n} ended with status {child.returncode}, expected {expected}", file=sys.stderr)
                print(child.stderr, file=sys.stderr)
                ok = False
            made = [line.split(" ", 1) for line in lines(calls)]
            model_keys += [key for what, key in made if what == "model"]
            counts = {
                "model_calls": sum(1 for what, _ in made if what == "model"),
                "tool_effects": sum(1 for what, _ in made if what == "tool"),
            }
            passes.append(counts)
            model, tool = counts["model_calls"], counts["tool_effects"]
            print(f"pass {n}: model {TIMES}{model} · tool effects {TIMES}{tool}   {notes[n]}")
        effects = len(lines(applied))
    # Every tool effect exactly once; no model step billed twice (one request per key, one key per step).
    ok = ok and effects == 1 and sum(p["tool_effects"] for p in passes) == 1
    ok = ok and len(model_keys) == len(set(model_keys)) == 2 and all(model_keys)
    print(json.dumps({"framework": "openai-agents", "passes": passes, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
