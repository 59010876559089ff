"""Durability of a pydantic-ai agent: a resumed run pays no model request twice and repeats no effect.

Three passes over one run, each in its own process, each wrapping the same pydantic-ai
``Agent`` in effectlog's ``DurableAgent`` with its own connection to the journal. Pass
one is killed with SIGKILL inside the tool, right after its effect. The tool is
idempotent (declared so), so pass two re-sends it with the same idempotency key, which
the (simulated) service uses to apply it once. Each pass tallies the model requests it
really made and the effects the service really applied. Runs offline (pydantic-ai's
``FunctionModel``), in a temporary directory:

    python examples/pydantic_ai_durability.py

    pass 1: model ×1 · tool effects ×1   <- killed by SIGKILL right after the tool's effect
    pass 2: model ×1 · tool effects ×0   <- the tool re-sent under its key: the service had applied it
    pass 3: model ×0 · tool effects ×0   <- a completed run replays from the journal
    {"framework": "pydantic-ai", "passes": [...], "ok": true}

Needs the extra: ``pip install 'effectlog[pydantic-ai]'``.
"""  # noqa: RUF002 -- the multiplication sign is what the example prints

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from effectlog.integrations.pydantic_ai import IDEMPOTENCY_HEADER, DurableAgent, idempotency_key

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


def build(journal: Path, calls: Path, applied: Path, *, die_after_effect: bool) -> DurableAgent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        headers = (info.model_settings or {}).get("extra_headers", {})
        tally(calls, f"model {headers.get(IDEMPOTENCY_HEADER, '')}")
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("send_welcome", {"to": "ann@example.com"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("welcome mail sent to ann@example.com")])

    agent: Agent[None, str] = Agent(FunctionModel(model), instructions="Onboard the new user.")

    @agent.tool_plain
    def send_welcome(to: str) -> str:
        """Send the welcome mail (the mail service deduplicates by idempotency key)."""
        key = idempotency_key()
        if key not in lines(applied):  # what a service honouring idempotency keys does
            tally(applied, key)
            tally(calls, f"tool {key}")
        if die_after_effect:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: the result is never recorded
        return f"sent to {to}"

    return DurableAgent(agent, journal=journal, idempotent={"send_welcome"})


def one_pass(journal: Path, calls: Path, applied: Path, *, die: bool) -> None:
    result = build(journal, calls, applied, die_after_effect=die).run_sync("onboard ann", run_id=RUN_ID)
    print(result.output)


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
    with tempfile.TemporaryDirectory(prefix="effectlog-pydantic-ai-") as tmp:
        journal, applied = Path(tmp) / "runs.db", Path(tmp) / "applied.log"
        for n in (1, 2, 3):
            calls = Path(tmp) / f"calls-{n}.log"
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--pass",
                    str(journal),
                    str(calls),
                    str(applied),
                    "die" if n == 1 else "live",
                ],
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
    ok = ok and len(model_keys) == len(set(model_keys)) == 2
    print(json.dumps({"framework": "pydantic-ai", "passes": passes, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
