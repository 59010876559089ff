"""A child process for the durable-tool crash tests: one pass of a plain-Python durable run.

Usage: python tests/durable_child.py JOURNAL RUN_ID CALLS_FILE MODE [AMOUNT]

MODE: ``live`` runs the block; ``die-in-reserve`` / ``die-in-charge`` SIGKILL this process
inside that tool, right after its effect; ``reordered`` calls the tools in another order.
The calls file gets one durable line per effect, with the key the tool received. The
last stdout line is JSON: the run's result, or the error (code, command); the exit
status is the error's, as a CLI would give it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from effectlog import durable
from effectlog.errors import EffectlogError
from session_kit import lines, note


def main(argv: list[str]) -> int:
    journal, run_id, calls_file, mode = argv[:4]
    amount = int(argv[4]) if len(argv) > 4 else 5
    calls = Path(calls_file)

    @durable.tool(idempotent=True)
    def reserve(item: str, idempotency_key: str = "") -> dict[str, Any]:
        """An inventory API that honours idempotency keys: a key it has seen changes nothing."""
        applied = f"reserve {idempotency_key}" not in lines(calls)
        note(calls, f"reserve {idempotency_key}")
        if mode == "die-in-reserve":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"item": item, "reserved": applied}

    @durable.tool(idempotent=False, approval=lambda call: call.args["amount"] > 100)
    def charge(order: str, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        """A payment API without idempotency keys; charges over 100 wait for a person."""
        note(calls, f"charge {idempotency_key}")
        if mode == "die-in-charge":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"order": order, "charged": amount}

    try:
        with durable.run(run_id, journal=journal) as run:
            if mode == "reordered":
                charged = charge("order-1", amount)
                reserved = reserve("sku-1")
            else:
                reserved = reserve("sku-1")
                charged = charge("order-1", amount)
            run.finish({"reserve": reserved, "charge": charged})
    except EffectlogError as exc:
        print(json.dumps({"error": exc.code, "step": exc.step_id, "command": exc.fields.get("command")}))
        return int(exc.exit_status)
    print(json.dumps({"result": run.result, "tool_calls": run.tool_calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
