"""Shared pieces for the session tests and their child processes: tools that count, a scripted
model that counts, a crash hook that SIGKILLs its own process, and a driver for the agent loop."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from effectlog.session import Agent, AgentStep, ScriptedModel, Session, Toolbox, call, say
from effectlog.session.scripted import Reply

TASK = "send 5 to bob"
SCRIPT: list[Reply] = [call("transfer", to="bob", amount=5), say("sent 5 to bob")]
ROOT = Path(__file__).resolve().parent.parent


def note(path: Path, line: str) -> None:
    """Append one line and make it durable: the counts must survive a SIGKILL right after."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def count(path: Path, what: str) -> int:
    return sum(1 for line in lines(path) if line.split(" ", 1)[0] == what)


def keys(path: Path, what: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in lines(path) if line.split(" ", 1)[0] == what]


def toolbox(calls: Path, *, idempotent: bool) -> Toolbox:
    tools = Toolbox()

    @tools.tool(idempotent=idempotent)
    def transfer(to: str, amount: int, idempotency_key: str) -> dict[str, Any]:
        """Send money (counted in the calls file, with the key it received)."""
        note(calls, f"transfer {idempotency_key}")
        return {"sent": amount, "to": to}

    @tools.tool(idempotent=True)
    def lookup(name: str) -> str:
        """Read-only lookup."""
        note(calls, f"lookup {name}")
        return f"{name} is known"

    return tools


def scripted(calls: Path, *, idempotent: bool = False, script: Sequence[Reply] = SCRIPT) -> ScriptedModel:
    def on_call(body: Mapping[str, Any], key: str) -> None:
        note(calls, f"model {key}")

    return ScriptedModel(script, tools=toolbox(calls, idempotent=idempotent), on_call=on_call)


def kill_at(point: str, step_id: str) -> Callable[[str, str], None]:
    """A crash hook that SIGKILLs this process at (point, step_id): a real crash, nothing cleans up."""

    def hook(at: str, sid: str) -> None:
        if (at, sid) == (point, step_id):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def drive(session: Session, *, task: str = TASK, agent: Agent | None = None) -> list[AgentStep]:
    """Every step one pass of the agent yields."""
    return [step async for step in (agent or Agent()).run(task, session=session)]
