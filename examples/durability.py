"""Durability: when a run resumes, an inference already paid for is not paid again.

Three passes over one run, each in its own process, with its own gateway and its own
connection to the journal. Pass one is killed with SIGKILL right after the tool call.
Each pass counts the model and tool calls it really made. Runs offline (a scripted
model), in a temporary directory:

    python examples/durability.py

    pass 1: model ×1 · tool ×1   <- killed by SIGKILL right after the tool call
    pass 2: model ×1 · tool ×0   <- only what had not happened yet
    pass 3: model ×0 · tool ×0   <- a closed run is not reopened
"""  # noqa: RUF002 -- the multiplication sign is what the example prints

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from effectlog.session import Agent, ScriptedModel, Session, SqliteCheckpointer, Toolbox, ToolStep, call, say

RUN_ID = "run-1"
TIMES = "\u00d7"  # the multiplication sign, spelled so no reader mistakes it for an x
TASK = "read /x"


def tally(calls: Path, what: str) -> None:
    """One line per real call, made durable at once: the process may be killed right after."""
    with open(calls, "a", encoding="utf-8") as fh:
        fh.write(what + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def gateway(calls: Path) -> ScriptedModel:
    tools = Toolbox()

    @tools.tool(idempotent=True)
    def read_file(path: str) -> str:
        """Read a file."""
        tally(calls, "tool")
        return f"{path}: hello"

    script = [call("read_file", path="/x"), say("/x says hello")]
    return ScriptedModel(script, tools=tools, on_call=lambda body, key: tally(calls, "model"))


async def one_pass(journal: Path, calls: Path, *, die_after_tool: bool) -> None:
    store = SqliteCheckpointer(journal)
    session = Session(RUN_ID, gateway(calls), store)
    async for step in Agent().run(TASK, session=session):
        if die_after_tool and isinstance(step, ToolStep):
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: nothing is flushed or closed
    store.close()


def count(calls: Path, what: str) -> int:
    return calls.read_text(encoding="utf-8").splitlines().count(what) if calls.exists() else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pass"]:  # a child: one pass
        journal, calls, die = Path(argv[1]), Path(argv[2]), argv[3] == "die"
        asyncio.run(one_pass(journal, calls, die_after_tool=die))
        return 0
    notes = {
        1: "<- killed by SIGKILL right after the tool call",
        2: "<- only what had not happened yet",
        3: "<- a closed run is not reopened",
    }
    with tempfile.TemporaryDirectory(prefix="effectlog-durability-") as tmp:
        journal = Path(tmp) / "runs.db"
        for n in (1, 2, 3):
            calls = Path(tmp) / f"calls-{n}.log"
            child = subprocess.run(
                [sys.executable, __file__, "--pass", str(journal), str(calls), "die" if n == 1 else "live"],
                check=False,
            )
            expected = -signal.SIGKILL if n == 1 else 0
            if child.returncode != expected:
                print(f"pass {n} ended with status {child.returncode}, expected {expected}", file=sys.stderr)
                return 1
            print(f"pass {n}: model {TIMES}{count(calls, 'model')} · tool {TIMES}{count(calls, 'tool')}   {notes[n]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
